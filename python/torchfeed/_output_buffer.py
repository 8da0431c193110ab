"""Reusing the memory of outputs that nothing refers to any more (the batch transforms' CPU
outputs)."""

from __future__ import annotations

import sys

import torch
from torch import Tensor

__all__ = ["OutputBuffer"]


def _storage_uses(t: Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class OutputBuffer:
    """Reuses the memory of earlier outputs that nothing refers to any more.

    A fresh float32 batch of 64x3x224x224 is 38.5 MB, above glibc's mmap threshold, so each new
    one costs page faults (about 9 ms here). A loop like ``for b in loader: x = t(b)`` still holds
    the previous output while the next is made, so a few buffers take turns. Reuse is decided
    from reference counts: while the caller holds an output, or any view of it, its buffer is
    not touched, so nobody's tensor is ever overwritten. CUDA outputs come from PyTorch's caching
    allocator, which already reuses memory in stream order, so they are always allocated."""

    def __init__(self, slots: int = 3) -> None:
        self._slots = slots
        self._bufs: list[Tensor] = []

    def get(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        device: torch.device,
        memory_format: torch.memory_format,
    ) -> Tensor:
        if device.type != "cpu" or torch.utils.data.get_worker_info() is not None:
            # In a DataLoader worker the batch goes to the main process through shared memory:
            # the main process still reads it when the worker's references are all gone.
            return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
        for buf in self._bufs:
            # References to buf here: the list, the loop variable and getrefcount's argument;
            # uses of its storage: the tensor and the temporary storage handle. Anything more
            # is the caller's.
            if (
                buf.shape == shape
                and buf.dtype == dtype
                and buf.is_contiguous(memory_format=memory_format)
                and sys.getrefcount(buf) <= 3
                and _storage_uses(buf) <= 2
            ):
                return buf
        buf = torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
        self._bufs = [*self._bufs[-(self._slots - 1) :], buf]
        return buf
