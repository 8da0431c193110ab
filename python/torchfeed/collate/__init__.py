"""``collate_fn`` s for the DataLoader: :class:`PadCollate` (ragged sequences padded in one pass,
with every other field collated as ``default_collate`` would), :class:`ImageCollate` (images of
any size into one :class:`~torchfeed.RaggedImages` buffer) and :class:`DefaultCollate`
(``default_collate``'s batches, for samples a per-sample transform already made). In an
ordinary DataLoader's workers each writes its batches into shared memory the worker reuses. All
three are ring-aware: bound to a :class:`~torchfeed.memory.SharedRing` (``with_shared_ring``,
which :class:`~torchfeed.ZeroCopyLoader` does), they collate straight into it inside the
workers."""

from torchfeed.collate._default import DefaultCollate
from torchfeed.collate._image import ImageCollate
from torchfeed.collate._pad import PadCollate

__all__ = ["DefaultCollate", "ImageCollate", "PadCollate"]
