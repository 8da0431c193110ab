"""Per-sample seeding of a sharded stream: a ``ShardedIterableDataset`` of pre-tokenized shards
(16 shards of 1,024 samples, 16-255 tokens) through ``PadCollate`` in batches of 64.

- baseline: a plain DataLoader over the dataset, whose workers seed torch's, numpy's and
  ``random``'s generators before every sample (as ``torchfeed.loader`` did until 2026-12-06: it
  is what a loader that does not say its batch size gets); in the main process
  (``num_workers=0``) the dataset reads in groups as for ``torchfeed.loader`` and sets the
  generators back after each group's read, for the training loop;
- torchfeed: ``torchfeed.loader`` over the same dataset: torch's generator seeded before every
  sample, numpy's and ``random``'s once per 64 samples of a shard, all three set before each
  batch's last sample as seeding every sample leaves them (the same samples and batches); in
  the main process, set back after each batch;
- unseeded: ``torchfeed.loader`` over the dataset made with ``seed_samples=False``, what the
  seeding costs against nothing.

Their epochs are timed in the same rounds, each round in another order (``paired_epochs``).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import torchfeed
from torchfeed.data import ShardedIterableDataset

SHARDS, PER_SHARD = 16, 1024
ROUNDS = 7


@pytest.fixture(scope="module")
def shards():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(16, 256, (SHARDS, PER_SHARD), generator=g)
    return [[torch.randint(0, 32_000, (int(n),), generator=g) for n in row] for row in lengths]


def dataset(shards, seeded: bool = True, crop: bool = False) -> ShardedIterableDataset:
    """``crop``: each sample a random crop of its tokens (drawn from torch's generator)."""

    def open_shard(i: int):
        for t in shards[i]:
            if crop:
                t = t[int(torch.randint(len(t) // 2, (), dtype=torch.int64)) :]
            yield {"input_ids": t}

    return ShardedIterableDataset(list(range(SHARDS)), open_shard, seed=1, seed_samples=seeded)


def collate():
    return torchfeed.PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"})


@pytest.mark.parametrize("workers", [0, 2])
def test_seeding_a_sharded_stream_paired(benchmark, paired_epochs, shards, workers):
    benchmark.group = (
        f"seeding {SHARDS * PER_SHARD:,} samples of a sharded stream, PadCollate, batches of 64 "
        f"({workers} workers)"
    )
    kw = dict(batch_size=64, num_workers=workers, persistent_workers=workers > 0)
    loaders = {
        "baseline": DataLoader(dataset(shards), collate_fn=collate(), **kw),
        "torchfeed": torchfeed.loader(dataset(shards), collate_fn=collate(), **kw),
        "unseeded": torchfeed.loader(dataset(shards, seeded=False), collate_fn=collate(), **kw),
    }
    paired_epochs(loaders, lambda b: int(b["input_ids"].shape[0]), SHARDS * PER_SHARD, ROUNDS)


def test_both_loaders_give_the_same_batches(shards):
    """The same augmentation per sample (a random crop), so the same batches."""
    ours = list(torchfeed.loader(dataset(shards, crop=True), collate_fn=collate(), batch_size=64))
    theirs = list(DataLoader(dataset(shards, crop=True), collate_fn=collate(), batch_size=64))
    assert len(ours) == len(theirs) == SHARDS * PER_SHARD // 64
    assert all(torch.equal(a[k], b[k]) for a, b in zip(ours, theirs, strict=True) for k in a)
