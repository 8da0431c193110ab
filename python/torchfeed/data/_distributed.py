"""Who this process is: its torch.distributed rank and world size, and its DataLoader worker."""

from __future__ import annotations

import os

import torch
from torch.utils.data import get_worker_info

__all__ = ["rank_and_world_size", "worker_and_count"]


def rank_and_world_size() -> tuple[int, int]:
    """The torch.distributed rank and world size when it is initialized; else the RANK and
    WORLD_SIZE that torchrun sets (a spawned DataLoader worker has no process group); else 0, 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def worker_and_count() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)
