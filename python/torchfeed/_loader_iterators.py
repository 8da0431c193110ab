"""The iterators a ResumableLoader's epoch goes through: its sampler without the batches a
resumed epoch consumed (``_Skipping``), its stream without them (``_Dropping``), and the count of
the batches it yields, with what a checkpoint needs of them (``_Counting``); and which worker
made which of them (``worker_batches``)."""

from __future__ import annotations

import itertools
import operator
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import (
    BatchSampler,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

from torchfeed.data._distributed import rank_and_world_size
from torchfeed.data._seeding import Occurrence, SeedPerSample, kept_generators

__all__ = ["worker_batches"]

_END = object()


class _Skipping:
    """An index sampler without the batches a resumed epoch consumed (a resumed generic
    sampler): as many as the loader says at each ``iter()``. Persistent workers keep the
    DataLoader's iterator, and with it this sampler, for every later epoch, which the loader
    then says are whole. (A weak reference: the loader holds that iterator, and a cycle
    collected in a forked worker would shut down its parent's workers there.)"""

    def __init__(self, base: Any, loader: Any) -> None:
        self.base, self._loader = base, weakref.ref(loader)
        self.last: _SkippingIterator | None = None

    @property
    def skip(self) -> int:
        loader = self._loader()
        return 0 if loader is None else loader._skip_batches

    def __iter__(self) -> Iterator[Any]:
        loader = self._loader()
        keys = None if loader is None else loader._keys  # (not `and`: a loader's truth is len())
        tags = None if loader is None else _Occurrences.of(loader)
        self.last = _SkippingIterator(self.base, self.skip, keys, tags)
        return self.last

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)


class _SkippingIterator:
    """The sampler's batches after the first ``skip``. It reads the sampler at its first
    batch, as the sampler alone would be read (a shuffle draws its order then), or when the
    loader says (:meth:`prime`), while the random state the epoch started from is set."""

    def __init__(self, base: Any, skip: int, keys: deque | None, tags: _Occurrences | None) -> None:
        self._base, self._skip, self._keys, self._tags = base, skip, keys, tags
        self._it: Iterator[Any] | None = None

    def prime(self) -> None:
        if self._it is None:
            it = iter(self._base)
            for _ in range(self._skip):
                skipped = next(it, None)
                if self._tags is not None and skipped is not None:  # (counted all the same)
                    self._tags(skipped)
            first = next(it, _END)
            self._it = it if first is _END else itertools.chain((first,), it)

    def __iter__(self) -> _SkippingIterator:
        return self

    def __next__(self) -> Any:
        self.prime()
        assert self._it is not None
        indices = next(self._it)
        tags = self._tags
        tagged = indices if tags is None else tags(indices)
        if self._keys is not None:  # for the batch the loader yields in this turn
            self._keys.append(tagged)
        return tagged if tags is not None and tags.passed else indices


class _Occurrences:
    """Tells apart the reads of an index a sampler yields more than once in an epoch on this
    rank (its count before), or that another rank may read too (the rank): such a read is an
    :class:`Occurrence` whose part is ``count * world + rank``, so that its per-sample draws
    are its own, as under a DataLoader (where oversampled samples, under WeightedRandomSampler,
    got one augmentation for all their reads); a first read on rank 0 stays a plain index. Not
    for samplers that deal every index once (sequential, a shuffle without replacement, a
    DistributedSampler's shares), whose indices stay plain and unchanged. The counts are an
    int32 array over the dataset (half what a WeightedRandomSampler's float64 weights take),
    with a dict for indices outside it."""

    def __init__(self, rank: int, world: int, passed: bool, size: int) -> None:
        self._counts = np.zeros(size, dtype=np.int32)
        self._seen: dict[Any, int] = {}
        self._rank, self._world = rank, world
        self.passed = passed  # to the dataset (a SeedPerSample), else for the keys only

    @classmethod
    def of(cls, loader: Any) -> _Occurrences | None:
        sampler, batches = loader._epoch_sampler(), loader.batch_sampler
        once = type(sampler) in (SequentialSampler, DistributedSampler) or (
            (type(sampler) is RandomSampler or getattr(sampler, "each_index_once", False))
            and not sampler.replacement
            and sampler.num_samples <= len(sampler.data_source)
        )
        if (once or sampler is loader._source()) and type(batches) in (BatchSampler, type(None)):
            return None
        try:
            size = len(loader.dataset)
        except TypeError:
            size = 0
        rank, world = rank_and_world_size()
        return cls(rank, world, isinstance(loader.dataset, SeedPerSample), size)

    def __call__(self, indices: Any) -> Any:
        if not isinstance(indices, list):
            return self([indices])[0]  # (batch_size=None: one index)
        keys = np.asarray(indices)
        counts = self._counts
        if keys.dtype.kind not in "iu" or keys.ndim != 1 or keys.size == 0:
            return self._counted_one_by_one(indices)
        if keys.min() < 0 or keys.max() >= counts.size:
            return self._counted_one_by_one(indices)
        # each read's count: the reads of its index in earlier batches, and earlier in this one
        order = np.argsort(keys, kind="stable")
        ranked = keys[order]
        at = np.arange(keys.size)
        starts = np.ones(keys.size, dtype=bool)
        starts[1:] = ranked[1:] != ranked[:-1]
        within = np.empty(keys.size, dtype=np.int64)
        within[order] = at - np.maximum.accumulate(np.where(starts, at, 0))
        parts = (counts[keys] + within) * self._world + self._rank
        np.add.at(counts, keys, 1)
        return [
            Occurrence(key, part) if part else index
            for index, key, part in zip(indices, keys.tolist(), parts.tolist(), strict=True)
        ]

    def _counted_one_by_one(self, indices: list[Any]) -> list[Any]:
        """Indices that are not all ints within the dataset: counted in a dict (keys of the
        dataset's own that are not indices at all are left as they are)."""
        out = []
        for index in indices:
            try:
                key = operator.index(index)
            except TypeError:
                out.append(index)
                continue
            inside = 0 <= key < self._counts.size
            count = int(self._counts[key]) if inside else self._seen.get(key, 0)
            if inside:
                self._counts[key] += 1
            else:
                self._seen[key] = count + 1
            part = count * self._world + self._rank
            out.append(Occurrence(key, part) if part else index)
        return out


def index_sampler(loader: Any, base: Any) -> Any:
    """The index sampler of a loader's epoch: for a map-style dataset, ``_Skipping``, which
    skips what a resume consumed, reads the sampler when the loader primes it, and notes each
    batch's indices (``loader._keys``: popped by ``_Counting`` as it yields that batch)."""
    if isinstance(loader.dataset, IterableDataset):
        return base
    return _Skipping(base, loader)


class _Dropping:
    """A DataLoader iterator without its first ``drop`` batches (a resumed generic
    IterableDataset: its stream is read again from the start, and what was consumed dropped)."""

    def __init__(self, it: Iterator[Any], drop: int) -> None:
        self._it, self._drop = it, drop

    def __iter__(self) -> _Dropping:
        return self

    def __next__(self) -> Any:
        while self._drop > 0:
            self._drop -= 1
            next(self._it)
        return next(self._it)

    def __len__(self) -> int:
        return max(0, len(self._it) - self._drop)  # type: ignore[arg-type]


class _Counting:
    """The loader's iterator, counting the batches it yields. With ``keep_generators`` (the
    dataset is read in this process, and its reads seed the generators), torch's, numpy's and
    ``random``'s states are set back after each batch to what they were before it, so that the
    loop's own draws are not disturbed; the collate draws as in a worker, from the states the
    reads leave. A SeedPerSample given there leaves them so while a batch is made (it sets them
    back itself otherwise: a ``dataset[i]`` of the user's own)."""

    def __init__(
        self,
        loader: Any,  # the ResumableLoader
        it: Iterator[Any],
        keep_generators: bool | SeedPerSample = False,
    ) -> None:
        self._loader, self._it = loader, it
        self._keep = keep_generators is not False
        self._seeded = keep_generators if isinstance(keep_generators, SeedPerSample) else None
        self._first = True

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> Any:
        if self._first:  # set_epoch since iter() (not under a DevicePrefetcher: its thread
            # reads the first batch at once, and torch's state is the loop thread's too)
            self._first = False
            made, now = self._loader._made_epoch, self._loader._sampler_epoch()
            if now is not None and now != made and self._loader._consumed is None:
                self._it = iter(())  # the old iterator goes (its workers stop) before the new
                remade = self._loader._remade()
                self._it, self._keep, self._seeded = remade._it, remade._keep, remade._seeded
        with kept_generators(self._keep):
            if self._seeded is not None:
                self._seeded.__dict__["_loop_kept"] = True
            try:
                batch = next(self._it)
            except StopIteration:
                self._loader._epoch_done()
                raise
            finally:
                if self._seeded is not None:
                    self._seeded.__dict__["_loop_kept"] = False
        keys = self._loader._keys
        self._loader._batch_keys = keys.popleft() if keys else None
        self._loader._batch_read()
        return batch

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]


def worker_batches(
    left: list[int], batch_size: int, drop_last: bool, batches: int
) -> tuple[list[int], int]:
    """How many of the first ``batches`` batches each worker made, and which worker makes the
    next one: a DataLoader takes them round robin over the workers still running (worker w
    holding ``left[w]`` samples), starting at worker 0."""
    made = [n // batch_size if drop_last else -(-n // batch_size) for n in left]
    counts = [0] * len(left)
    w = 0
    while batches > 0 and any(c < m for c, m in zip(counts, made, strict=True)):
        if counts[w] < made[w]:
            counts[w] += 1
            batches -= 1
        w = (w + 1) % len(left)
    for _ in range(len(left)):  # the next worker with batches left
        if counts[w] < made[w]:
            break
        w = (w + 1) % len(left)
    return counts, w
