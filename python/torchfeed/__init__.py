"""torchfeed: keeps accelerators fed.

Fused pad-and-mask collation for ragged sequences, fused per-image augmentation on uint8
batches, a pinned host-buffer ring and a device prefetcher, behind the standard PyTorch data
hooks.
"""

from torchfeed import _extension

_C = _extension.load()

from torchfeed._build import build_info  # noqa: E402
from torchfeed.collate import PadCollate  # noqa: E402
from torchfeed.images import ImageCollate, RaggedImages  # noqa: E402
from torchfeed.io import DecodeRandomCrop, decode_window  # noqa: E402 (registers the fake kernel)
from torchfeed.padding import Padded, pad, pad_packed  # noqa: E402
from torchfeed.prefetch import DevicePrefetcher  # noqa: E402
from torchfeed.ragged import RaggedBatch  # noqa: E402
from torchfeed.ring import PinnedRing  # noqa: E402
from torchfeed.shared import SharedRing, ZeroCopyLoader, loader  # noqa: E402
from torchfeed.transforms import (  # noqa: E402
    crop_flip_normalize,
    resize_center_crop_normalize,
)

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
