"""Zero-copy loading: DataLoader workers collate straight into a shared (and, on a GPU machine,
page-locked) ring that the main process created, and send a small handle instead of tensors.

Usual path: a worker's collate output becomes one fresh shared-memory file per tensor (file
creation, descriptor passing, page faults on new pages); then the main process's pin thread
copies it into pinned memory. Here the worker writes its batch once, into memory that stays
mapped in every process and is already registered with the CUDA runtime.

The ring is an explicit collaborator: the loader hands the workers a copy of the collate bound
to it (``collate_fn.with_shared_ring(ring)``) and never changes the caller's collate. The batches
carry their own fence: on a GPU machine their tensors are RingTensors, and whatever copies one to
the GPU (a ``.to(device, non_blocking=True)`` loop, a wrapper, DevicePrefetcher) fences its
region after the copy, so a worker never overwrites memory a copy may still be reading.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import Dataset, IterableDataset

from torchfeed._extension import gpu_kernels_usable
from torchfeed._loader_args import dataloader_keywords
from torchfeed._resumable import ResumableLoader
from torchfeed._tree import tensors_of
from torchfeed.collate import DefaultCollate
from torchfeed.data._seeding import kept_generators
from torchfeed.memory._budget import memory_budget
from torchfeed.memory._ring_base import check_timeout
from torchfeed.memory._shared_ring import RingHandle, SharedRing

__all__ = ["ResumableLoader", "ZeroCopyLoader", "loader"]


def _bind(collate_fn: Callable, ring: SharedRing | None) -> Callable:
    """``collate_fn`` bound to ``ring`` (a copy: the caller's object is never changed)."""
    return collate_fn.with_shared_ring(ring)  # type: ignore[attr-defined]


class ZeroCopyLoader(ResumableLoader):
    """A DataLoader whose workers collate straight into a :class:`SharedRing`.

    ``collate_fn`` must be ring-aware: :class:`~torchfeed.PadCollate`,
    :class:`~torchfeed.ImageCollate`, or any callable with ``with_shared_ring(ring)`` returning
    a copy of itself that returns ``ring.pack(batch)`` inside workers; without one, the batches
    are ``default_collate``'s, as a DataLoader's, written into the ring. The batches you get are
    identical to the ordinary path's, their large tensors viewing the ring (tensors of at most
    64 KiB, the labels, arrive as copies of their own: one kept past its batch holds no ring
    memory); with ``num_workers=0`` there is nothing to share and it is an ordinary
    DataLoader. Without a usable GPU the ring's memory is allocated as the workers first write
    it (about the batches in flight, whatever the capacity), so ``ring_capacity`` (bytes)
    defaults to half the memory this process may use, with nothing measured up front. With one,
    the ring is page-locked when it is made (``cudaHostRegister`` locks every page), so all of
    it is resident from the start, and ``ring_capacity`` defaults to enough for every batch the
    workers can have in flight, estimated from a first batch's first 8 samples collated in this
    process (fewer, at least 2, when they take over 0.25 s, with more room to spare), at most
    half the memory this process may use. That memory is the machine's, or the container's
    memory limit where that is lower, divided among the ranks torchrun started on the machine
    (``LOCAL_WORLD_SIZE``); a batch larger than the ring takes the ordinary path. A
    ``ring_capacity`` set by hand needs room for ``num_workers * prefetch_factor`` batches and
    those the consumer holds: with less, a worker can fill it with batches sent after the one
    the consumer waits for, and waits for room (``ring_timeout``, then an error); the loader
    warns at the first batch when the ring cannot hold them. ``ring_timeout`` is how long a
    worker waits for space (seconds, or None: forever). One iterator at a time: a new
    ``iter(loader)`` takes back the ring regions of the previous iterator's batches, and that
    iterator then raises a RuntimeError saying so (an ordinary DataLoader would run both).
    """

    def __init__(
        self,
        dataset,
        *args: Any,
        ring_capacity: int | None = None,
        ring_timeout: float | None = 30.0,
        **kwargs: Any,
    ) -> None:
        kwargs = dataloader_keywords(args, kwargs)  # DataLoader(dataset, 64, ...) as it takes them
        collate_fn: Callable | None = kwargs.pop("collate_fn", None)
        if collate_fn is None:
            collate_fn = DefaultCollate()
        if not hasattr(collate_fn, "with_shared_ring"):
            raise TypeError(
                "zero_copy needs a ring-aware collate_fn (torchfeed.PadCollate, "
                "torchfeed.ImageCollate, or one with a with_shared_ring(ring) method), got "
                f"{collate_fn!r}"
            )
        if ring_capacity is None and (
            isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__")
        ):
            raise TypeError(
                f"zero_copy over a {type(dataset).__name__} (not a map-style dataset, which it "
                "could index to measure a first batch) needs ring_capacity=<bytes>"
            )
        check_timeout(ring_timeout, "ring_timeout")
        if ring_capacity is not None and (
            isinstance(ring_capacity, bool)
            or not isinstance(ring_capacity, int)
            or ring_capacity < 1
        ):
            raise ValueError(f"ring_capacity must be a positive int (bytes), got {ring_capacity!r}")
        super().__init__(dataset, collate_fn=_bind(collate_fn, None), **kwargs)
        self._unbound_collate = collate_fn
        self.shared_ring: SharedRing | None = None
        self._ring_capacity = ring_capacity
        self._ring_timeout = ring_timeout
        self._capacity_checked = False
        self._iterators = 0  # made so far: only the newest may hand out batches

    def _queued_batches(self) -> int:
        """The batches the DataLoader keeps requested from its workers: num_workers x
        prefetch_factor (DataLoader's default 2 where it is None)."""
        return self.num_workers * (self.prefetch_factor or 2)

    def _make_ring(self) -> None:
        capacity = self._ring_capacity
        # a ring made with usable GPU kernels is page-locked: every byte resident from the start
        if capacity is None and not gpu_kernels_usable():
            # Nothing is page-locked without a usable GPU, and pages are allocated as the workers
            # first write them (first fit from the start): the ring costs what its batches use
            # whatever its capacity. So it takes its whole share, with no probe, which collated
            # a first batch's samples here before the workers started: a quarter second of the
            # first epoch on photos, whose zero-copy pipelines then took 1.5x-1.7x their later
            # epochs (35 real photographs, epochs of 3 batches)
            capacity = memory_budget().share(2)
        if capacity is None:
            nbytes, samples, exact = self._probe_batch_bytes()
            waiting = self._queued_batches()
            # room for those, for the batches the consumer holds, and for batches larger than
            # the probe's (more so when it is an estimate, and from fewer samples). Memory is
            # allocated as the workers first write it, in parallel: populating the queued
            # batches' part here, before they start, made first epochs slower (whole photos,
            # 3 GB: 6.3-8.5 s against 4.9-5.6 s; 300-600 px images: 1.27 s against 1.19 s)
            margin = 1.5 if exact else 2.0 if samples >= self._PROBE_SAMPLES else 3.0
            capacity = int(nbytes * margin + 4096) * (waiting + 4)
            # at most half the memory this process may use (the container's limit, shared
            # with the other ranks on this machine): with a GPU every byte is page-locked now
            budget = memory_budget()
            most = budget.share(2)
            if capacity > most:
                warnings.warn(
                    f"zero_copy: batches of about {nbytes / 1e6:.0f} MB, {waiting} queued "
                    f"(num_workers x prefetch_factor) and those the consumer holds, would want "
                    f"a ring of {capacity / 1e9:.1f} GB; it gets {budget.describe(2)} "
                    "(workers wait for room when it is full). Smaller "
                    "batches help, and so does decoding crop windows in the workers "
                    "(torchfeed.decode.DecodeRandomCrop) rather than whole images",
                    RuntimeWarning,
                    stacklevel=4,  # _make_ring, _make_iterator, __iter__, the user's loop
                )
                capacity = most
        self.shared_ring = SharedRing(capacity, timeout=self._ring_timeout)
        self.collate_fn = _bind(self._unbound_collate, self.shared_ring)

    _PROBE_SAMPLES = 8
    # Samples that slow (a large photo decoded whole: ~0.1 s) are probed fewer, at least 2: the
    # probe runs before the workers start, so its time is the first epoch's.
    _PROBE_SECONDS = 0.25

    def _probe_batch_bytes(self) -> tuple[int, int, bool]:
        """The bytes of a batch, measured on a first batch collated here (on its first 8
        samples, or those read in 0.25 s but at least 2, scaled up, when batches are larger),
        the samples read, and whether that is exact (the whole batch). Every random state it
        could move (torch's, numpy's, random's) is put back: the user's draws, and the batches
        the workers make, are the ordinary path's."""
        with kept_generators():
            size = len(self.dataset)  # type: ignore[arg-type]  # map-style: checked in __init__
            batch = min(self.batch_size or 1, size)
            first: list[Any] = []
            start = time.perf_counter()
            for i in range(min(batch, self._PROBE_SAMPLES)):
                first.append(self.dataset[i])
                if len(first) >= 2 and time.perf_counter() - start > self._PROBE_SECONDS:
                    break
            nbytes = sum(
                t.numel() * t.element_size() for t in tensors_of(self._unbound_collate(first))
            )
            probe = len(first)
            return -(-nbytes * batch // max(probe, 1)), probe, probe == batch

    def _make_iterator(self) -> Iterator[Any]:
        if self.num_workers == 0:
            return super()._make_iterator()
        if self.shared_ring is None:
            self._make_ring()  # before the workers start: they map it when they do
        ring = self.shared_ring
        assert ring is not None
        ring.reclaim_dead()  # regions of workers lost in an earlier epoch
        start = ring.next_generation()
        it = super()._make_iterator()  # persistent workers: the previous epoch's leftovers go
        # Batches written for an earlier epoch and never handed out (discarded by the
        # DataLoader's reset, or lost with a dead worker) can never be unpacked: free them.
        # (One iterator per loader at a time, as with persistent workers.)
        ring.reclaim_before(start)
        self._iterators += 1
        return _Unpacking(it, self)

    def _check_capacity(self, handle: RingHandle) -> None:
        """Once, at the first batch, for a ``ring_capacity`` set by hand: warns when the ring
        cannot hold the batches the loader queues plus the one the consumer holds. Then a worker
        can fill it with batches sent after the one the consumer waits for, and the worker
        writing that one waits for room until ``ring_timeout`` (reproduced with 2 workers, two
        batches queued each, and a ring of 3 batches: a RingTimeoutError after 30 s)."""
        if self._ring_capacity is None or self._capacity_checked:
            return
        self._capacity_checked = True
        queued = self._queued_batches()
        fits = self._ring_capacity // max(handle.nbytes, 1)
        if fits < queued + 1:
            warnings.warn(
                f"zero_copy: ring_capacity={self._ring_capacity} bytes holds {fits} batch(es) of "
                f"{handle.nbytes} bytes (the first), fewer than the {queued} the loader queues "
                f"(num_workers={self.num_workers} x prefetch_factor="
                f"{self.prefetch_factor or 2}) plus the one the consumer holds: a worker can "
                "wait for room that only a batch not yet written would free, until ring_timeout. "
                f"Give it at least {(queued + 1) * handle.nbytes} bytes, or leave ring_capacity "
                "unset to have it sized from the first batch",
                RuntimeWarning,
                stacklevel=4,  # _check_capacity, _Unpacking, _Counting, the user's loop
            )


class _Unpacking:
    def __init__(self, it: Iterator[Any], owner: ZeroCopyLoader) -> None:
        assert owner.shared_ring is not None
        self._it, self._ring, self._owner = it, owner.shared_ring, owner
        self._number = owner._iterators

    def __iter__(self) -> _Unpacking:
        return self

    def __next__(self) -> Any:
        if self._number != self._owner._iterators:
            # A newer iter(loader) reclaimed the regions this one's batches were written to (the
            # ordinary DataLoader lets two iterators run; here they would share one ring).
            raise RuntimeError(
                f"zero_copy: this iterator of the loader (its iter() number {self._number}) was "
                f"superseded by a later iter(loader) (number {self._owner._iterators}), which "
                "took back the ring regions of this one's batches. A ZeroCopyLoader runs one "
                "iterator at a time: finish or drop an epoch's iterator before calling iter() "
                "again (itertools.islice(loader, n) and (b for b in loader) call it too)"
            )
        batch = next(self._it)
        if not isinstance(batch, RingHandle):
            return batch
        self._owner._check_capacity(batch)
        return self._ring.unpack(batch)

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]


def loader(dataset: Dataset, *args: Any, zero_copy: bool = False, **kwargs: Any) -> ResumableLoader:
    """A DataLoader with mid-epoch checkpoints (:class:`ResumableLoader`: ``state_dict()`` /
    ``load_state_dict()``); with ``zero_copy=True`` its workers collate straight into a shared,
    page-locked ring (:class:`ZeroCopyLoader`). It takes DataLoader's arguments as DataLoader
    does, by name or by position (``torchfeed.loader(dataset, 64, True)``)."""
    kwargs = dataloader_keywords(args, kwargs)
    if zero_copy:
        return ZeroCopyLoader(dataset, **kwargs)
    collate_fn = kwargs.get("collate_fn")
    if collate_fn is not None and getattr(collate_fn, "shared_ring", None) is not None:
        # an ordinary loader unpacks nothing: a copy that collates as usual
        kwargs["collate_fn"] = collate_fn.with_shared_ring(None)
    return ResumableLoader(dataset, **kwargs)
