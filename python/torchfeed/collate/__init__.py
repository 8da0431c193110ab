"""``collate_fn`` s for the DataLoader: :class:`PadCollate` (ragged sequences padded in one pass,
with every other field collated as ``default_collate`` would) and :class:`ImageCollate` (images of
any size into one :class:`~torchfeed.RaggedImages` buffer). Both are ring-aware: bound to a
:class:`~torchfeed.memory.SharedRing` (``with_shared_ring``, which
:class:`~torchfeed.ZeroCopyLoader` does), they collate straight into it inside the workers."""

from torchfeed.collate._image import ImageCollate
from torchfeed.collate._pad import PadCollate

__all__ = ["ImageCollate", "PadCollate"]
