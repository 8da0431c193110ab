"""A Hugging Face ``datasets.Dataset`` of tokenized rows through ``torchfeed.loader`` against a
plain DataLoader, both with ``PadCollate`` and 2 workers: the loader's per-sample seeding keeps
the dataset's own batched read (``__getitems__``, one slice of its Arrow table) when that read
draws nothing. The third loader reads the same rows one at a time (the batched read hidden), as
it read every dataset until 2026-12-06; its seeding has been cheaper since (torch's generator per
sample, numpy's and random's once a batch), so it no longer times the old loader's full cost.
Their epochs are timed in the same rounds. Goal: torchfeed.loader no slower than the
DataLoader the user had.

Needs ``datasets`` (an optional benchmark baseline: ``pip install datasets``); skipped without.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfeed

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")

ROWS = 16_384
GROUP = f"{ROWS:,} tokenized rows of a Hugging Face dataset, PadCollate, batches of 64 (2 workers)"


@pytest.fixture(scope="module")
def table():
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 513, ROWS)
    rows = {
        "input_ids": [rng.integers(0, 32_000, n).tolist() for n in lengths],
        "label": rng.integers(0, 2, ROWS).tolist(),
    }
    # made from an Arrow table with a fingerprint of its own: from_dict hashes its input with
    # dill, which some datasets / pyarrow pairs cannot pickle
    return datasets.Dataset(pa.table(rows), fingerprint="torchfeed-bench")


class RowByRow(Dataset):
    """The dataset without its batched read: ``torchfeed.loader`` reads it row by row."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def collate():
    return torchfeed.PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"})


KW = dict(batch_size=64, num_workers=2, persistent_workers=True)
ROUNDS = 5


def test_hf_dataset_paired(benchmark, paired_epochs, table):
    """The three loaders' epochs timed in the same rounds; bench/conftest.py reports the median
    of each and of the per-round ratios."""
    benchmark.group = GROUP
    loaders = {
        "baseline": DataLoader(table, collate_fn=collate(), **KW),
        "torchfeed": torchfeed.loader(table, collate_fn=collate(), **KW),
        "row by row": torchfeed.loader(RowByRow(table), collate_fn=collate(), **KW),
    }
    paired_epochs(loaders, lambda b: int(b["label"].shape[0]), ROWS, ROUNDS)


def test_the_batched_read_gives_the_row_by_row_batches(table):
    ours = next(iter(torchfeed.loader(table, collate_fn=collate(), batch_size=64)))
    rows = next(iter(torchfeed.loader(RowByRow(table), collate_fn=collate(), batch_size=64)))
    assert ours.keys() == rows.keys()
    assert all(torch.equal(ours[k], rows[k]) for k in ours)
