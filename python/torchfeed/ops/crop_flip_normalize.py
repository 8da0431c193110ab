"""The crop/flip/resize/normalize op: per-image crop, resize, horizontal flip, scaling to [0, 1]
and normalization of uint8 images, written once as float.

``torch.ops.torchfeed.crop_flip_normalize_out`` (a dense batch) and ``..._list_out`` (images of
any sizes): math in ``csrc/ops/crop_flip_normalize.h``, checks in ``..._args.h``, kernels in
``csrc/ops/cpu/`` and ``csrc/ops/cuda/``. This module is their Python face: the functional API
(:func:`crop_flip_normalize`, :func:`resize_center_crop_normalize`) and the fake kernels (the
options, the images as the op takes them, the geometry and the fallback for devices without a
kernel are in :mod:`torchfeed.ops._image_op`).

The semantics are torchvision's ``resized_crop -> horizontal_flip -> to_dtype(float32,
scale=True) -> normalize``, computed in float in one pass per image, without rounding the resized
image to uint8 in between. torchvision's own uint8 path rounds after the resize, so its results
differ from these by up to 0.5/255/std (plus the error of its fixed-point weights); against
torchvision applied to the image converted to float first, the difference is float rounding
(< 1e-4 after normalization).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from torchfeed._packing import Layout
from torchfeed.images import RaggedImages
from torchfeed.ops._dispatch import read_kernels
from torchfeed.ops._image_op import (
    KERNEL_OPS,
    ImageOptions,
    OpImages,
    check_flips,
    host_parameter,
    resize_arg,
    resize_center_crop_grid,
    run,
    size_pair,
)

if TYPE_CHECKING:  # torchvision is imported where a transform needs it, not by `import torchfeed`
    from torchvision.transforms.v2 import InterpolationMode

__all__ = ["crop_flip_normalize", "resize_center_crop_normalize"]


def crop_flip_normalize(
    images: Tensor | Sequence[Tensor] | RaggedImages,
    boxes: Tensor | Sequence[Sequence[float]],
    flips: Tensor | Sequence[bool] | None,
    size: int | Sequence[int],
    *,
    mean: Sequence[float],
    std: Sequence[float],
    interpolation: str | InterpolationMode = "bilinear",
    antialias: bool = True,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    image_layout: Layout = "CHW",
    out: Tensor | None = None,
) -> Tensor:
    """Crops ``boxes[b]`` = (top, left, height, width) (floats allowed) out of uint8 image b,
    resizes it to ``size`` (bilinear, antialiased when downscaling if ``antialias``, or
    nearest), flips it horizontally where ``flips[b]``, scales to [0, 1] and normalizes with
    ``mean``/``std`` per channel: torchvision's ``resized_crop``, ``horizontal_flip``,
    ``to_dtype(scale=True)`` and ``normalize``, in one pass.

    ``images``: a uint8 ``[B, C, H, W]`` tensor (``[B, H, W, C]`` with ``image_layout="HWC"``),
    a list of images of any sizes (``[C, H, W]``, or ``[H, W, C]``), or :class:`RaggedImages`;
    C is 1 to 4. ``boxes`` and ``flips``: lists or host tensors, the fast way (the geometry is
    planned and checked on the host and sent with the launch; nothing synchronizes the device).
    Tensors on the images' device are accepted too, but reading them back costs a device
    synchronization per call (the transforms draw on the host and never do).

    Returns ``[B, C, size[0], size[1]]`` of ``dtype`` (float32/16, bfloat16), channels_last if
    asked, or writes into ``out`` and returns it.
    """
    options = ImageOptions(mean, std, interpolation, antialias, dtype, channels_last, image_layout)
    batch = OpImages(images, options.image_layout == "HWC")
    out_size = size_pair(size)
    boxes = host_parameter(boxes, "boxes", batch.device, torch.float64)
    flips = check_flips(flips, len(batch), batch.device)
    if len(batch) == 0:
        if boxes.numel() != 0:
            raise ValueError(f"boxes must have shape [0, 4] for no images, got {list(boxes.shape)}")
        return run(batch, boxes.reshape(0, 10), flips, out_size, options, out)
    grid = torch.ops.torchfeed.resized_crop_grid(batch.size_table(), boxes, *out_size)
    return run(batch, grid, flips, out_size, options, out)


def resize_center_crop_normalize(
    images: Tensor | Sequence[Tensor] | RaggedImages,
    resize: int | Sequence[int],
    crop: int | Sequence[int],
    *,
    mean: Sequence[float],
    std: Sequence[float],
    interpolation: str | InterpolationMode = "bilinear",
    antialias: bool = True,
    dtype: torch.dtype = torch.float32,
    channels_last: bool = False,
    image_layout: Layout = "CHW",
    out: Tensor | None = None,
) -> Tensor:
    """The evaluation transform: torchvision's ``resize(resize)`` (an int sets the shorter side)
    then ``center_crop(crop)`` then ``to_dtype(scale=True)`` and ``normalize``, computed as one
    resampling per image, only for the pixels the crop keeps."""
    options = ImageOptions(mean, std, interpolation, antialias, dtype, channels_last, image_layout)
    batch = OpImages(images, options.image_layout == "HWC")
    crop_size = size_pair(crop, "crop")
    resize = resize_arg(resize)
    flips = torch.zeros(len(batch), dtype=torch.bool)
    if len(batch) == 0:
        return run(batch, torch.empty(0, 10, dtype=torch.float64), flips, crop_size, options, out)
    grid = resize_center_crop_grid(batch.size_table(), resize, crop_size)
    return run(batch, grid, flips, crop_size, options, out)


@torch.library.register_fake("torchfeed::crop_flip_normalize_out")
def _crop_flip_normalize_out_fake(images, grid, flips, interpolation, antialias, mean, std, out):
    return None


@torch.library.register_fake("torchfeed::crop_flip_normalize_list_out")
def _crop_flip_normalize_list_out_fake(
    images, grid, flips, interpolation, antialias, mean, std, out, images_hwc=False
):
    return None


@torch.library.register_fake("torchfeed::crop_flip_normalize_packed_out")
def _crop_flip_normalize_packed_out_fake(
    data, shapes, grid, flips, interpolation, antialias, mean, std, out, images_hwc=False
):
    return None


@torch.library.register_fake("torchfeed::image_sizes")
def _image_sizes_fake(images, images_hwc=False):
    return torch.empty(len(images), 2, dtype=torch.int64, device="cpu")


@torch.library.register_fake("torchfeed::resized_crop_grid")
def _resized_crop_grid_fake(sizes, boxes, out_h, out_w):
    return sizes.new_empty((sizes.shape[0], 10), dtype=torch.float64)


@torch.library.register_fake("torchfeed::resize_center_crop_grid")
def _resize_center_crop_grid_fake(sizes, resize_h, resize_w, crop_h, crop_w):
    return sizes.new_empty((sizes.shape[0], 10), dtype=torch.float64)


@torch.library.register_fake("torchfeed::sample_crops_and_flips")
def _sample_crops_and_flips_fake(
    sizes, scale_lo, scale_hi, ratio_lo, ratio_hi, p_flip, generator=None, uniforms=None
):
    batch = sizes.shape[0]
    return sizes.new_empty((batch, 4), dtype=torch.int64), sizes.new_empty(
        (batch,), dtype=torch.bool
    )


@torch.library.register_fake("torchfeed::sample_resized_crop")
def _sample_resized_crop_fake(
    sizes, scale_lo, scale_hi, ratio_lo, ratio_hi, generator=None, uniforms=None
):
    return sizes.new_empty((sizes.shape[0], 4), dtype=torch.int64)


@torch.library.register_fake("torchfeed::sample_uniforms")
def _sample_uniforms_fake(keys, base, stream, count):
    return keys.new_empty((keys.shape[0], count), dtype=torch.float64)


read_kernels(*KERNEL_OPS)
