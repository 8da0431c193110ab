"""Rank x worker sharding of iterable datasets, with the same number of samples on every rank,
and checkpoints that resume mid-epoch on the same or on another world size."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from torch.utils.data import IterableDataset, get_worker_info

from torchfeed.data._distributed import rank_and_world_size, worker_and_count
from torchfeed.data._grouped import in_fetches, read_groups, read_past
from torchfeed.data._plan import EpochPlan, epoch_order, split_for_consumer
from torchfeed.data._seeding import _START, _mix, seed_sample

__all__ = ["ShardedIterableDataset"]

# What an iteration learns in a process, never pickled: whether it reads shards in groups, the
# last grouped sample's seed and torch state, how many read samples wait to be yielded, and
# whether reads were seen to draw from numpy/random
_PER_PROCESS = ("_grouped", "_last", "_buffered", "_host_drew", "_host_checked")


class ShardedIterableDataset(IterableDataset):
    """An iterable dataset split over rank x worker, so that every (rank, worker) pair reads
    different data, every rank yields the same number of samples (no DDP hang), and the order
    changes with :meth:`set_epoch`, deterministically.

    - ``mode="shard"``: ``items`` are shards (files, URLs); each consumer opens whole shards
      with ``open_item(shard)`` (an iterable of samples). There must be at least as many shards
      as consumers (``world_size * num_workers``). ``item_lengths`` (the samples per shard, if
      known) lets a checkpoint resume inside a shard on another world size.
    - ``mode="sample"``: ``items`` are samples (or references that ``open_item`` turns into one
      sample each), dealt out one by one.

    ``uneven`` equalizes the item count per consumer ("drop" or "pad"). With shards of unequal
    length, set ``samples_per_epoch`` (per consumer): each consumer then yields exactly that many
    samples, cycling through its items if needed, which also bounds an epoch of an infinite or
    very long stream; every epoch restarts from its own shuffled order.

    ``seed_samples=True`` (the default) seeds torch/numpy/random before each sample from (seed,
    epoch, item, sample) (:func:`seed_sample`): random augmentations then follow the sample, so
    a resumed run draws exactly what the uninterrupted one drew, on any world size or worker
    count (``False``: the workers' own streams). A shard is opened after seeding for (seed,
    epoch, item, -1): a shuffle as it opens is the same whenever it is opened. Read through
    ``torchfeed.loader`` (which says how many samples a batch takes), a shard's samples are
    read 64 at a time, torch seeded before each, numpy and ``random`` once and compared after:
    about 4 us a sample, against 10 for seeding all three. A group whose reads drew from numpy
    or ``random`` is read again seeded per sample (the shard opened again), as is all that
    process reads after it. Before a batch's last sample the three are set as seeding per
    sample leaves them, so a random collate draws what it would. Read in the main process
    (``num_workers=0``, or iterated directly), the training loop's own draws are left alone:
    ``torchfeed.loader`` sets the three back after each batch, and otherwise the dataset (read
    in groups there too) after each of its reads.

    Checkpoints: ``torchfeed.loader`` (and ``ZeroCopyLoader``) save and restore this dataset's
    position with their own ``state_dict``; inside torchdata's ``StatefulDataLoader`` each
    worker's copy saves its own (:meth:`state_dict`, :meth:`load_state_dict`). Resuming with the
    same world size and workers continues the epoch as if never stopped; with others, the
    samples not yet consumed in the epoch are dealt out in streams of equal length, so that
    every rank yields the same number of batches: ``uneven="pad"`` repeats the first samples of
    the rest to make up the shortfall, ``"drop"`` leaves out the rest's last ``rest %
    consumers``; every other sample is read exactly once. The next epoch is a fresh plan again.
    A fresh epoch of shards of unequal lengths gives consumers unequal streams: set
    ``samples_per_epoch`` for lockstep ranks then.

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
        item_lengths: Sequence[int] | None = None,
        seed_samples: bool = True,
    ) -> None:
        if mode not in ("shard", "sample"):
            raise ValueError(f"mode must be 'shard' or 'sample', got {mode!r}")
        if uneven not in ("drop", "pad"):
            raise ValueError(f"uneven must be 'drop' or 'pad', got {uneven!r}")
        if samples_per_epoch is not None and (
            isinstance(samples_per_epoch, bool)
            or not isinstance(samples_per_epoch, int)
            or samples_per_epoch < 1
        ):
            raise ValueError(f"samples_per_epoch must be >= 1 (an int), got {samples_per_epoch!r}")
        if len(items) == 0:
            raise ValueError("items must not be empty")
        if item_lengths is not None:
            if mode != "shard":
                raise ValueError("item_lengths is for mode='shard' (a sample has length 1)")
            item_lengths = [int(n) for n in item_lengths]
            if len(item_lengths) != len(items) or any(n < 0 for n in item_lengths):
                raise ValueError(
                    f"item_lengths must give a count >= 0 for each of the {len(items)} items"
                )
        self.items = list(items)
        self.open_item = open_item
        self.mode = mode
        self.uneven = uneven
        self.shuffle = shuffle
        self.seed = int(seed)
        self.samples_per_epoch = samples_per_epoch
        self.item_lengths = item_lengths
        self.seed_samples = bool(seed_samples)
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._resume: dict[str, Any] | None = None  # a checkpoint to continue from
        self._yielded = 0  # in a worker: samples this consumer's iterator has yielded
        self._consumer: int | None = None  # in a worker: the consumer it reads
        # samples a DataLoader fetch collates, set by torchfeed.loader (None: not known)
        self._per_fetch: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _PER_PROCESS}

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def _order(self, epoch: int) -> list[int]:
        return epoch_order(len(self.items), self.seed, epoch, self.shuffle)

    def _lengths(self, order: list[int]) -> list[int] | None:
        """Samples per item in epoch order; None when unknown (shards without item_lengths)."""
        if self.mode == "sample":
            return [1] * len(order)
        if self.item_lengths is None:
            return None
        return [self.item_lengths[i] for i in order]

    def _check_consumers(self, consumers: int, world: int, workers: int) -> None:
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

    def plan(self, consumers: int, epoch: int | None = None) -> EpochPlan | None:
        """The epoch's plan over ``consumers`` consumers, the checkpoint being resumed included
        (None for shards of unknown length, or samples_per_epoch: their streams are only
        known by reading them)."""
        epoch = self.epoch if epoch is None else epoch
        lengths = self._lengths(self._order(epoch))
        if lengths is None or self.samples_per_epoch is not None:
            return None
        resume = (
            self._resume if self._resume is not None and self._resume["epoch"] == epoch else None
        )
        if resume is None:
            return EpochPlan.fresh(lengths, consumers, self.uneven)
        plan = EpochPlan.fresh(lengths, resume["history"][0][0], self.uneven)
        for count, consumed in resume["history"][1:]:
            plan = plan.resumed(consumed, count)
        if not self._same_shape(resume, consumers):  # elastic: the rest, dealt out afresh
            plan = plan.resumed(resume["consumed"], consumers)
        return plan

    @staticmethod
    def _same_shape(resume: dict[str, Any], consumers: int) -> bool:
        """Whether a checkpoint's consumers are this iteration's: the same ranks and workers
        (the same count over another world is another mapping of consumers to ranks)."""
        return resume["consumers"] == consumers and resume["world"] == rank_and_world_size()[1]

    def consumer_items(self) -> list[Any]:
        """The items this (rank, worker) reads this epoch (from the start)."""
        rank, world = rank_and_world_size()
        worker, workers = worker_and_count()
        consumers = world * workers
        self._check_consumers(consumers, world, workers)
        order = self._order(self.epoch)
        mine = split_for_consumer(order, rank * workers + worker, consumers, self.uneven)
        return [self.items[i] for i in mine]

    def _open(self, item: Any) -> Any:
        return self.open_item(item) if self.open_item else item

    def _segment(self, epoch: int, index: int, start: int, end: int) -> Iterator[Any]:
        """Samples [start, end) of item ``index``; sample ``end`` is never read."""
        if start >= end:
            return
        k = start
        for sample in self._seeded(epoch, index, start, end):
            yield sample
            k += 1
            if k == end:
                return
        raise RuntimeError(
            f"ShardedIterableDataset: shard {self.items[index]!r} gave {k} samples, but "
            f"item_lengths says {end}"
        )

    def _cycled(self, epoch: int, items: list[int], skip: int) -> Iterator[Any]:
        """samples_per_epoch samples, cycling through ``items`` (item indices), after ``skip``."""
        produced = 0
        while produced < self.samples_per_epoch:  # type: ignore[operator]
            empty = True
            for index in items:
                for sample in self._seeded(epoch, index):
                    empty = False
                    if produced >= skip:
                        yield sample
                    produced += 1
                    if produced == self.samples_per_epoch:
                        return
            if empty:
                raise RuntimeError(
                    "ShardedIterableDataset: this consumer's items yield no samples, so "
                    "samples_per_epoch cannot be met"
                )

    def progress(self, consumers: int) -> tuple[list[int], list[int]]:
        """Per consumer, for the iteration starting now: the samples of the epoch it had
        consumed already (a checkpoint resumed on the same consumers), and the samples its
        stream holds from there (what ``torchfeed.loader`` needs to turn batches into positions).
        Raises when the streams' lengths are unknown."""
        epoch = self.epoch
        resume = (
            self._resume if self._resume is not None and self._resume["epoch"] == epoch else None
        )
        base = (
            list(resume["consumed"])
            if resume and self._same_shape(resume, consumers)
            else [0] * consumers
        )
        if self.samples_per_epoch is not None:
            return base, [self.samples_per_epoch - b for b in base]
        plan = self.plan(consumers, epoch)
        if plan is None:
            raise ValueError(
                "ShardedIterableDataset: a checkpoint needs the length of every consumer's "
                "stream: give item_lengths (samples per shard) or samples_per_epoch"
            )
        return base, [plan.length(c) - base[c] for c in range(consumers)]

    def rotation(self, consumers: int) -> int:
        """How worker w maps to consumers in this iteration: consumer rank * workers + (w +
        rotation) % workers (non-zero only when resuming on the same consumers)."""
        resume = (
            self._resume
            if self._resume is not None and self._resume["epoch"] == self.epoch
            else None
        )
        if resume is None or not self._same_shape(resume, consumers):
            return 0
        return int(resume.get("rotation", 0))

    def resume_done(self) -> None:
        """Forgets the checkpoint being resumed (the loader calls it when that epoch ends)."""
        self._resume = None

    def __iter__(self) -> Iterator[Any]:
        # the fetch size as the iterator is made (torchfeed.loader sets it only for its own)
        return self._iterate(self._per_fetch if self.seed_samples else None)

    def _iterate(self, fetch: int | None) -> Iterator[Any]:
        rank, world = rank_and_world_size()
        worker, workers = worker_and_count()
        consumers = world * workers
        consumer = rank * workers + (worker + self.rotation(consumers)) % workers
        self._consumer = consumer
        epoch = self.epoch
        self._check_consumers(consumers, world, workers)
        resume = (
            self._resume if self._resume is not None and self._resume["epoch"] == epoch else None
        )
        skip = 0
        if resume is not None and self._same_shape(resume, consumers):
            skip = resume["consumed"][consumer]
        self._yielded = skip
        order = self._order(epoch)
        if self.samples_per_epoch is not None or self._lengths(order) is None:
            if resume is not None and not self._same_shape(resume, consumers):
                raise ValueError(
                    "ShardedIterableDataset: resuming on another number of consumers "
                    f"({resume['consumers']} -> {consumers}) needs streams of known length: "
                    "give item_lengths (samples per shard) and no samples_per_epoch"
                )
            mine = split_for_consumer(order, consumer, consumers, self.uneven)
            source = (
                self._cycled(epoch, mine, skip)
                if self.samples_per_epoch is not None
                else self._skipping(epoch, mine, skip)
            )
        else:
            plan = self.plan(consumers, epoch)
            assert plan is not None
            segments = (
                plan.remaining(consumer, skip)
                if resume and self._same_shape(resume, consumers)
                else plan.shares[consumer]
            )
            source = (s for p, a, b in segments for s in self._segment(epoch, order[p], a, b))
        # Shards are read in groups (read_groups) where the generators are set for what follows
        # the samples by in_fetches: read through torchfeed.loader, which says how many samples a
        # DataLoader fetch collates (batch_size, from the stream's start), set for each fetch's
        # collate; in the main process, otherwise, set back after every read.
        restore = self.seed_samples and fetch is None and get_worker_info() is None
        self._grouped = fetch is not None or restore
        self._last = None
        self._buffered = 0
        for sample in in_fetches(source, fetch, self.__dict__, restore):
            self._yielded += 1
            yield sample
        self._resume = None  # an epoch read to its end starts the next one afresh

    def _skipping(self, epoch: int, items: list[int], skip: int) -> Iterator[Any]:
        """Whole items in order (lengths unknown), after the first ``skip`` samples."""
        seen = 0
        for index in items:
            for sample in self._seeded(epoch, index):
                if seen >= skip:
                    yield sample
                seen += 1

    def _seeded(
        self, epoch: int, index: int, start: int = 0, end: int | None = None
    ) -> Iterator[Any]:
        """The samples of item ``index`` (one, in sample mode) from sample ``start`` on (up to
        ``end``, which is never read), each made after seeding for it (seed_samples); those
        before ``start`` are read past unseeded.

        Read through torchfeed.loader or in the main process (``_grouped``), a shard that can be
        opened again (``open_item`` given, or an item that is not its own iterator) is read in
        groups (:func:`read_groups`) until a read draws from numpy or ``random``: that group is
        read again, all three seeded before every sample, as everything after it in this
        process is."""
        if self.mode == "sample":
            if start == 0:
                if self.seed_samples:
                    seed_sample(self.seed, epoch, index, 0)
                yield self._open(self.items[index])
            return
        it, opened = self._open_seeded(epoch, index)
        if read_past(it, start) < start:
            return
        k = start
        if (
            self.seed_samples
            and self.__dict__.get("_grouped")
            and not self.__dict__.get("_host_drew")
            and (self.open_item is not None or it is not opened)
        ):
            prefix = _mix(_mix(_mix(_START, self.seed), epoch), index)  # derive_seed's parts
            again = yield from read_groups(it, prefix, k, end, self.__dict__)
            if again is None:
                return
            self.__dict__["_host_drew"] = True  # (per process: a fork copies it, harmlessly)
            it, _ = self._open_seeded(epoch, index)
            if read_past(it, again) < again:
                return
            k = again
        self._last = None  # these samples leave the generators as they are: nothing to settle
        while end is None or k < end:
            if self.seed_samples:
                seed_sample(self.seed, epoch, index, k)  # before the sample is made
            try:
                sample = next(it)
            except StopIteration:
                return
            yield sample
            k += 1

    def _open_seeded(self, epoch: int, index: int) -> tuple[Iterator[Any], Any]:
        """An iterator over shard ``index``, and what ``open_item`` returned: opened after
        seeding for (seed, epoch, index, -1), so that what opening draws (a shuffle of the
        shard's samples) is the same whenever it is opened, before or after a resume."""
        if self.seed_samples:
            seed_sample(self.seed, epoch, index, -1)
        opened = self._open(self.items[index])
        return iter(opened), opened

    def checkpoint(
        self, consumers: int, consumed: Sequence[int], rotation: int = 0
    ) -> dict[str, Any]:
        """The state after each of ``consumers`` consumers consumed ``consumed[c]`` samples of
        this epoch (what ``torchfeed.loader`` saves). ``rotation``: which of a rank's consumers
        serves the next batch (a resumed loader's first worker reads it, so that batches come
        in the uninterrupted run's order)."""
        resume = (
            self._resume
            if self._resume is not None and self._resume["epoch"] == self.epoch
            else None
        )
        history = list(resume["history"]) if resume else [[consumers, []]]
        if resume and not self._same_shape(resume, consumers):  # resumed elastically
            history.append([consumers, list(resume["consumed"])])
        return {
            "kind": "ShardedIterableDataset",
            "epoch": self.epoch,
            "items": len(self.items),
            "seed": self.seed,
            "consumers": consumers,
            "world": rank_and_world_size()[1],
            "consumed": [int(n) for n in consumed],
            "rotation": int(rotation),
            "history": history,
        }

    def state_dict(self) -> dict[str, Any]:
        """This consumer's position (torchdata's ``StatefulDataLoader`` calls it in each worker
        and gives each worker its own back, with the same number of workers)."""
        rank, world = rank_and_world_size()
        worker, workers = worker_and_count()
        consumers = world * workers
        me = self._consumer if self._consumer is not None else rank * workers + worker
        consumed = [0] * consumers
        consumed[me] = self._yielded
        state = self.checkpoint(consumers, consumed, self.rotation(consumers))
        state["only"] = me  # the one consumer this state speaks for
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a checkpoint (:meth:`checkpoint`, or :meth:`state_dict` of the same
        consumer) on the next iteration: load it before the workers start."""
        if state.get("kind") != "ShardedIterableDataset" or state.get("items") != len(self.items):
            raise ValueError(
                "ShardedIterableDataset.load_state_dict: the state is not a checkpoint of a "
                f"ShardedIterableDataset of {len(self.items)} items"
            )
        if state["seed"] != self.seed:
            raise ValueError(
                f"ShardedIterableDataset.load_state_dict: the checkpoint's seed {state['seed']} "
                f"differs from this dataset's {self.seed}: its order would not be the same"
            )
        # history: the plan's base consumers, then each elastic step that led to the plan of
        # state["consumers"], of which each consumer consumed state["consumed"][c] samples
        self._resume = {**state, "history": [list(h) for h in state["history"]]}
        self.set_epoch(state["epoch"])
