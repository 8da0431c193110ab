"""What a torchfeed transform is given, told apart the way torchvision v2 tells it (plus batches,
which v2 does not draw per image): a batch (a ``[B, C, H, W]`` tensor, a list of images,
``RaggedImages``, optionally with per-image targets), one image (a PIL image, a ``[C, H, W]``
tensor, a ``tv_tensors.Image``, a ``[H, W, C]`` uint8 numpy array), or a nested sample whose
images and targets are found by v2's rules; and the conversion of an image to what the op reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import PIL.Image
import torch
from torch import Tensor
from torchvision import tv_tensors

from torchfeed.images import RaggedImages

__all__ = ["TARGETS", "is_batch", "is_encoded", "is_image", "split_batch"]

# The tv_tensors that follow their image's geometry (KeyPoints: torchvision 0.23 and later).
TARGETS: tuple[type, ...] = tuple(
    t
    for t in (
        tv_tensors.BoundingBoxes,
        tv_tensors.Mask,
        getattr(tv_tensors, "KeyPoints", None),
    )
    if t is not None
)


def is_image(obj: Any) -> bool:
    """One image as v2 would transform it: a PIL image, a ``tv_tensors.Image`` or a pure 3-D
    tensor (``[C, H, W]``, or ``[H, W, C]`` with the HWC layout), or a 3-D uint8 numpy array."""
    if isinstance(obj, PIL.Image.Image):
        return True
    if isinstance(obj, Tensor):
        return obj.dim() == 3 and (type(obj) is Tensor or isinstance(obj, tv_tensors.Image))
    return isinstance(obj, np.ndarray) and obj.ndim == 3


def is_encoded(obj: Any) -> bool:
    """An encoded image file (what a loader returning the file's bytes gives): ``bytes``,
    ``bytearray``, ``memoryview``, or a 1-D uint8 tensor or numpy array (an image is never
    1-D)."""
    if isinstance(obj, bytes | bytearray | memoryview):
        return True
    if isinstance(obj, Tensor):
        return type(obj) is Tensor and obj.dim() == 1 and obj.dtype == torch.uint8
    return isinstance(obj, np.ndarray) and obj.ndim == 1 and obj.dtype == np.uint8


def is_batch(obj: Any) -> bool:
    """A batch the fused op draws per image: ``RaggedImages``, a 4-D tensor (``[B, C, H, W]``,
    a ``tv_tensors.Image`` too), or a non-empty list or tuple of images."""
    if isinstance(obj, RaggedImages):
        return True
    if isinstance(obj, Tensor):
        return obj.dim() == 4 and (type(obj) is Tensor or isinstance(obj, tv_tensors.Image))
    return isinstance(obj, list | tuple) and len(obj) > 0 and all(is_image(x) for x in obj)


def split_batch(sample: Any) -> tuple[Any, Sequence[Any] | None] | None:
    """``(images, targets)`` of a batch input (``targets[b]`` image b's, or None), or None when
    ``sample`` is not a batch (one image, or a nested sample)."""
    if is_batch(sample):
        return sample, None
    if (
        isinstance(sample, tuple)
        and len(sample) == 2
        and is_batch(sample[0])
        and isinstance(sample[1], list | tuple)
        and not is_image(sample[0])
    ):
        return sample[0], sample[1]
    return None
