"""Recycled worker memory: batches that an ordinary DataLoader's workers send through shared memory
they reuse, instead of a fresh shared-memory file per batch.

A tensor a worker returns crosses to the main process in shared memory: torch allocates a new
shared-memory file for it, which the worker faults in page by page, batch after batch. For whole
decoded photos that is over a gigabyte a batch, and on the VM we measured 0.4 s of page faults a
gigabyte in a process alone, up to 3.5 s in busy workers. A recycling collate (ImageCollate's
default) packs its batch into a region of its worker's own :class:`SharedRing` (made by the
worker on its first batch; its memory is allocated as first written, and stays for reuse); when
the DataLoader sends the batch, only the region's handle crosses (with the worker's first
batch, the ring's descriptor too: :class:`RingRef`), and unpickling in the main process gives a
batch viewing the region, which goes back to the worker once those views are freed. No
ZeroCopyLoader is needed, and it never waits: when the ring has no room (the main process keeps
many batches) or a batch is larger than it, the batch takes the ordinary path.

The receiving process keeps its mapping of a worker's ring while that worker lives, so the pages
it has read a batch through stay mapped for the next one. Mapping the ring afresh for every batch
faulted every page in again and tore the mapping down after: about 95 ms a gigabyte of batch in
the main process, on the VM this was measured on. A kept mapping is dropped once its worker has
exited; its memory then goes with the last batch that views it. The check runs at every batch
received and, while any mapping is kept, from a garbage-collector callback: at every full
collection (``gc.collect()``) and at most once a second otherwise, so the mappings of a loader
whose workers have exited go without another batch.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import warnings
from dataclasses import dataclass
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, cast

import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from torchfeed._extension import C
from torchfeed._tree import tensors_of
from torchfeed.memory._budget import memory_budget
from torchfeed.memory._ring_base import own_if_small
from torchfeed.memory._shared_ring import SharedRing, batch_layout, place_batch, view_batch

__all__ = [
    "Lent",
    "RecycledDict",
    "RecycledList",
    "RecycledTuple",
    "RingRef",
    "lend",
    "receive",
    "recycle_batch",
]

# A worker's ring holds this many batches of its first one's size: the batches the DataLoader
# queues from it (prefetch_factor, 2 by default), the one it is writing and the one the training
# loop holds, with room for larger batches. Only what is written is allocated.
RING_BATCHES = 6
# And at least this much, since later batches can be far larger than the first (text padded to
# each batch's longest sequence, a sampler that groups by length); capacity that is never
# written costs nothing.
RING_MIN_BYTES = 64 << 20
# At most this share of the memory the process may use (memory/_budget.py) per worker ring
# (virtual: allocated as written).
RING_MEMORY_SHARE = 4


@dataclass(frozen=True)
class Lent:
    """A region of this worker's ring holding a batch's buffer."""

    ring: SharedRing
    slot: int
    generation: int
    nbytes: int
    address: int

    def hand_over(self) -> bool:
        """Marks the region as sent (the main process releases it); False when it was already."""
        return bool(self.ring._ring.hand_over(self.slot, self.generation))

    def reduce_args(self) -> tuple[RingRef, int, int, int, int]:
        """What crosses the queue: which ring (:class:`RingRef`), the region, and the worker that
        owns the ring."""
        return _ref(self.ring), self.slot, self.generation, self.nbytes, self.ring._owner


@dataclass(frozen=True)
class RingRef:
    """Which worker ring a recycled batch lies in, as it crosses the queue: the memfd's identity
    (device, inode), the number of its descriptor in the worker, and, with the first batch the
    worker sends from it, the descriptor itself (passed as torch passes a storage's). The
    receiver keeps its mapping of the ring while the worker lives, so the batches after the first
    carry no descriptor: passing one opens a connection to the worker's resource sharer, which
    took about 0.3 ms of the receiver's CPU a batch here. A receiver that has no mapping of the
    ring and no descriptor (the first batch went to another process) opens the ring through
    ``/proc/<worker>/fd/<fd>``."""

    dev: int
    ino: int
    fd: int
    dup: Any = None  # a multiprocessing DupFd, with the ring's first batch only


# The rings this process has sent a descriptor of (by identity), and the process they are of (a
# forked child sends its own).
_announced: set[tuple[int, int]] = set()
_announced_pid = -1


def _ref(ring: SharedRing) -> RingRef:
    """The :class:`RingRef` of a batch this process sends from ``ring``: with the descriptor the
    first time."""
    global _announced, _announced_pid
    if _announced_pid != os.getpid():
        _announced, _announced_pid = set(), os.getpid()
    key = ring._identity  # found once per ring, not per batch
    dup = None
    if key not in _announced:
        dup = DupFd(ring._fd)
        _announced.add(key)
    return RingRef(key[0], key[1], ring._fd, dup)


_worker_ring: SharedRing | None = None
_worker_ring_pid = -1  # the process _worker_ring belongs to (a forked child makes its own)
# The largest batch this worker has lent: every region is at least that large. Regions are
# placed first fit, and batches of photos differ in size: a batch larger than the region an
# earlier, smaller one freed would go past it, into memory never written (a worker's fifth
# batch of whole photos took 4.1 s to write there, against 0.1 s into memory written before).
# What a batch does not fill of its region is never written, so costs nothing.
_largest_lent = 0


def _ring_for(nbytes: int) -> SharedRing | None:
    """This worker's ring, made on its first batch (sized from it); None where none can be made
    (no memfd: not Linux), after a one-time warning when making it failed."""
    global _worker_ring, _worker_ring_pid, _largest_lent
    if _worker_ring_pid != os.getpid():
        _worker_ring, _worker_ring_pid, _largest_lent = None, os.getpid(), 0
        if not hasattr(os, "memfd_create"):
            return None
        most = memory_budget().share(RING_MEMORY_SHARE)
        wanted = max(max(nbytes, 1) * RING_BATCHES + 4096 * RING_BATCHES, RING_MIN_BYTES)
        capacity = min(wanted, most)
        try:
            # pinned=False: a worker never touches the GPU; lend never waits, so no timeout
            _worker_ring = SharedRing(capacity, pinned=False, timeout=None)
        except (OSError, RuntimeError, ValueError) as e:
            warnings.warn(
                f"ImageCollate(recycle=True): this worker cannot make its shared memory ({e}); "
                "its batches take the ordinary path",
                RuntimeWarning,
                stacklevel=4,
            )
    return _worker_ring


def lend(nbytes: int) -> tuple[Tensor, Lent] | None:
    """Inside a DataLoader worker: a uint8 buffer of ``nbytes`` in the worker's ring, and its
    :class:`Lent` record; None outside a worker, or when the ring has no room now. The region
    returns to the ring when the buffer is freed without having been sent."""
    if get_worker_info() is None:
        return None
    global _largest_lent
    ring = _ring_for(nbytes)
    if ring is None:
        return None
    buf, slot, generation = ring._ring.lend(max(nbytes, _largest_lent))
    if buf is None and nbytes < _largest_lent:  # no room for that: the batch's own size
        buf, slot, generation = ring._ring.lend(nbytes)
    if buf is None:
        return None
    _largest_lent = max(_largest_lent, nbytes)
    return buf[:nbytes], Lent(ring, slot, generation, nbytes, buf.data_ptr())


class _Mappings:
    """The receiving process's mappings of worker rings, by the memfd's identity (device, inode),
    each with the pid of the worker that owns it. A kept mapping also keeps its file, so no other
    ring can take its inode while it is here."""

    CHECK_EVERY = 1.0  # seconds between the garbage-collector callback's checks

    def __init__(self) -> None:
        self.rings: dict[tuple[int, int], tuple[Any, int]] = {}
        self.lock = threading.Lock()
        self.checked = 0.0

    def ring(self, ref: RingRef, owner: int) -> Any:
        key = (ref.dev, ref.ino)
        with self.lock:
            self._drop_exited()
            kept = self.rings.get(key)
            if kept is not None and kept[1] == owner:
                if ref.dup is not None:  # taken all the same: the worker's sharer lets it go
                    os.close(ref.dup.detach())
                return kept[0]
            local = self._open(ref, owner)
            try:
                st = os.fstat(local)
                if (st.st_dev, st.st_ino) != key:
                    raise RuntimeError(
                        f"a recycled batch from DataLoader worker {owner}: its descriptor {ref.fd} "
                        "is no longer the shared memory the batch was written to"
                    )
                ring = C._SharedRing.attach(local)
            finally:
                os.close(local)  # the mapping stays
            if C.process_alive(owner):  # else not kept: it lives as long as the batches viewing it
                if not self.rings:
                    gc.callbacks.append(self._collected)
                self.rings[key] = (ring, owner)
            return ring

    @staticmethod
    def _open(ref: RingRef, owner: int) -> int:
        """A descriptor of the ring in this process: the one the batch carries, else the worker's
        own through /proc."""
        if ref.dup is not None:
            return int(ref.dup.detach())
        try:
            return os.open(f"/proc/{owner}/fd/{ref.fd}", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise RuntimeError(
                f"a recycled batch from DataLoader worker {owner}: this process has no mapping of "
                f"the worker's shared memory (its first batch went to another process) and "
                f"cannot open it through /proc ({e}); collate with recycle=False"
            ) from None

    def _drop_exited(self) -> None:
        self.checked = time.monotonic()
        for key in [k for k, (_, owner) in self.rings.items() if not C.process_alive(owner)]:
            del self.rings[key]
        if not self.rings and self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        # A full collection checks at once: gc.collect() after a loader is dropped (its workers
        # joined by then) lets their memory go now, not a second later in whatever runs next
        # (the next pipeline of `torchfeed bench --large` started its first epoch with the last
        # one's 2.8 GB of worker rings still mapped: 11.8 s against 7.4 s)
        if phase != "stop":
            return
        if info.get("generation") != 2 and time.monotonic() - self.checked < self.CHECK_EVERY:
            return
        if self.lock.acquire(blocking=False):  # a collection inside ring(): it checks anyway
            try:
                self._drop_exited()
            finally:
                self.lock.release()

    def forget(self) -> None:
        """In a forked child: the parent's mappings are not this process's to keep."""
        if self._collected in gc.callbacks:
            gc.callbacks.remove(self._collected)
        self.rings = {}
        self.lock = threading.Lock()


_mappings = _Mappings()
os.register_at_fork(after_in_child=_mappings.forget)


def receive(ref: RingRef, slot: int, generation: int, nbytes: int, owner: int) -> Tensor:
    """In the receiving process: a uint8 tensor viewing the region of the ring that worker
    ``owner`` sent; the region goes back to the worker's ring once it and every view of it are
    freed."""
    return _mappings.ring(ref, owner).view(slot, generation, nbytes)


def _items(batch: Any) -> list[tuple[Any, Any]]:
    """(key, value) of each field of a batch: a dict's items, a sequence's positions."""
    return list(batch.items()) if isinstance(batch, dict) else list(enumerate(batch))


class _Recycled:
    """What a recycled batch carries in the worker: the region it lies in, where each tensor lies
    in it (``_tree``: the batch with each tensor replaced by its place), and its fields as
    collated, to tell a batch changed after collating. It pickles and copies as ``_plain``, the
    type it was collated as."""

    _plain: type
    _lent: Lent
    _tree: Any
    _collated: list[tuple[Any, Any]]

    def unchanged(self) -> bool:
        collated = getattr(self, "_collated", None)  # None: made from one (namedtuple._replace)
        now = _items(self)
        return (
            collated is not None
            and len(now) == len(collated)
            and all(k == j and v is w for (k, v), (j, w) in zip(now, collated, strict=True))
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickle, copy: the ordinary type
        plain = self._plain
        if _is_named(plain):
            return plain, tuple(cast(tuple, self))  # a namedtuple takes its fields one by one
        return plain, (plain(self),)


class RecycledDict(_Recycled, dict):
    """A collate's dict batch with its tensors in this worker's recycled memory. In the worker it
    is the batch; crossing the DataLoader's queue it is the region's handle and where each
    tensor lies in it, and it arrives as a plain dict whose tensors view the region. A batch
    changed after collating (a field added, removed or replaced) crosses as an ordinary dict."""

    _plain = dict


class RecycledList(_Recycled, list):
    """A list batch in recycled memory (as :class:`RecycledDict`); it arrives as a plain list,
    and crosses as an ordinary one when an element was added, removed or replaced."""

    _plain = list


class RecycledTuple(_Recycled, tuple):
    """A tuple batch in recycled memory (as :class:`RecycledDict`); it arrives as a plain
    tuple."""

    _plain = tuple


def _is_named(kind: type) -> bool:
    return issubclass(kind, tuple) and hasattr(kind, "_fields")


# the recycled type of each type a batch can cross recycled as (exactly these, so that what
# arrives is the type that left); a namedtuple type's is made on its first batch
_recycled_types: dict[type, type] = {
    dict: RecycledDict,
    list: RecycledList,
    tuple: RecycledTuple,
}


def _recycled_type(kind: type) -> type | None:
    """The recycled subclass of a batch's type: a dict, list, tuple or namedtuple; else None."""
    sub = _recycled_types.get(kind)
    if sub is None and _is_named(kind):
        sub = type(f"Recycled{kind.__name__}", (_Recycled, kind), {"_plain": kind})
        ForkingPickler.register(sub, _reduce_for_queue)
        _recycled_types[kind] = sub
    return sub


def recycle_batch(batch: Any) -> Any:
    """``batch`` (a dict, list, tuple or namedtuple) with its tensors copied into this worker's
    recycled memory, as a recycled subclass of its type that the DataLoader's queue sends as the
    region's handle; ``batch`` itself outside a worker, when it is of another type, holds no
    tensor or a tensor that could not arrive as it left, or when the ring has no room now."""
    recycled = _recycled_type(type(batch))
    if recycled is None or not all(
        t.device.type == "cpu" and t.layout == torch.strided and not t.requires_grad
        for t in tensors_of(batch)
    ):
        return batch  # only ordinary CPU tensors arrive as they left
    layout, total = batch_layout(batch)
    lent = lend(total) if total > 0 else None
    if lent is None:
        return batch
    buf, record = lent
    tree = place_batch(batch, buf, layout)
    viewed = view_batch(tree, buf)
    out = recycled(*viewed) if _is_named(type(batch)) else recycled(viewed)
    out._lent, out._tree, out._collated = record, tree, _items(out)
    return out


def _reduce_for_queue(batch: _Recycled) -> tuple[Any, ...]:
    if batch.unchanged() and batch._lent.hand_over():
        return _received, (*batch._lent.reduce_args(), batch._tree)
    return batch.__reduce__()  # the ordinary type's


def _own_if_small(t: Tensor) -> Tensor:
    own = own_if_small(t)
    return t if own is None else own


def _received(ref: RingRef, slot: int, generation: int, nbytes: int, owner: int, tree: Any) -> Any:
    return view_batch(tree, receive(ref, slot, generation, nbytes, owner), _own_if_small)


for _kind in _recycled_types.values():
    ForkingPickler.register(_kind, _reduce_for_queue)
