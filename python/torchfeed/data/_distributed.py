"""Who this process is: its torch.distributed rank and world size, and its DataLoader worker."""

from __future__ import annotations

import os

import torch
from torch.utils.data import get_worker_info

__all__ = ["distributed_initialized", "rank_and_world_size", "worker_and_count"]


def distributed_initialized() -> bool:
    """Whether this process is a rank of an initialized torch.distributed process group."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def rank_and_world_size() -> tuple[int, int]:
    """The torch.distributed rank and world size when it is initialized; else the RANK and
    WORLD_SIZE that torchrun sets (a spawned DataLoader worker has no process group); else 0, 1."""
    if distributed_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    values = {}
    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1")):
        text = os.environ.get(name, default)
        try:
            values[name] = int(text)
        except ValueError:
            raise ValueError(
                f"the environment variable {name} must be an integer, got {text!r}"
            ) from None
    rank, world = values["RANK"], values["WORLD_SIZE"]
    if world < 1 or not 0 <= rank < world:
        raise ValueError(
            f"RANK={rank} and WORLD_SIZE={world} (environment) must satisfy 0 <= RANK < "
            "WORLD_SIZE: a rank outside the world would read another rank's data"
        )
    return rank, world


def worker_and_count() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)
