"""Fused image transforms in torchvision v2's form: crop, resize, flip, conversion to float and
normalization in one pass of the op (:mod:`torchfeed.ops.crop_flip_normalize`), with random
parameters drawn per image, on whatever a v2 transform takes (a PIL image, one image tensor, a
batch, a list of images, a nested sample whose targets follow their image).

- :class:`RandomResizedCropFlipNormalize`: the training pipeline;
- :class:`ResizeCenterCropNormalize`: the evaluation pipeline;
- :class:`ResizeRandomFlipNormalize`: resize and flip for crops decoded in the workers;
- :func:`fuse`: your own torchvision pipeline, with the runs of steps the op does exactly fused
  (:class:`FusedSteps`), the other steps left as they were.
"""

from torchfeed.transforms._classes import (
    RandomResizedCropFlipNormalize,
    ResizeCenterCropNormalize,
    ResizeRandomFlipNormalize,
)
from torchfeed.transforms._fuse import FusedSteps, fuse

__all__ = [
    "FusedSteps",
    "RandomResizedCropFlipNormalize",
    "ResizeCenterCropNormalize",
    "ResizeRandomFlipNormalize",
    "fuse",
]
