"""Host memory for batches: :class:`PinnedRing` (one page-locked arena of exact-size blocks, in
one process) and :class:`SharedRing` (its cross-process twin that DataLoader workers write into;
:class:`~torchfeed.ZeroCopyLoader` makes one, and its ``shared_ring`` says how it is used). A
block or region is reused only after every tensor viewing it is gone and every copy from it
has finished: page-locked, they hand out :class:`RingTensor` s, whose copies to a device fence
their memory after them, whoever queues the copy."""

from torchfeed.memory._fenced import RingTensor
from torchfeed.memory._pinned_ring import PinnedRing
from torchfeed.memory._shared_ring import SharedRing

__all__ = ["PinnedRing", "RingTensor", "SharedRing"]
