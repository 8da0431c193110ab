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
