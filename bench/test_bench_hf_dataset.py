"""A Hugging Face ``datasets.Dataset`` of tokenized rows through ``torchfeed.loader`` against a
plain DataLoader, both with ``PadCollate`` and 2 workers: the loader's per-sample seeding keeps
the dataset's own batched read (``__getitems__``, one slice of its Arrow table) when that read
draws nothing. The third row is what it did before, reading row by row so as to seed each
sample. Goal: torchfeed.loader no slower than the DataLoader the user had.

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
    """The dataset without its batched read, as every read went through per-sample seeding."""

    def __init__(self, data):
        self.data = data

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


def collate():
    return torchfeed.PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"})


KW = dict(batch_size=64, num_workers=2, persistent_workers=True)


def epoch(dl):
    def run():
        return sum(int(b["label"].shape[0]) for b in dl)

    run()  # start-up: the workers
    return run


def test_torchfeed_loader(benchmark, role, table):
    benchmark.group = GROUP
    role("torchfeed")
    dl = torchfeed.loader(table, collate_fn=collate(), **KW)
    assert benchmark.pedantic(epoch(dl), rounds=3) == ROWS


def test_dataloader(benchmark, role, table):
    benchmark.group = GROUP
    role("baseline")
    dl = DataLoader(table, collate_fn=collate(), **KW)
    assert benchmark.pedantic(epoch(dl), rounds=3) == ROWS


def test_torchfeed_loader_row_by_row(benchmark, role, table):
    benchmark.group = GROUP
    role("baseline")
    dl = torchfeed.loader(RowByRow(table), collate_fn=collate(), **KW)
    assert benchmark.pedantic(epoch(dl), rounds=3) == ROWS


def test_the_batched_read_gives_the_row_by_row_batches(table):
    ours = next(iter(torchfeed.loader(table, collate_fn=collate(), batch_size=64)))
    rows = next(iter(torchfeed.loader(RowByRow(table), collate_fn=collate(), batch_size=64)))
    assert ours.keys() == rows.keys()
    assert all(torch.equal(ours[k], rows[k]) for k in ours)
