"""What a mid-epoch checkpoint costs: one ``state_dict()`` of a running loader against the 100
loader steps it is taken after, so the "overhead" share the summary prints is the throughput a
checkpoint every 100 steps costs (goal: under 1%).

The loaders are the cheapest torchfeed makes (small batches of precomputed samples, 2 workers),
so the share is a worst case: a real pipeline's steps take longer and the checkpoint does not.
The datasets are large (a million indices, 100,000 shards) because a checkpoint must not grow
with the dataset: it holds one position per rank x worker, never the epoch's order.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import Dataset

import torchfeed
from torchfeed.data import DistributedSampler, ShardedIterableDataset

STEPS = 100
MAP_SIZE = 1_000_000
SHARDS = 100_000


class Indices(Dataset):
    def __len__(self) -> int:
        return MAP_SIZE

    def __getitem__(self, i: int):
        return {"index": i, "x": torch.full((8,), float(i))}


def open_shard(k: int):
    for j in range(4):
        yield {"index": k * 4 + j, "x": torch.full((8,), float(k))}


def map_loader() -> torchfeed.ResumableLoader:
    sampler = DistributedSampler(Indices(), num_replicas=4, rank=1, seed=3)
    return torchfeed.loader(
        Indices(),
        sampler=sampler,
        batch_size=16,
        num_workers=2,
        persistent_workers=True,
        collate_fn=torchfeed.PadCollate(),
    )


def iterable_loader(monkeypatch) -> torchfeed.ResumableLoader:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ds = ShardedIterableDataset(
        list(range(SHARDS)), open_shard, mode="shard", seed=3, item_lengths=[4] * SHARDS
    )
    return torchfeed.loader(
        ds, batch_size=16, num_workers=2, persistent_workers=True, collate_fn=torchfeed.PadCollate()
    )


def steps(it):
    def run():
        return sum(1 for _ in itertools.islice(it, STEPS))

    return run


def checkpoint(dl):
    def run():
        state = dl.state_dict()
        assert state["batches"] > 0
        return state

    return run


GROUPS = {
    "map": "checkpoint every 100 steps, map-style 1M samples, 4 ranks, 2 workers",
    "iterable": "checkpoint every 100 steps, 100k shards, 4 ranks, 2 workers",
}


@pytest.fixture(params=sorted(GROUPS))
def running(request, monkeypatch):
    """(kind, a loader, its iterator after one batch)"""
    dl = map_loader() if request.param == "map" else iterable_loader(monkeypatch)
    it = iter(dl)
    next(it)
    yield request.param, dl, it
    del it


def test_100_steps(benchmark, role, running):
    kind, _, it = running
    benchmark.group = GROUPS[kind]
    role("work")
    assert benchmark.pedantic(steps(it), rounds=10) == STEPS


def test_state_dict(benchmark, role, running):
    kind, dl, _ = running
    benchmark.group = GROUPS[kind]
    role("overhead")
    state = benchmark.pedantic(checkpoint(dl), rounds=50)
    # one position per consumer (rank, or rank x worker), never the epoch's order
    assert len(state["source"]["consumed"]) == (4 if kind == "map" else 8)
