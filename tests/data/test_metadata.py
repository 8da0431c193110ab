"""torchfeed.data with real DataLoaders and workers: seeding, sharding, corrupt samples, CoW-safe
metadata, and a torchrun run over two ranks."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader, Dataset

from torchfeed.data import (
    SerializedList,
)


def test_serialized_list_round_trip():
    items = [{"path": f"img_{i}.jpg", "label": i % 7, "box": [i, i + 1.5]} for i in range(100)]
    s = SerializedList(items)
    assert len(s) == 100 and s[42] == items[42] and s[-1] == items[-1] and s[1:3] == items[1:3]
    with pytest.raises(IndexError):
        s[100]


def _uss_kib() -> int:
    total = 0
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total


class Metadata(Dataset):
    """Item k reads ALL the metadata (as a sampler over a big index would, over an epoch) and
    reports how much the worker's private memory grew."""

    def __init__(self, meta):
        self.meta = meta

    def __len__(self):
        return 2

    def __getitem__(self, k):
        before = _uss_kib()
        total = 0
        for i in range(len(self.meta)):
            total += self.meta[i]["label"]
        return _uss_kib() - before


@pytest.mark.slow
def test_serialized_list_keeps_forked_workers_small():
    items = [
        {"path": f"/data/train/class_{i % 1000}/img_{i:08d}.jpg", "label": i % 1000}
        for i in range(300_000)
    ]
    plain = Metadata(items)
    packed = Metadata(SerializedList(items))

    def growth(ds):
        loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
        return max(int(x) for x in loader)

    plain_kib, packed_kib = growth(plain), growth(packed)
    # a list of dicts is copied into the worker as its refcounts are touched; the packed
    # buffers are only read
    assert plain_kib > 20_000, plain_kib
    assert packed_kib < plain_kib / 5, (packed_kib, plain_kib)
