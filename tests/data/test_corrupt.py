"""torchfeed.data with real DataLoaders and workers: seeding, sharding, corrupt samples, CoW-safe
metadata, and a torchrun run over two ranks."""

from __future__ import annotations

import logging

import pytest
from torch.utils.data import DataLoader, Dataset

from torchfeed.data import (
    SkipCorrupt,
)


class Flaky(Dataset):
    def __init__(self, bad):
        self.bad = set(bad)

    def __len__(self):
        return 20

    def __getitem__(self, i):
        if i in self.bad:
            raise OSError(f"cannot decode {i}")
        return i


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_corrupt_substitutes_and_reports(workers, caplog):
    ds = SkipCorrupt(Flaky({3, 4, 11}), max_retries=5)
    with caplog.at_level(logging.WARNING, logger="torchfeed.data"):
        got = [int(x) for x in DataLoader(ds, batch_size=None, num_workers=workers)]
    assert got[3] == 5 and got[4] == 5 and got[11] == 12  # the next good sample, always
    assert len(got) == 20
    assert ds.skipped_indices == [3, 4, 11]  # gathered from every worker
    if workers == 0:
        assert sum("sample 3 failed" in r.message for r in caplog.records) == 1  # once


def test_skip_corrupt_bounded():
    ds = SkipCorrupt(Flaky(range(20)), max_retries=3)
    with pytest.raises(
        RuntimeError, match=r"sample 7 and the 3 after it all failed \(indices \[7, 8, 9, 10\]\)"
    ):
        ds[7]
    with pytest.raises(ValueError, match="max_retries must be >= 0"):
        SkipCorrupt(Flaky([]), max_retries=-1)


def test_skip_corrupt_on_error_callback_and_error_types():
    seen = []
    ds = SkipCorrupt(Flaky({0}), on_error=lambda i, e: seen.append((i, type(e).__name__)))
    assert ds[0] == 1 and seen == [(0, "OSError")]
    strict = SkipCorrupt(Flaky({0}), errors=KeyError)
    with pytest.raises(OSError):
        strict[0]


class FlakyBatched(Flaky):
    """A batched read of its own (as a Hugging Face dataset has), failing as a whole when any
    of its samples does."""

    def __init__(self, bad):
        super().__init__(bad)
        self.batched_reads = []

    def __getitems__(self, indices):
        self.batched_reads.append(list(indices))
        if self.bad & set(indices):
            raise OSError(f"cannot decode {sorted(self.bad & set(indices))}")
        return [("batched", i) for i in indices]


def test_skip_corrupt_keeps_a_batched_read():
    ds = SkipCorrupt(FlakyBatched({3, 11}))
    assert ds.__getitems__([0, 1, 2]) == [("batched", 0), ("batched", 1), ("batched", 2)]
    # a batch whose read fails is read sample by sample, the failing one replaced
    assert ds.__getitems__([2, 3, 4]) == [2, 4, 4] and ds.skipped_indices == [3]
    assert ds.dataset.batched_reads == [[0, 1, 2], [2, 3, 4]]
    # without a batched read of its own, none: the DataLoader reads by index
    assert not SkipCorrupt(Flaky({3})).__getitems__
    assert next(iter(DataLoader(SkipCorrupt(Flaky({3})), batch_size=4))).tolist() == [0, 1, 2, 4]


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_corrupt_keeps_a_batched_read_through_the_loader(workers):
    import torchfeed

    loader = torchfeed.loader(SkipCorrupt(FlakyBatched({3, 11})), batch_size=4,
                              num_workers=workers, collate_fn=list)  # fmt: skip
    batched = [("batched", i) for i in range(20)]
    # the first batch's first sample is read alone (SeedPerSample's check); a batch holding a
    # failing sample is read by index, that sample replaced
    assert [s for b in loader for s in b] == (
        [*batched[:1], 1, 2, 4, *batched[4:8], 8, 9, 10, 12, *batched[12:]]
    )
