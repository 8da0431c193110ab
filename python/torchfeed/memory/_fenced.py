"""Ring memory that carries its own fence: the tensors a ring hands out (a zero-copy batch, a
staged one) are :class:`RingTensor` s, and any op that copies one to a device (``.to(device,
non_blocking=True)``, ``.cuda()``, ``copy_``; a prefetcher, a wrapper, the plain loop every
tutorial writes) queues the ring's fence after that copy on the current stream, so the region is
not handed out again before the copy has run. The rule lives with the memory, not with the code
that made or moved the batch. (torch's own pinned memory does the same with an event per copy;
memory torchfeed registers itself gets none from torch.)

Only page-locked rings hand out RingTensors: a copy from pageable memory has consumed its
source when it returns, so there is nothing to fence (and a CPU-only machine sees plain
tensors)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["FENCED_DEVICE_TYPES", "RingTensor", "fenced", "fences_unpinned"]

# Where a copy can still be reading its source after the op returns (tests add "meta", with the
# extension's manual fences, to check the logic without a GPU).
FENCED_DEVICE_TYPES = {"cuda"}
# Tests: RingTensors from rings that are not page-locked too.
fences_unpinned = False


def _stream_for(device: torch.device) -> Any:
    return torch.cuda.current_stream(device)


class RingTensor(Tensor):
    """A tensor viewing ring memory (see the module's docstring). It behaves as the tensor it
    is; an op's outputs that still view the ring are RingTensors too (a slice, a view), every
    other output is a plain tensor."""

    _torchfeed_ring: Any

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves, _ = tree_flatten((args, kwargs))
        mine = [a for a in leaves if isinstance(a, RingTensor)]
        with torch._C.DisableTorchFunctionSubclass():  # everything below sees plain tensors
            out = func(*args, **kwargs)
            if not mine:
                return out
            outs, _ = tree_flatten(out)
            devices = {
                t.device
                for t in (*leaves, *outs)
                if isinstance(t, Tensor) and t.device.type in FENCED_DEVICE_TYPES
            }
            # a copy to (or from) a device: each ring input is fenced after it, on the stream
            # the copy was queued on (the current one)
            for device in devices:
                stream = _stream_for(device)
                for t in mine:
                    t._torchfeed_ring.record_copies([t], stream)
            rings = list({id(t._torchfeed_ring): t._torchfeed_ring for t in mine}.values())
            return tree_map(lambda x: _rewrapped(x, rings), out)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # saved or sent elsewhere, it is the tensor it holds (the ring stays in this process)
        return self.as_subclass(Tensor).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict) -> Tensor:
        return self.as_subclass(Tensor).clone()


def _rewrapped(x: Any, rings: list[Any]) -> Any:
    if type(x) is Tensor:
        for ring in rings:
            if ring.contains(x):  # still viewing the ring: a slice, a view
                return fenced(x, ring)
    return x


def fenced(t: Tensor, ring: Any) -> Tensor:
    """``t`` (a tensor viewing ``ring``) as a RingTensor when the ring's copies need fences."""
    if not (ring.pinned or fences_unpinned):
        return t
    out = t.as_subclass(RingTensor)
    out._torchfeed_ring = ring
    return out
