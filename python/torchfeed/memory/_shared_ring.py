"""Zero-copy batches: DataLoader workers collate straight into a shared (and, on a GPU machine,
page-locked) ring that the main process created, and send a small handle instead of tensors.

Usual path: a worker's collate output becomes one fresh shared-memory file per tensor (file
creation, descriptor passing, page faults on new pages); then the main process's pin thread
copies it into pinned memory. Here the worker writes its batch once, into memory that stays
mapped in every process and is already registered with the CUDA runtime.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from torchfeed._extension import C
from torchfeed._tree import Lazy, carve, field_layout, map_tensors, nbytes
from torchfeed.memory._fenced import fenced
from torchfeed.memory._ring_base import DEFAULT, RingBase, check_timeout, own_if_small

__all__ = ["RingHandle", "SharedRing"]


@dataclass(frozen=True)
class _Spec:
    """A tensor of a packed batch: where it is in the region and what it looks like (stored
    contiguously as ``shape``, then ``permute``d)."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    permute: tuple[int, ...] | None = None


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


class SharedRing(RingBase):
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
        timeout: float | None = 30.0,
        pinned: bool | None = None,
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity must be a positive int (bytes), got {capacity!r}")
        timeout = check_timeout(timeout)
        if not hasattr(os, "memfd_create"):
            raise OSError("SharedRing needs Linux (os.memfd_create)")
        self.timeout = timeout
        self._owner = os.getpid()
        # the C++ object maps the memfd and unmaps it when the last tensor viewing it is gone
        self._fd = os.memfd_create("torchfeed-shared-ring", os.MFD_CLOEXEC)
        self._ring = C._SharedRing.create(self._fd, capacity, alignment)
        if pinned is not False:
            registered = self._ring.register_pinned()
            if pinned and not registered:
                raise ValueError("SharedRing: pinned=True needs a usable CUDA GPU")
        self._warned_oversize = False
        self._populated = 0

    def __reduce__(self):
        return (_attach, (self._owner, self._fd, self.timeout, self._populated))

    @classmethod
    def _attached(
        cls, owner: int, fd: int, timeout: float | None, populated: int = 0
    ) -> SharedRing:
        self = object.__new__(cls)
        self.timeout = timeout
        self._owner = owner
        self._fd = fd
        # the owner's memfd, by its /proc path: works for spawned children, with no name to leak
        local = os.open(f"/proc/{owner}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
        try:
            self._ring = C._SharedRing.attach(local)
        finally:
            os.close(local)  # the mapping stays
        self._warned_oversize = False
        self._populated = 0
        if populated:
            self.populate(populated)  # the part the owner made resident: mapped here too
        return self

    def populate(self, nbytes: int) -> int:
        """Makes the first ``nbytes`` of the ring resident and mapped, now, in this process and
        in the workers that attach afterwards. Memory is otherwise allocated page by page as
        batches first touch it (regions are placed first fit from the start, so a ring uses
        about its high-water mark, however large its capacity): populate what the batches in
        flight will use, and the first epoch does not fault it in under load. Returns the bytes
        populated (whole pages, at most the capacity)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"populate: nbytes must be an int >= 0 (bytes), got {nbytes!r}")
        self._populated = max(self._populated, self._ring.populate(nbytes))
        return self._populated

    @functools.cached_property
    def _identity(self) -> tuple[int, int]:
        """(device, inode) of the memfd: which ring this is, in any process that maps it."""
        st = os.fstat(self._fd)
        return st.st_dev, st.st_ino

    def stats(self) -> dict[str, int]:
        """capacity, bytes_in_use, regions_in_workers (being written or in transit),
        regions_in_consumer, allocations, waits, reclaimed, high_water."""
        return dict(self._ring.stats())

    def reclaim_dead(self) -> int:
        """Frees the regions of workers that died holding them; returns how many."""
        return self._ring.reclaim_dead()

    def next_generation(self) -> int:
        """The generation the next region will get (regions are numbered as acquired)."""
        return self._ring.next_generation()

    def reclaim_before(self, generation: int) -> int:
        """Frees regions still with the workers (written or in transit) that were acquired
        before ``generation``: batches of an epoch that will never be unpacked."""
        return self._ring.reclaim_before(generation)

    def pack(self, batch: Any, timeout: float | None = DEFAULT) -> RingHandle | Any:
        """Writes every tensor of ``batch`` (and every :class:`Lazy` one) into one region and
        returns its handle. A batch larger than the whole ring is returned as an ordinary batch,
        with a one-time warning."""
        layout, total = batch_layout(batch)
        try:
            slot, generation, offset = self._ring.acquire(total, self._wait(timeout))
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
            tree = place_batch(batch, self._ring.region(offset, total), layout)
        except BaseException:
            self._ring.abandon(slot, generation)
            raise
        return RingHandle(slot, generation, total, tree)

    def unpack(self, handle: RingHandle) -> Any:
        """The batch of a handle, as tensors viewing the region, which is released when they are
        all freed and every copy queued from them has finished (page-locked, they are
        RingTensors: any copy to a device fences the region after it). Tensors of at most
        ``SMALL_FIELD_BYTES`` (64 KiB: labels, lengths) arrive as copies of their own, page-locked
        too where the ring is, so that one kept past its batch does not keep the region."""
        region = self._ring.view(handle.slot, handle.generation, handle.nbytes)
        pinned = self.pinned

        def arrive(t: Tensor) -> Tensor:
            own = own_if_small(t, pinned)
            return fenced(t, self) if own is None else own

        return view_batch(handle.tree, region, arrive)

    def __del__(self) -> None:
        # The memory itself (unregistered, then unmapped) goes with the last tensor viewing it.
        if getattr(self, "_owner", None) == os.getpid() and getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)
            self._fd = -1


def batch_layout(batch: Any) -> tuple[dict[int, int], int]:
    """Where each tensor (or :class:`Lazy` one) of ``batch`` goes in one region, and its size."""
    leaves: list[Any] = []
    map_tensors(batch, leaves.append, _is_leaf)
    return field_layout(leaves)


def place_batch(batch: Any, region: Tensor, layout: dict[int, int]) -> Any:
    """Writes every tensor of ``batch`` into ``region`` where ``layout`` puts it; returns the
    batch with each tensor replaced by its :class:`_Spec`."""

    def place(leaf: Any) -> _Spec:
        start, size = layout[id(leaf)], nbytes(leaf)
        view = carve(region, start, size, leaf.dtype, leaf.shape)
        if isinstance(leaf, Lazy):
            leaf.fill(view if leaf.permute is None else view.permute(*leaf.permute))
            return _Spec(start, size, leaf.dtype, leaf.shape, leaf.permute)
        view.copy_(leaf)
        return _Spec(start, size, leaf.dtype, tuple(leaf.shape))

    return map_tensors(batch, place, _is_leaf)


def view_batch(tree: Any, region: Tensor, wrap: Any = None) -> Any:
    """The batch of a :func:`place_batch` tree, as tensors viewing ``region`` (each passed
    through ``wrap``, when given)."""

    def view(spec: _Spec) -> Tensor:
        t = carve(region, spec.offset, spec.nbytes, spec.dtype, spec.shape)
        t = t if spec.permute is None else t.permute(*spec.permute)
        return t if wrap is None else wrap(t)

    return map_tensors(tree, view, lambda x: isinstance(x, _Spec))


def _attach(owner: int, fd: int, timeout: float | None, populated: int = 0) -> SharedRing:
    return SharedRing._attached(owner, fd, timeout, populated)


def _materialize(leaf: Any) -> Tensor:
    return leaf.make() if isinstance(leaf, Lazy) else leaf
