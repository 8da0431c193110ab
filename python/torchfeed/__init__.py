"""torchfeed: keeps accelerators fed.

Fused pad-and-mask collation for ragged sequences, fused per-image augmentation on uint8
batches, a pinned host-buffer ring and a device prefetcher, behind the standard PyTorch data
hooks. The names a pipeline uses most are here; each has one home module besides:

- text: :func:`pad`, :func:`pad_packed`, :class:`Padded` (:mod:`torchfeed.ops.pad`),
  :class:`RaggedBatch` (:mod:`torchfeed.ragged`), :class:`PadCollate`
  (:mod:`torchfeed.collate`);
- images: the transforms and :func:`fuse` (:mod:`torchfeed.transforms`), their functional forms
  :func:`crop_flip_normalize` and :func:`resize_center_crop_normalize`
  (:mod:`torchfeed.ops.crop_flip_normalize`), :class:`RaggedImages` (:mod:`torchfeed.images`),
  :class:`ImageCollate` (:mod:`torchfeed.collate`); decoding in :mod:`torchfeed.decode`;
- loading: :func:`loader`, :class:`ResumableLoader`, :class:`ZeroCopyLoader`
  (:mod:`torchfeed.loaders`), :class:`DefaultCollate` (:mod:`torchfeed.collate`: the batches of
  per-sample transforms), :class:`DevicePrefetcher` (:mod:`torchfeed.prefetch`),
  :class:`PinnedRing` (:mod:`torchfeed.memory`); production practices in :mod:`torchfeed.data`.
"""

import importlib
from typing import TYPE_CHECKING, Any

from torchfeed._extension import C as _C
from torchfeed._extension import build_info
from torchfeed.collate import DefaultCollate, ImageCollate, PadCollate
from torchfeed.images import RaggedImages
from torchfeed.loaders import ResumableLoader, ZeroCopyLoader, loader
from torchfeed.memory import PinnedRing
from torchfeed.ops.crop_flip_normalize import crop_flip_normalize, resize_center_crop_normalize
from torchfeed.ops.pad import Padded, pad, pad_packed
from torchfeed.prefetch import DevicePrefetcher
from torchfeed.ragged import RaggedBatch

if TYPE_CHECKING:
    from torchfeed import decode as decode
    from torchfeed import sampling as sampling
    from torchfeed import transforms as transforms
    from torchfeed.transforms import (
        RandomResizedCropFlipNormalize,
        ResizeCenterCropNormalize,
        ResizeRandomFlipNormalize,
        fuse,
    )

__version__ = _C.build_info()["version"]

# The transforms subclass torchvision's v2.Transform, and importing torchvision takes longer than
# the rest of torchfeed together (1.7 s here: torchvision.models imports torch._dynamo). A text
# pipeline never needs it, and every spawned DataLoader worker imports torchfeed again, so these
# names import torchfeed.transforms (and torchvision) when first asked for, as do the submodules
# that import torchvision (`torchfeed.decode.read_file` works after a bare `import torchfeed`).
_TRANSFORMS = (
    "RandomResizedCropFlipNormalize",
    "ResizeCenterCropNormalize",
    "ResizeRandomFlipNormalize",
    "fuse",
)
_SUBMODULES = ("decode", "sampling", "transforms")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"torchfeed.{name}")
    if name in _TRANSFORMS:
        return getattr(importlib.import_module("torchfeed.transforms"), name)
    raise AttributeError(f"module 'torchfeed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, *_TRANSFORMS})


__all__ = [
    "DefaultCollate",
    "DevicePrefetcher",
    "ImageCollate",
    "PadCollate",
    "Padded",
    "PinnedRing",
    "RaggedBatch",
    "RaggedImages",
    "RandomResizedCropFlipNormalize",
    "ResizeCenterCropNormalize",
    "ResizeRandomFlipNormalize",
    "ResumableLoader",
    "ZeroCopyLoader",
    "__version__",
    "build_info",
    "crop_flip_normalize",
    "fuse",
    "loader",
    "pad",
    "pad_packed",
    "resize_center_crop_normalize",
]
