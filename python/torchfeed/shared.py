"""Zero-copy batches: DataLoader workers collate straight into a shared (and, on a GPU machine,
page-locked) ring that the main process created, and send a small handle instead of tensors.

Usual path: a worker's collate output becomes one fresh shared-memory file per tensor (file
creation, descriptor passing, page faults on new pages); then the main process's pin thread
copies it into pinned memory. Here the worker writes its batch once, into memory that stays
mapped in every process and is already registered with the CUDA runtime.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, get_worker_info

from torchfeed.ring import carve, field_layout, map_tensors, tensors_of


@dataclass(frozen=True)
class _Spec:
    """A tensor of a packed batch: where it is in the region and what it looks like (stored
    contiguously as ``shape``, then ``permute``d)."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    permute: tuple[int, ...] | None = None


class Lazy:
    """A tensor that a collate writes in place: packed into the ring, ``fill(out)`` writes it
    straight into the region (``out`` is ``shape`` contiguous, then ``permute``d); on the
    ordinary path ``make()`` builds it."""

    def __init__(
        self,
        dtype: torch.dtype,
        shape: tuple[int, ...],
        fill: Callable[[Tensor], Any],
        make: Callable[[], Tensor],
        permute: tuple[int, ...] | None = None,
    ) -> None:
        self.dtype = dtype
        self.shape = tuple(shape)
        self.fill = fill
        self.make = make
        self.permute = permute

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


def concat(parts: list[Tensor]) -> Lazy:
    """The flattened concatenation of ``parts``, written once."""
    flat = [p.reshape(-1) for p in parts]
    numel = sum(p.numel() for p in flat)
    return Lazy(
        flat[0].dtype, (numel,), lambda out: torch.cat(flat, out=out), lambda: torch.cat(flat)
    )


def _is_leaf(x: Any) -> bool:
    return isinstance(x, Tensor | Lazy)


@dataclass
class RingHandle:
    """What crosses the worker queue instead of a batch: a region of the shared ring and the
    layout of the batch inside it."""

    slot: int
    generation: int
    nbytes: int
    tree: Any


class SharedRing:
    """A ring of ``capacity`` bytes in shared memory (an anonymous memfd), created in the main
    process before the workers start and mapped by every worker (fork or spawn). Workers
    ``pack`` batches into regions; the main process ``unpack``s handles into tensors viewing the
    same memory, and a region is free again once those tensors (and every view of them) are
    gone and every copy from them has finished. With a usable GPU the memory is page-locked in
    the main process (``cudaHostRegister``), so the very bytes a worker writes are DMA'd to the
    GPU. Regions of a worker that died are reclaimed (``reclaim_dead``; also on demand when the
    ring is full). Linux only (memfd)."""

    def __init__(
        self,
        capacity: int,
        *,
        alignment: int = 256,
        timeout: float = 30.0,
        pinned: bool | None = None,
    ) -> None:
        from torchfeed import _C

        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int (bytes), got {capacity!r}")
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if not hasattr(os, "memfd_create"):
            raise OSError("SharedRing needs Linux (os.memfd_create)")
        self.timeout = float(timeout)
        self._owner = os.getpid()
        # the C++ object maps the memfd and unmaps it when the last tensor viewing it is gone
        self._fd = os.memfd_create("torchfeed-shared-ring", os.MFD_CLOEXEC)
        self._ring = _C._SharedRing.create(self._fd, capacity, alignment)
        if pinned is not False:
            registered = self._ring.register_pinned()
            if pinned and not registered:
                raise ValueError("SharedRing: pinned=True needs a usable CUDA GPU")
        self._warned_oversize = False

    # --- crossing into a spawned worker ---------------------------------------------------------
    def __reduce__(self):
        return (_attach, (self._owner, self._fd, self.timeout))

    @classmethod
    def _attached(cls, owner: int, fd: int, timeout: float) -> SharedRing:
        from torchfeed import _C

        self = object.__new__(cls)
        self.timeout = timeout
        self._owner = owner
        self._fd = fd
        # the owner's memfd, by its /proc path: works for spawned children, with no name to leak
        local = os.open(f"/proc/{owner}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            self._ring = _C._SharedRing.attach(local)
        finally:
            os.close(local)  # the mapping stays
        self._warned_oversize = False
        return self

    # --- facts ---------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._ring.capacity

    @property
    def pinned(self) -> bool:
        return self._ring.pinned

    def stats(self) -> dict[str, int]:
        """capacity, bytes_in_use, regions_in_workers (being written or in transit),
        regions_in_consumer, allocations, waits, reclaimed, high_water."""
        return dict(self._ring.stats())

    def reclaim_dead(self) -> int:
        """Frees the regions of workers that died holding them; returns how many."""
        return self._ring.reclaim_dead()

    def contains(self, t: Tensor) -> bool:
        start = self._ring.data_address
        return t.device.type == "cpu" and start <= t.data_ptr() < start + self.capacity

    def record(self, t: Tensor, stream: torch.cuda.Stream) -> None:
        """Fences the region under ``t``: it is not reused before the work now queued on
        ``stream`` (the copy of ``t``) has finished."""
        self._ring.record(t, stream.cuda_stream, stream.device.index)

    # --- the worker side -----------------------------------------------------------------------
    def pack(self, batch: Any, timeout: float | None = None) -> RingHandle | Any:
        """Writes every tensor of ``batch`` (and every :class:`Lazy` one) into one region and
        returns its handle. A batch larger than the whole ring is returned as an ordinary batch,
        with a one-time warning."""
        leaves: list[Any] = []
        map_tensors(batch, leaves.append, _is_leaf)
        layout, total = field_layout(leaves, _nbytes)
        try:
            slot, generation, offset = self._ring.acquire(
                total, self.timeout if timeout is None else timeout
            )
        except ValueError:
            if not self._warned_oversize:
                self._warned_oversize = True
                warnings.warn(
                    f"SharedRing: a batch of {total} bytes is larger than the ring "
                    f"({self.capacity} bytes); such batches take the ordinary path",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return map_tensors(batch, _materialize, _is_leaf)
        try:
            region = self._ring.region(offset, total)

            def place(leaf: Any) -> _Spec:
                start, nbytes = layout[id(leaf)], _nbytes(leaf)
                view = carve(region, start, nbytes, leaf.dtype, leaf.shape)
                if isinstance(leaf, Lazy):
                    leaf.fill(view if leaf.permute is None else view.permute(*leaf.permute))
                    return _Spec(start, nbytes, leaf.dtype, leaf.shape, leaf.permute)
                view.copy_(leaf)
                return _Spec(start, nbytes, leaf.dtype, tuple(leaf.shape))

            tree = map_tensors(batch, place, _is_leaf)
        except BaseException:
            self._ring.abandon(slot, generation)
            raise
        return RingHandle(slot, generation, total, tree)

    # --- the main side -------------------------------------------------------------------------
    def unpack(self, handle: RingHandle) -> Any:
        """The batch of a handle, as tensors viewing the region (which is released when they are
        all freed)."""
        region = self._ring.view(handle.slot, handle.generation, handle.nbytes)

        def view(spec: _Spec) -> Tensor:
            t = carve(region, spec.offset, spec.nbytes, spec.dtype, spec.shape)
            return t if spec.permute is None else t.permute(*spec.permute)

        return map_tensors(handle.tree, view, lambda x: isinstance(x, _Spec))

    def __del__(self) -> None:
        # The memory itself (unregistered, then unmapped) goes with the last tensor viewing it.
        if getattr(self, "_owner", None) == os.getpid() and getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1


def _attach(owner: int, fd: int, timeout: float) -> SharedRing:
    return SharedRing._attached(owner, fd, timeout)


def _nbytes(leaf: Any) -> int:
    return leaf.nbytes


def _materialize(leaf: Any) -> Tensor:
    return leaf.make() if isinstance(leaf, Lazy) else leaf


def in_worker() -> bool:
    return get_worker_info() is not None


class ZeroCopyLoader(DataLoader):
    """A DataLoader whose workers collate straight into a :class:`SharedRing`.

    ``collate_fn`` must be ring-aware (:class:`~torchfeed.PadCollate`,
    :class:`~torchfeed.ImageCollate`, or any callable with a ``ring`` attribute that returns
    ``ring.pack(...)`` in workers). The batches you get are identical to the ordinary path's;
    with ``num_workers=0`` there is nothing to share and it is an ordinary DataLoader.
    ``ring_capacity`` (bytes) defaults to enough for every batch the workers can have in
    flight, measured on a first batch collated in this process.
    """

    def __init__(
        self,
        dataset,
        *,
        collate_fn: Callable,
        ring_capacity: int | None = None,
        ring_timeout: float = 30.0,
        **kwargs: Any,
    ) -> None:
        if not hasattr(collate_fn, "ring"):
            raise TypeError(
                "zero_copy needs a ring-aware collate_fn (torchfeed.PadCollate, "
                f"torchfeed.ImageCollate, or one with a `ring` attribute), got {collate_fn!r}"
            )
        super().__init__(dataset, collate_fn=collate_fn, **kwargs)
        self.shared_ring: SharedRing | None = None
        self._ring_capacity = ring_capacity
        self._ring_timeout = ring_timeout

    def _make_ring(self) -> None:
        capacity = self._ring_capacity
        if capacity is None:
            first = [self.dataset[i] for i in range(min(self.batch_size or 1, len(self.dataset)))]
            nbytes = sum(t.numel() * t.element_size() for t in tensors_of(self.collate_fn(first)))
            in_flight = self.num_workers * (self.prefetch_factor or 2) + 4
            capacity = int(nbytes * 1.5 + 4096) * in_flight
        self.shared_ring = SharedRing(capacity, timeout=self._ring_timeout)
        self.collate_fn.ring = self.shared_ring

    def __iter__(self):
        if self.num_workers == 0:
            return super().__iter__()
        if self.shared_ring is None:
            self._make_ring()  # before the workers start: they map it when they do
        ring = self.shared_ring
        ring.reclaim_dead()  # regions of workers lost in an earlier epoch
        start = ring._ring.next_generation()
        it = super().__iter__()  # persistent workers: the previous epoch's leftovers are dropped
        # Batches written for an earlier epoch and never handed out (discarded by the
        # DataLoader's reset, or lost with a dead worker) can never be unpacked: free them.
        # (One iterator per loader at a time, as with persistent workers.)
        ring._ring.reclaim_before(start)
        return _Unpacking(it, ring)


class _Unpacking:
    def __init__(self, it, ring: SharedRing) -> None:
        self._it, self._ring = it, ring

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._it)
        return self._ring.unpack(batch) if isinstance(batch, RingHandle) else batch

    def __len__(self) -> int:
        return len(self._it)


def loader(dataset, *, zero_copy: bool = False, **kwargs: Any) -> DataLoader:
    """A DataLoader; with ``zero_copy=True`` its workers collate straight into a shared,
    page-locked ring (:class:`ZeroCopyLoader`)."""
    if zero_copy:
        return ZeroCopyLoader(dataset, **kwargs)
    collate_fn = kwargs.get("collate_fn")
    if collate_fn is not None and getattr(collate_fn, "ring", None) is not None:
        collate_fn.ring = None
    return DataLoader(dataset, **kwargs)
