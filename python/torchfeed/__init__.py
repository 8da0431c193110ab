"""torchfeed: keeps accelerators fed.

Fused pad-and-mask collation for ragged sequences, fused per-image augmentation on uint8
batches, a pinned host-buffer ring and a device prefetcher, behind the standard PyTorch data
hooks.

Layout: :mod:`torchfeed.ops` (one module per compiled op), the batch types
(:mod:`torchfeed.ragged`, :mod:`torchfeed.images`), and the features built on them:
:mod:`torchfeed.collate`, :mod:`torchfeed.transforms`, :mod:`torchfeed.io`,
:mod:`torchfeed.memory`, :mod:`torchfeed.loader`, :mod:`torchfeed.prefetch`,
:mod:`torchfeed.data`.
"""

from torchfeed._extension import C as _C
from torchfeed._extension import build_info
from torchfeed.collate import ImageCollate, PadCollate
from torchfeed.images import RaggedImages
from torchfeed.io import DecodeRandomCrop, decode_window
from torchfeed.loader import ResumableLoader, ZeroCopyLoader, loader
from torchfeed.memory import PinnedRing, SharedRing
from torchfeed.ops.crop_flip_normalize import crop_flip_normalize, resize_center_crop_normalize
from torchfeed.ops.pad import Padded, pad, pad_packed
from torchfeed.prefetch import DevicePrefetcher
from torchfeed.ragged import RaggedBatch

__version__ = _C.build_info()["version"]

__all__ = [
    "DecodeRandomCrop",
    "DevicePrefetcher",
    "ImageCollate",
    "PadCollate",
    "Padded",
    "PinnedRing",
    "RaggedBatch",
    "RaggedImages",
    "ResumableLoader",
    "SharedRing",
    "ZeroCopyLoader",
    "__version__",
    "build_info",
    "crop_flip_normalize",
    "decode_window",
    "loader",
    "pad",
    "pad_packed",
    "resize_center_crop_normalize",
]
