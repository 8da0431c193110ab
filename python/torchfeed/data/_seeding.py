"""Rank- and worker-aware seeding: every (rank, worker) draws its own augmentations."""

from __future__ import annotations

import random
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import get_worker_info

from torchfeed.data._distributed import rank_and_world_size

__all__ = ["WorkerSeeder", "derive_seed", "seed_worker"]


def derive_seed(*parts: int) -> int:
    """A 64-bit seed mixing the parts (numpy's SeedSequence): nearby inputs give unrelated
    streams, unlike ``base + worker_id``."""
    state = np.random.SeedSequence([int(p) % (1 << 63) for p in parts]).generate_state(2)
    return int(state.view(np.uint64)[0])


class WorkerSeeder:
    """A DataLoader ``worker_init_fn`` that seeds ``torch``, ``numpy`` and ``random`` in each
    worker from the loader's per-epoch base seed, the worker id AND the distributed rank.

    PyTorch gives each worker ``base_seed + worker_id`` for torch (and numpy since 1.9), but not
    per rank: with the same ``torch.manual_seed`` on every rank (the usual DDP setup), worker k of
    every rank draws the same augmentations. The rank is read when the seeder is made (in the
    main process, where torch.distributed is initialized), so it works with fork and spawn.
    ``then`` runs after seeding (your own worker_init_fn).
    """

    def __init__(self, rank: int | None = None, then: Callable[[int], None] | None = None) -> None:
        self.rank = rank_and_world_size()[0] if rank is None else int(rank)
        self.then = then

    def state_dict(self) -> dict[str, int]:
        """The seeder's own state: its rank (the streams follow from the loader's seed, which
        torchfeed.loader saves, the rank and the worker)."""
        return {"rank": self.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.rank = int(state["rank"])

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        base = info.seed if info is not None else torch.initial_seed()
        seed = derive_seed(base, self.rank, worker_id)
        torch.manual_seed(seed)
        np.random.seed(seed % (1 << 32))
        random.seed(seed)
        if self.then is not None:
            self.then(worker_id)


def seed_worker(worker_id: int) -> None:
    """:class:`WorkerSeeder` as a plain function, taking the rank from torch.distributed or
    the RANK environment variable (set by torchrun) inside the worker."""
    WorkerSeeder()(worker_id)
