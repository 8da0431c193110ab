"""Production data practices: rank- and worker-aware seeding, rank x worker sharding with equal
batch counts per rank, skipping corrupt samples, and copy-on-write-safe sample metadata."""

from __future__ import annotations

import logging
import os
import pickle
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

log = logging.getLogger("torchfeed.data")


# --- who am I ------------------------------------------------------------------------------------


def rank_and_world_size() -> tuple[int, int]:
    """The torch.distributed rank and world size when it is initialized; else the RANK and
    WORLD_SIZE that torchrun sets (a spawned DataLoader worker has no process group); else 0, 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def worker_and_count() -> tuple[int, int]:
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


# --- seeding -------------------------------------------------------------------------------------


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


# --- sharding ------------------------------------------------------------------------------------


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


# --- corrupt samples -----------------------------------------------------------------------------


class SkipCorrupt(Dataset):
    """Wraps a map-style dataset: when reading sample i raises, logs the index and the error
    once, and returns another sample instead, chosen deterministically (i + 1, i + 2, ... modulo
    the length), trying at most ``max_retries`` others; if they all fail, raises a RuntimeError
    naming them. ``skipped_indices`` lists the samples that failed, gathered from every worker
    (it lives in shared memory). ``on_error(index, error)`` is called for each failure."""

    def __init__(
        self,
        dataset: Dataset,
        max_retries: int = 10,
        on_error: Callable[[int, BaseException], None] | None = None,
        errors: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.dataset = dataset
        self.max_retries = int(max_retries)
        self.on_error = on_error
        self.errors = errors
        n = len(dataset)  # type: ignore[arg-type]
        self._failed = torch.zeros((n + 7) // 8, dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def _mark(self, i: int, error: BaseException) -> None:
        byte, bit = divmod(i, 8)
        if not int(self._failed[byte]) >> bit & 1:
            self._failed[byte] |= 1 << bit
            log.warning(
                "SkipCorrupt: sample %d failed (%s: %s); using another",
                i,
                type(error).__name__,
                error,
            )
        if self.on_error is not None:
            self.on_error(i, error)

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        tried = []
        for k in range(self.max_retries + 1):
            j = (i + k) % n
            try:
                return self.dataset[j]
            except self.errors as e:
                self._mark(j, e)
                tried.append(j)
                last = e
        raise RuntimeError(
            f"SkipCorrupt: sample {i} and the {self.max_retries} after it all failed "
            f"(indices {tried}); last error: {type(last).__name__}: {last}"
        ) from last

    @property
    def skipped_indices(self) -> list[int]:
        bits = np.unpackbits(self._failed.numpy(), bitorder="little")[: len(self)]
        return np.flatnonzero(bits).tolist()


# --- copy-on-write-safe metadata -----------------------------------------------------------------


class SerializedList(Sequence):
    """A list of Python objects stored as ONE numpy byte buffer plus offsets.

    A plain list of dicts in a Dataset is copied page by page into every forked DataLoader
    worker, because reading an object writes its reference count (PyTorch issue #13246): the
    workers' memory grows to a full copy each. Here the objects are pickled into two numpy
    arrays, which reads never write to; ``__getitem__`` unpickles one item."""

    def __init__(self, items: Iterable[Any]) -> None:
        blobs = [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL) for x in items]
        self._offsets = np.cumsum([0] + [len(b) for b in blobs], dtype=np.int64)
        self._data = np.frombuffer(b"".join(blobs), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"SerializedList index {i} out of range for length {n}")
        i %= n
        return pickle.loads(self._data[self._offsets[i] : self._offsets[i + 1]].tobytes())

    @property
    def nbytes(self) -> int:
        return self._data.nbytes + self._offsets.nbytes
