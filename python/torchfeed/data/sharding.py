"""Rank x worker sharding of iterable datasets, with the same number of samples on every rank."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset

from torchfeed.data._distributed import rank_and_world_size, worker_and_count
from torchfeed.data.seeding import derive_seed

__all__ = ["ShardedIterableDataset", "split_for_consumer"]


def split_for_consumer(
    items: Sequence[Any],
    consumer: int,
    consumers: int,
    uneven: Literal["drop", "pad"] = "drop",
) -> list[Any]:
    """Consumer ``consumer`` of ``consumers``: every ``consumers``-th item, all consumers getting
    the same count: ``"drop"`` leaves out the last ``len % consumers`` items, ``"pad"`` repeats
    items from the start so that nothing is left out."""
    if uneven not in ("drop", "pad"):
        raise ValueError(f"uneven must be 'drop' or 'pad', got {uneven!r}")
    n = len(items)
    per = n // consumers if uneven == "drop" else -(-n // consumers)
    if uneven == "pad" and n == 0:
        per = 0
    return [items[(consumer + k * consumers) % n] for k in range(per)]


class ShardedIterableDataset(IterableDataset):
    """An iterable dataset split over rank x worker, so that every (rank, worker) pair reads
    different data, every rank yields the same number of samples (no DDP hang), and the order
    changes with :meth:`set_epoch`, deterministically.

    - ``mode="shard"``: ``items`` are shards (files, URLs); each consumer opens whole shards
      with ``open_item(shard)`` (an iterable of samples). There must be at least as many shards
      as consumers (``world_size * num_workers``).
    - ``mode="sample"``: ``items`` are samples (or references that ``open_item`` turns into one
      sample each), dealt out one by one.

    ``uneven`` equalizes the item count per consumer ("drop" or "pad"). With shards of unequal
    length, set ``samples_per_epoch`` (per consumer): each consumer then yields exactly that many
    samples, cycling through its items if needed, which also bounds an epoch of an infinite or
    very long stream; every epoch restarts from its own shuffled order.

    ``set_epoch`` reaches persistent workers too: the epoch lives in shared memory.
    """

    def __init__(
        self,
        items: Sequence[Any],
        open_item: Callable[[Any], Any] | None = None,
        *,
        mode: Literal["shard", "sample"] = "shard",
        uneven: Literal["drop", "pad"] = "drop",
        shuffle: bool = True,
        seed: int = 0,
        samples_per_epoch: int | None = None,
    ) -> None:
        if mode not in ("shard", "sample"):
            raise ValueError(f"mode must be 'shard' or 'sample', got {mode!r}")
        if uneven not in ("drop", "pad"):
            raise ValueError(f"uneven must be 'drop' or 'pad', got {uneven!r}")
        if samples_per_epoch is not None and samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be >= 1, got {samples_per_epoch}")
        if len(items) == 0:
            raise ValueError("items must not be empty")
        self.items = list(items)
        self.open_item = open_item
        self.mode = mode
        self.uneven = uneven
        self.shuffle = shuffle
        self.seed = int(seed)
        self.samples_per_epoch = samples_per_epoch
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def consumer_items(self) -> list[Any]:
        """The items this (rank, worker) reads this epoch."""
        rank, world = rank_and_world_size()
        worker, workers = worker_and_count()
        consumers = world * workers
        if self.mode == "shard" and len(self.items) < consumers:
            raise ValueError(
                f"ShardedIterableDataset: {len(self.items)} shards for {consumers} consumers "
                f"({world} rank(s) x {workers} worker(s)): some would read nothing; use fewer "
                "workers, more shards, or mode='sample'"
            )
        if self.uneven == "drop" and len(self.items) < consumers:
            raise ValueError(
                f"ShardedIterableDataset: {len(self.items)} samples for {consumers} consumers "
                f"({world} rank(s) x {workers} worker(s)) with uneven='drop': every consumer "
                "would read nothing; use uneven='pad', fewer workers, or more samples"
            )
        order = list(range(len(self.items)))
        if self.shuffle:
            random.Random(derive_seed(self.seed, self.epoch)).shuffle(order)
        mine = split_for_consumer(order, rank * workers + worker, consumers, self.uneven)
        return [self.items[i] for i in mine]

    def _samples(self, items: list[Any]) -> Iterator[Any]:
        for item in items:
            if self.mode == "shard":
                yield from (self.open_item(item) if self.open_item else item)
            else:
                yield self.open_item(item) if self.open_item else item

    def __iter__(self) -> Iterator[Any]:
        items = self.consumer_items()
        if self.samples_per_epoch is None:
            yield from self._samples(items)
            return
        produced = 0
        while produced < self.samples_per_epoch:
            empty = True
            for sample in self._samples(items):
                empty = False
                yield sample
                produced += 1
                if produced == self.samples_per_epoch:
                    return
            if empty:
                raise RuntimeError(
                    "ShardedIterableDataset: this consumer's items yield no samples, so "
                    "samples_per_epoch cannot be met"
                )
