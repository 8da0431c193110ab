"""Recycled worker memory: batches that an ordinary DataLoader's workers send through shared memory
they reuse, instead of a fresh shared-memory file per batch.

A tensor a worker returns crosses to the main process in shared memory: torch allocates a new
shared-memory file for it, which the worker faults in page by page, batch after batch. For whole
decoded photos that is over a gigabyte a batch, and on the VM we measured 0.4 s of page faults a
gigabyte in a process alone, up to 3.5 s in busy workers. A recycling collate (ImageCollate's
default) packs its batch into a region of its worker's own :class:`SharedRing` (made by the
worker on its first batch; its memory is allocated as first written, and stays for reuse); when
the DataLoader sends the batch, only the region's handle and the ring's descriptor cross, and
unpickling in the main process gives a batch viewing the region, which goes back to the worker
once those views are freed. No ZeroCopyLoader is needed, and it never waits: when the ring has no
room (the main process keeps many batches) or a batch is larger than it, the batch takes the
ordinary path.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from multiprocessing.reduction import DupFd
from typing import Any

from torch import Tensor
from torch.utils.data import get_worker_info

from torchfeed._extension import C, physical_memory
from torchfeed.memory._shared_ring import SharedRing

__all__ = ["Lent", "lend", "receive"]

# A worker's ring holds this many batches of its first one's size: the batches the DataLoader
# queues from it (prefetch_factor, 2 by default), the one it is writing and the one the training
# loop holds, with room for larger batches. Only what is written is allocated.
RING_BATCHES = 6
# At most this share of the machine's memory per worker ring (virtual: allocated as written).
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

    def reduce_args(self) -> tuple[Any, int, int, int]:
        """What crosses the queue: the ring's descriptor (passed as torch passes a storage's) and
        the region."""
        return DupFd(self.ring._fd), self.slot, self.generation, self.nbytes


_worker_ring: SharedRing | None = None
_worker_ring_pid = -1  # the process _worker_ring belongs to (a forked child makes its own)


def _ring_for(nbytes: int) -> SharedRing | None:
    """This worker's ring, made on its first batch (sized from it); None where none can be made
    (no memfd: not Linux), after a one-time warning when making it failed."""
    global _worker_ring, _worker_ring_pid
    if _worker_ring_pid != os.getpid():
        _worker_ring, _worker_ring_pid = None, os.getpid()
        if not hasattr(os, "memfd_create"):
            return None
        most = physical_memory() // RING_MEMORY_SHARE
        capacity = min(max(nbytes, 1) * RING_BATCHES + 4096 * RING_BATCHES, most)
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
    ring = _ring_for(nbytes)
    if ring is None:
        return None
    buf, slot, generation = ring._ring.lend(nbytes)
    if buf is None:
        return None
    return buf, Lent(ring, slot, generation, nbytes, buf.data_ptr())


def receive(fd: Any, slot: int, generation: int, nbytes: int) -> Tensor:
    """In the receiving process: a uint8 tensor viewing the region; the region goes back to the
    worker's ring once it and every view of it are freed."""
    local = fd.detach()
    try:
        ring = C._SharedRing.attach(local)  # the mapping lives as long as the tensor
    finally:
        os.close(local)
    return ring.view(slot, generation, nbytes)
