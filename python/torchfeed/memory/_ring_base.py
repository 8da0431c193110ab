"""What the two rings share on the Python side (:class:`RingBase`): their facts, telling their
tensors from others, and fencing their memory after copies (the C++ side shares the fence
machinery, ``csrc/memory/fence.h``: host functions queued after the copies)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "DEFAULT",
    "SMALL_FIELD_BYTES",
    "RingBase",
    "check_timeout",
    "own_if_small",
    "timeout_arg",
]

DEFAULT: Any = object()  # a method's timeout when not given: the ring's own


# Tensors of a batch this small are copied out of its ring region on arrival (zero-copy and
# recycled batches alike), so that one kept past its batch holds none of the batch's memory: a
# view would keep the whole region, the images beside it, from going back to the ring. The
# labels an evaluation loop collects, or those a prefetcher's CPU transform passes through while
# the images become its own output, would otherwise hold a region each: with whole photos, 1.4 GB
# of ring per 500-byte label tensor.
SMALL_FIELD_BYTES = 64 << 10


def own_if_small(t: Tensor, pinned: bool = False) -> Tensor | None:
    """A copy of ``t`` in memory of its own (page-locked when ``pinned``, as the region was, so
    the batch stays all page-locked) when it is at most :data:`SMALL_FIELD_BYTES`; else None."""
    if t.nbytes > SMALL_FIELD_BYTES:
        return None
    if not pinned:
        return t.clone()
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)


def check_timeout(timeout: float | None, name: str = "timeout") -> float | None:
    """A wait's limit: a finite number of seconds > 0, or None to wait without limit (and then
    truly wait: a full ring's producer sleeps until space is freed)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise TypeError(f"{name} must be a number of seconds or None, got {type(timeout).__name__}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"{name} must be > 0 seconds and finite, or None to wait without limit; got {timeout}"
        )
    return float(timeout)


def timeout_arg(timeout: float | None) -> float:
    """The C++ side's form: seconds, or -1 for no limit."""
    return -1.0 if timeout is None else timeout


class RingBase:
    """What both rings have: their facts (capacity, pinned, which tensors are theirs), the
    timeouts of their waits, and the fences of their memory after copies (``self._ring``: their
    C++ object)."""

    _ring: Any
    timeout: float | None

    def _wait(self, timeout: Any) -> float:
        """A method's ``timeout`` (DEFAULT: the ring's) in the C++ side's form."""
        return timeout_arg(self.timeout if timeout is DEFAULT else check_timeout(timeout))

    @property
    def capacity(self) -> int:
        return self._ring.capacity

    @property
    def pinned(self) -> bool:
        """Whether the memory is page-locked (copies from it are true DMA)."""
        return self._ring.pinned

    def contains(self, t: Tensor) -> bool:
        """Whether ``t`` views this ring's memory."""
        start = self._ring.data_address
        return t.device.type == "cpu" and start <= t.data_ptr() < start + self._ring.capacity

    def record_copies(self, tensors: Sequence[Tensor], stream: torch.cuda.Stream) -> int:
        """Fences every block (region) that one of ``tensors`` views, once however many of its
        tensors are listed: it is not reused before the work now queued on ``stream`` (their
        copies) has finished. Tensors outside the ring are ignored. Returns how many were
        fenced."""
        mine = [t for t in tensors if self.contains(t)]
        if not mine:
            return 0
        return self._ring.record_many(mine, stream.cuda_stream, stream.device.index)
