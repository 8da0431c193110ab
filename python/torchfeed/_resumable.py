"""ResumableLoader: a DataLoader that checkpoints its position mid-epoch and resumes from it, on
the same world size (exactly as if never stopped) or on another (every sample not yet consumed
in the epoch exactly once)."""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterator
from typing import Any, cast

import torch
from torch.utils.data import DataLoader, IterableDataset

from torchfeed._forking import warn_before_forking
from torchfeed._loader_args import dataloader_keywords, default_collation
from torchfeed._loader_iterators import (
    _Counting,
    _Dropping,
    index_sampler,
)
from torchfeed._resume_rules import (
    check_generic,
    moves_on,
    other_generators,
    resumed_length,
    set_other_generators,
    sharded_checkpoint,
)
from torchfeed.collate import DefaultCollate
from torchfeed.data._distributed import rank_and_world_size
from torchfeed.data._sampler import DistributedSampler, EpochShuffle
from torchfeed.data._seeding import SeedPerSample, run_seed
from torchfeed.data._sharding import ShardedIterableDataset

__all__ = ["ResumableLoader"]

_KIND, _VERSION = "torchfeed.loader", 1


class ResumableLoader(DataLoader):
    """A DataLoader with ``state_dict()`` / ``load_state_dict()`` for mid-epoch checkpoints.

    - A map-style dataset read through :class:`torchfeed.data.DistributedSampler`, or a
      :class:`torchfeed.data.ShardedIterableDataset`: the checkpoint records where every rank and
      worker stands (ranks advance in lockstep, so one rank's checkpoint describes all of them).
      Resuming with the same world size and workers continues as if never stopped; with others,
      every sample not yet consumed this epoch is read exactly once.
    - Any other sampler: the checkpoint records the batches yielded, and resuming skips that
      many (the sampler's order is reproduced from the random state saved at the epoch's start),
      on the same world size only.
    - Any other IterableDataset: on the same world size and ``num_workers`` only, its stream is
      read again from the epoch's start and the batches already consumed dropped; with
      ``num_workers=0``, one with a ``state_dict()`` of its own (a Hugging Face streaming
      dataset) resumes where it stood.

    Randomness follows the sample: a map-style dataset is read through
    :class:`~torchfeed.data.SeedPerSample` (``seed_samples=True``, the default), so that sample
    i's ``__getitem__`` draws from generators seeded from (seed, epoch, i): the same
    augmentation whatever rank or worker reads it, before or after a resume, on any world size
    or worker count. The seed is the sampler's (a DistributedSampler's ``seed``), else the
    initial seed of the loader's ``generator``, else ``torch.initial_seed()`` when the loader
    is made (seed every run alike); an int ``seed_samples`` sets it; ``False`` leaves the
    workers' streams as they are (a dataset that draws nothing read by index saves about 3 us a
    sample; one that draws from numpy or ``random``, about 10 us). The epoch is the sampler's
    ``epoch`` if it has one (``set_epoch``, on it or on this loader), else the count of this
    loader's epochs. (A :class:`~torchfeed.data.ShardedIterableDataset` seeds its own samples;
    another IterableDataset has no index to seed from.)

    The random state the epoch started from is saved too, so workers get the same seeds
    (:class:`~torchfeed.data.WorkerSeeder` streams included), and torch's global one when the
    checkpoint is taken: resumed, the epoch's iterator is made from the first, and the second
    is then set, so the training loop draws on as it did (the next epoch's shuffle too),
    whether it restores its own state or not. Datasets with their own
    ``state_dict`` (:class:`~torchfeed.data.SkipCorrupt`'s skipped samples) are saved alongside.
    Load a checkpoint before the epoch it resumes starts (before the workers start).

    Given no ``collate_fn``, the batches are :class:`~torchfeed.DefaultCollate`'s:
    ``default_collate``'s, which each worker writes into shared memory it reuses rather than into
    a fresh shared-memory file per tensor and batch.
    """

    def __init__(self, dataset: Any, *args: Any, seed_samples: bool | int = True, **kwargs: Any):
        kwargs = dataloader_keywords(args, kwargs)
        if not isinstance(seed_samples, bool | int):
            raise TypeError(
                f"seed_samples must be a bool or an int seed, got {type(seed_samples).__name__}"
            )
        if (
            seed_samples is not False
            and not isinstance(dataset, IterableDataset | SeedPerSample)
            and hasattr(dataset, "__getitem__")
        ):
            if seed_samples is True:
                sampler = kwargs.get("sampler")
                if sampler is None:  # not `or`: that would call a sampler's len()
                    sampler = getattr(kwargs.get("batch_sampler"), "sampler", None)
                seed_samples = run_seed(sampler, kwargs.get("generator"))
            dataset = SeedPerSample(dataset, int(seed_samples))
        EpochShuffle.in_place_of_shuffle(dataset, kwargs)
        if default_collation(kwargs):  # default_collate's batches, in memory each worker reuses
            kwargs["collate_fn"] = DefaultCollate()
        super().__init__(dataset, **kwargs)
        EpochShuffle.batches_with_epoch(self)
        self._epoch_index = 0  # this loader's epochs begun so far (the per-sample seeds' epoch)
        self._batches = 0  # yielded by the current epoch's iterator
        # read ahead by a DevicePrefetcher: the batches its loop has (None: no prefetcher), and
        # a stream's own positions after each batch read since (_track_consumption)
        self._consumed: int | None = None
        self._pulled: dict[int, Any] = {}
        # of this epoch, the batches consumed before a resume that a sampler's or sharded
        # stream's own state skips (_batches then counts from 0): the epoch's count is the sum
        self._resumed_from = 0
        self._rng: torch.Tensor | None = None  # the random state the epoch started from
        self._made_epoch: int | None = None  # the sampler's epoch when that iterator was made
        self._rng_more: dict[str, torch.Tensor] = {}  # and other generators' states then
        self._progress: tuple[list[int], list[int]] | None = None
        self._pending: dict[str, Any] | None = None
        self._skip_batches = 0  # of this epoch, consumed before a resume (a generic source)
        self._drop_batches = 0  # of those, to read again and drop (a generic IterableDataset)
        # an epoch begun; its iterator read to the end; that end reached by the training loop
        self._started = self._read_all = self._ended = False
        self._epoch_reset = self._as_reset = False
        # a map-style epoch's index batches sampled, not yet yielded, and the last one yielded
        # (a DevicePrefetcher seeds each image's draws from its sample), unless out of order
        self._keys: deque | None = None
        self._batch_keys: Any = None

    def _source(self) -> DistributedSampler | ShardedIterableDataset | None:
        if isinstance(self.dataset, ShardedIterableDataset):
            return self.dataset
        sampler = self._epoch_sampler()
        return sampler if isinstance(sampler, DistributedSampler) else None

    def _consumers(self) -> tuple[int, int, int]:
        rank, world = rank_and_world_size()
        return rank, world, max(1, self.num_workers)

    @property
    def _index_sampler(self) -> Any:
        return index_sampler(self, super()._index_sampler)

    def __len__(self) -> int:
        """The epoch's batches, those a resumed epoch had consumed before the checkpoint
        included, as a training loop counts them (Lightning restores its count of the epoch's
        batches and ends the epoch at len(loader), which it reads once)."""
        source = self._source()
        ours = source if isinstance(source, DistributedSampler) else None
        return resumed_length(self, super().__len__(), ours)

    def _rng_state(self) -> torch.Tensor:
        return self.generator.get_state() if self.generator is not None else torch.get_rng_state()

    def _make_iterator(self) -> Iterator[Any]:
        # A new DataLoader iterator draws its workers' base seed and then the sampler's order
        # from the generator; persistent workers' iterator, reset for a later epoch, only the
        # order. A resumed epoch that was such a reset draws the base seed elsewhere, so that
        # its order is the one the reset drew (and the fast-forward skips what was consumed).
        reset = self.persistent_workers and self.num_workers > 0 and self._iterator is not None
        self._epoch_reset = reset or self._as_reset
        if reset or not self._as_reset:
            return super().__iter__()
        generator, aside = self.generator, torch.Generator()
        aside.set_state(self._rng_state())
        self.generator = aside
        try:
            return super().__iter__()
        finally:
            self.generator = generator

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._consumed, self._pulled = None, {}
        pending, self._pending = self._pending, None
        self._as_reset = pending is not None and bool(pending.get("reset"))
        self._keys = deque() if getattr(self, "in_order", True) else None
        if pending is None:  # a fresh epoch, even after a resumed one left before its end
            self._skip_batches = self._drop_batches = 0
        self._resumed_from = 0
        if pending is not None and "source" in pending:
            self._resumed_from = int(pending["batches"])
        elif pending is not None and moves_on(self, pending):
            self._skip_batches = self._drop_batches = 0
            self._as_reset = bool(pending.get("persistent"))  # (that loader's next epoch)
            # the random state the loop left that epoch with (torch's: the checkpointing rank's
            # only, as below; a loader's own generator: any rank's)
            after, own = pending.get("rng_next"), pending.get("rank", 0) == rank_and_world_size()[0]
            set_other_generators(self, pending.get("rng_more_next") or {})
            if self.generator is not None and after is not None:
                self.generator.set_state(after)
                after = pending.get("rng_at_checkpoint")  # torch's (the sampler may draw there)
            if after is not None and own:
                torch.set_rng_state(after)
            return self._epoch_iterator({**pending, "epoch_index": pending["epoch_index"] + 1})
        if pending is None or pending.get("rng") is None:
            return self._epoch_iterator(pending)
        more, start = pending.get("rng_more") or {}, pending["rng"]
        set_other_generators(self, more)
        if self.generator is not None:
            self.generator.set_state(pending["rng"])
            start = more.get("global")
            if start is None:  # (a checkpoint of an earlier version)
                return self._epoch_iterator(pending)
        # The epoch's draws (the sampler's order, the workers' base seed) come from the random
        # state it started from; then torch's is set to what it was when the checkpoint was
        # taken: the training loop draws on as it did uninterrupted (and so does the next
        # epoch's shuffle), whether it restored that state itself (as the Hugging Face Trainer
        # does) or not. Not for a stream read in this process whose reads draw from torch's
        # generator as the loop does (one of the user's own, or sharded with seed_samples=False):
        # it is read again from its start, or past what it had read, and those reads draw again,
        # from the state the epoch started from, which is then left, as before this version.
        # (A checkpoint of an earlier version has none: the same.) Another rank's checkpoint
        # (one rank's describes all) sets the state that rank had: this rank's own is set back
        # (a loop seeded per rank keeps its own draws).
        then = pending.get("rng_at_checkpoint")
        if then is not None and pending.get("rank", 0) != rank_and_world_size()[0]:
            then = torch.get_rng_state()
        if self.num_workers == 0 and isinstance(self.dataset, IterableDataset):
            source = self._source()
            if not (isinstance(source, ShardedIterableDataset) and source.seed_samples):
                then = None
        torch.set_rng_state(start)
        try:  # (the sampler reads its order in there: workers at their first indices, and
            # without workers _epoch_iterator primes it)
            return self._epoch_iterator(pending)
        finally:
            if then is not None:
                torch.set_rng_state(then)

    def _epoch_iterator(self, pending: dict[str, Any] | None) -> Iterator[Any]:
        self._rng, self._made_epoch = self._rng_state(), self._sampler_epoch()
        self._rng_more = other_generators(self)
        if pending is not None:
            self._epoch_index = int(pending.get("epoch_index", self._epoch_index))
        if isinstance(self.dataset, SeedPerSample):
            self.dataset.set_epoch(self._sample_epoch())
        self._epoch_index += 1
        source = self._source()
        if isinstance(source, DistributedSampler):
            self._progress = source.progress()
        elif isinstance(source, ShardedIterableDataset):
            _, world, workers = self._consumers()
            try:
                self._progress = source.progress(world * workers)
            except ValueError:  # streams of unknown length: state_dict() says so if asked
                self._progress = None
        self._batches = self._skip_batches  # this epoch's, a checkpoint of a resumed one too
        self._started, self._read_all, self._ended = True, False, False
        warn_before_forking(self)
        if not isinstance(source, ShardedIterableDataset):
            it = self._make_iterator()
            prime = getattr(getattr(it, "_sampler_iter", None), "prime", None)
            if self.num_workers == 0 and prime is not None:  # the order drawn now, as workers do
                prime()  # (not from a state the loop moved, nor set back after the first batch)
            drop, self._drop_batches = self._drop_batches, 0
            it = _Dropping(it, drop) if drop else it
            if self.num_workers == 0 and isinstance(self.dataset, SeedPerSample):
                # its reads leave the generators as in a worker, for the collate; they go back
                # to the loop's own states after each batch
                return _Counting(self, it, keep_generators=self.dataset)
            return _Counting(self, it)
        # the samples a fetch collates, for the iterator made now (and workers started now):
        # not for another loader over the same dataset
        source._per_fetch = self.batch_size if (self.batch_size or 0) > 1 else None
        # read in this process, the stream leaves the generators set for the collate: they go
        # back to the loop's own states after each batch
        keep = self.num_workers == 0 and source.seed_samples and source._per_fetch is not None
        try:
            return _Counting(self, self._make_iterator(), keep_generators=keep)
        finally:
            source._per_fetch = None

    def _remade(self) -> _Counting:
        """The iterator iter() would make now, from the epoch's starting random state (the
        loop's is left): Lightning 2.5.3-2.6 sets the epoch after iter() (its #21938)."""
        now, then = self._rng_state(), cast(torch.Tensor, self._rng)  # (set with the iterator)
        put = torch.set_rng_state if self.generator is None else self.generator.set_state
        put(then)
        self._epoch_index -= 1
        try:
            remade = self.__iter__()
        finally:
            put(now)
        assert isinstance(remade, _Counting)
        return remade

    def _track_consumption(self) -> None:
        """For a DevicePrefetcher, right after it made this epoch's iterator: a checkpoint then
        records the batches its training loop has (``_consumed``, set as it hands each one on),
        not the ones read ahead, and a stream that keeps its own position is noted after each
        batch read (``_pulled``)."""
        self._consumed = self._batches
        if self._own_position():
            self._pulled = {self._batches: copy.deepcopy(self.dataset.state_dict())}  # type: ignore[attr-defined]

    def _own_position(self) -> bool:
        return (
            self.num_workers == 0
            and isinstance(self.dataset, IterableDataset)
            and self._source() is None
            and hasattr(self.dataset, "state_dict")
        )

    def _batch_read(self) -> None:
        """After each batch this epoch's iterator yields (in a prefetcher's thread, if any)."""
        self._batches += 1
        consumed = self._consumed
        if consumed is not None and self._own_position():
            position = self.dataset.state_dict()  # type: ignore[attr-defined]
            self._pulled[self._batches] = copy.deepcopy(position)
            for k in [k for k in self._pulled if k < consumed]:
                del self._pulled[k]  # (never the one a checkpoint would take now)

    def set_epoch(self, epoch: int) -> None:
        """The sampler's ``set_epoch`` (if it has one), where the HF Trainer looks for it."""
        if (set_epoch := getattr(self._epoch_sampler(), "set_epoch", None)) is not None:
            set_epoch(epoch)

    def _epoch_sampler(self) -> Any:
        """The sampler under the batch sampler, else the loader's."""
        sampler = getattr(self.batch_sampler, "sampler", None)
        # (not `or`: a sampler's truth value is its len())
        return self.sampler if sampler is None else sampler

    def _sampler_epoch(self) -> int | None:
        """The sampler's own epoch (``set_epoch``), if it has one."""
        epoch = getattr(self._epoch_sampler(), "epoch", None)
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else None

    def _sample_epoch(self) -> int:
        """The epoch the per-sample seeds use: the sampler's, else this loader's count."""
        epoch = self._sampler_epoch()
        return self._epoch_index if epoch is None else epoch

    def _epoch_done(self) -> None:
        self._skip_batches = self._drop_batches = 0
        self._read_all = True
        if self._consumed is None:  # (under a DevicePrefetcher: when it hands on that end)
            self._ended = True
        for obj in (self._source(), self.dataset):
            done = getattr(obj, "resume_done", None)
            if done is not None:
                done()

    def state_dict(self) -> dict[str, Any]:
        """Where the current epoch stands after the batches yielded so far; after
        :meth:`load_state_dict`, until the next ``iter()``, the checkpoint loaded (nothing has
        moved since)."""
        if self._pending is not None:
            return copy.deepcopy(self._pending)
        batch_size = self.batch_size or 1
        batches = self._batches if self._consumed is None else self._consumed
        if (
            not getattr(self, "in_order", True)
            and self.num_workers > 1
            and batches > 0
            and not (self._read_all and batches == self._batches)
        ):
            raise RuntimeError(
                f"state_dict: this loader has in_order=False, so its {self.num_workers} workers' "
                "batches arrive as each is finished, not in the sampler's order, and a checkpoint "
                f"after {batches} of them cannot tell which were consumed (resumed, some samples "
                "would be read twice and others never). Checkpoint mid-epoch with in_order=True "
                "(the default), or at an epoch's end"
            )
        state: dict[str, Any] = {
            "kind": _KIND,
            "version": _VERSION,
            "batches": self._resumed_from + batches,  # of the epoch
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "num_workers": self.num_workers,
            "world": rank_and_world_size()[1],
            "rng": self._rng,
            # torch's global state (with a loader's generator=) and the sampler's own generator
            "rng_more": self._rng_more,
            "rng_at_checkpoint": torch.get_rng_state(),  # torch's global state now
            "rank": rank_and_world_size()[0],  # whose state that is
            "epoch_index": self._epoch_index - 1 if self._started else self._epoch_index,
            # this epoch's iterator: persistent workers' reset, or a new one
            "reset": self._epoch_reset,
            "persistent": bool(self.persistent_workers and self.num_workers > 0),
        }
        source = self._source()
        if isinstance(source, DistributedSampler):
            base, left = self._progress or source.progress()
            consumed = [b + min(n, batches * batch_size) for b, n in zip(base, left, strict=True)]
            state["source"] = source.checkpoint(consumed)
        elif isinstance(source, ShardedIterableDataset):
            state["source"] = sharded_checkpoint(self, source, batches)
        else:  # fast-forwarded: what tells the next epoch from the rest of this one
            state["sampler_epoch"] = self._sampler_epoch()
            state["ended"] = self._ended
            state["rng_next"] = self._rng_state() if self._ended else None
            # (the sampler's own: torch's global state the next epoch starts from is
            # rng_at_checkpoint)
            more = other_generators(self) if self._ended else {}
            state["rng_more_next"] = {"sampler": more["sampler"]} if "sampler" in more else None
        if hasattr(self.dataset, "state_dict") and not isinstance(source, ShardedIterableDataset):
            if self._consumed is None or not self._own_position():
                state["dataset"] = self.dataset.state_dict()
            elif batches in self._pulled:  # where the stream stood after the loop's last batch
                state["dataset"] = self._pulled[batches]
            # (else none: the resumed stream is read again and the consumed batches dropped)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at the next ``iter()`` from a :meth:`state_dict`."""
        if state.get("kind") != _KIND or state.get("version") != _VERSION:
            raise ValueError(
                f"load_state_dict: not a {_KIND} checkpoint (version {_VERSION}), got "
                f"{state.get('kind')!r} version {state.get('version')!r}"
            )
        if state["batch_size"] != self.batch_size:
            raise ValueError(
                f"load_state_dict: the checkpoint's batch_size {state['batch_size']} differs from "
                f"this loader's {self.batch_size}: positions would not match"
            )
        if self._started and self.persistent_workers and self.num_workers > 0:
            raise RuntimeError(
                "load_state_dict: this loader's persistent workers have started; load the "
                "checkpoint into a new loader before its first epoch"
            )
        source = self._source()
        if "source" in state:
            if source is None:
                raise ValueError(
                    f"load_state_dict: the checkpoint is of a {state['source']['kind']}, which "
                    "this loader does not read"
                )
            source.load_state_dict(state["source"])
            self._skip_batches = 0
        else:  # a generic sampler or IterableDataset: fast-forward
            if not state.get("ended"):  # (past an epoch's end, nothing is left to skip)
                check_generic(self, state)
            self._skip_batches = state["batches"]
            # the sampler's epoch is part of the position (Lightning sets the epoch only after
            # the resumed iter(), and a sampler set to another since reads that one whole)
            set_epoch = getattr(self._epoch_sampler(), "set_epoch", None)
            if state.get("sampler_epoch") is not None and callable(set_epoch):
                set_epoch(state["sampler_epoch"])
        load = getattr(self.dataset, "load_state_dict", None)
        own = "dataset" in state and load is not None
        if load is not None and "dataset" in state:
            load(state["dataset"])
        if isinstance(self.dataset, IterableDataset) and source is None:
            # a stream that keeps its own position (in this process: no workers) resumes there;
            # any other is read again from the start and its consumed batches dropped
            self._drop_batches = 0 if own and self.num_workers == 0 else self._skip_batches
        self._pending = state
