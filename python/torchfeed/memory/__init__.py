"""Host memory for batches: :class:`PinnedRing` (one page-locked arena of exact-size blocks, in
one process) and :class:`SharedRing` (its cross-process twin that DataLoader workers write
into). A block or region is reused only after every tensor viewing it is gone and every copy
from it recorded with ``record_copies`` has finished."""

from torchfeed.memory.pinned_ring import PinnedRing
from torchfeed.memory.shared_ring import RingHandle, SharedRing

__all__ = ["PinnedRing", "RingHandle", "SharedRing"]
