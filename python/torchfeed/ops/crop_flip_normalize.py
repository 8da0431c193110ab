"""The crop/flip/resize/normalize op: per-image crop, resize, horizontal flip, scaling to [0, 1]
and normalization of uint8 images, written once as float.

``torch.ops.torchfeed.crop_flip_normalize_out`` (a dense batch) and ``..._list_out`` (images of
any sizes): math in ``csrc/ops/crop_flip_normalize.h``, checks in ``..._args.h``, kernels in
``csrc/ops/cpu/`` and ``csrc/ops/cuda/``. This module is their Python face: the options value
(:class:`ImageOptions`, validated once), the image batch as the ops take it, the per-image
geometry, the functional API (:func:`crop_flip_normalize`, :func:`resize_center_crop_normalize`),
the fake kernels, and the fallback for devices without a kernel (the CPU kernel, then a copy).

The semantics are torchvision's ``resized_crop -> horizontal_flip -> to_dtype(float32,
scale=True) -> normalize``, computed in float in one pass per image, without rounding the resized
image to uint8 in between. torchvision's own uint8 path rounds after the resize, so its results
differ from these by up to 0.5/255/std (plus the error of its fixed-point weights); against
torchvision applied to the image converted to float first, the difference is float rounding
(< 1e-4 after normalization).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor
from torchvision.transforms.v2 import InterpolationMode

from torchfeed._output_buffer import OutputBuffer
from torchfeed.images import Layout, RaggedImages, check_layout
from torchfeed.limits import check_image_pixels
from torchfeed.ops._dispatch import has_kernel, read_kernels, warn_fallback
from torchfeed.ops._image_batch import ImageBatch, check_flips, host_parameter

__all__ = [
    "ImageBatch",
    "ImageOptions",
    "check_flips",
    "crop_flip_normalize",
    "grid_from_boxes",
    "host_parameter",
    "resize_arg",
    "resize_center_crop_grid",
    "resize_center_crop_normalize",
    "run",
    "size_pair",
]

_INTERPOLATION = {
    "nearest": 0,
    "bilinear": 1,
    InterpolationMode.NEAREST: 0,
    InterpolationMode.BILINEAR: 1,
}
_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_KERNEL_OPS = (
    "crop_flip_normalize_out",
    "crop_flip_normalize_list_out",
    "crop_flip_normalize_packed_out",
)


# --- options --------------------------------------------------------------------------------------


def size_pair(size: int | Sequence[int], name: str = "size") -> tuple[int, int]:
    if isinstance(size, bool):
        raise TypeError(f"{name} must be an int or (height, width), got bool")
    if isinstance(size, int):
        size = (size, size)
    try:
        pair = tuple(size)
    except TypeError:
        raise TypeError(f"{name} must be an int or (height, width), got {size!r}") from None
    if len(pair) == 1:
        pair = (pair[0], pair[0])
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise TypeError(f"{name} must be an int or (height, width) of ints, got {size!r}")
    if min(pair) <= 0:
        raise ValueError(f"{name} must be positive, got {pair}")
    # an output is allocated per call: a typo (22400 for 224) must not silently take gigabytes
    check_image_pixels(pair[0], pair[1], f"{name} {pair}")
    return pair[0], pair[1]


def resize_arg(resize: int | Sequence[int]) -> int | list[int]:
    """torchvision's ``resize`` size: an int (the shorter side) or (height, width)."""
    if isinstance(resize, int) and not isinstance(resize, bool):
        if resize <= 0:
            raise ValueError(f"resize must be positive, got {resize}")
        return resize
    return list(size_pair(resize, "resize"))


def _channel_values(name: str, values: Any) -> tuple[float, ...]:
    if isinstance(values, Tensor):
        values = values.tolist()
    if isinstance(values, bool) or not isinstance(values, int | float | Sequence):
        raise TypeError(f"{name} must be a number or a sequence of numbers, got {values!r}")
    seq = [values] if isinstance(values, int | float) else list(values)
    if not seq:
        raise ValueError(f"{name} must have 1 value or one per channel, got none")
    try:
        out = tuple(float(v) for v in seq)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be numbers, got {values!r}") from None
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


@dataclass(frozen=True)
class ImageOptions:
    """How the op normalizes and writes, validated once: per-channel ``mean`` and ``std`` (one
    value for all channels, or one per channel), ``interpolation`` ("bilinear" or "nearest", or
    the InterpolationMode), ``antialias``, the output ``dtype`` (float32, float16 or bfloat16),
    ``channels_last`` output, and the ``image_layout`` of the inputs ("CHW" or "HWC")."""

    mean: Sequence[float] | float
    std: Sequence[float] | float
    interpolation: str | InterpolationMode = "bilinear"
    antialias: bool = True
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    image_layout: Layout = "CHW"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _channel_values("mean", self.mean))
        object.__setattr__(self, "std", _channel_values("std", self.std))
        for c, s in enumerate(self.std):  # type: ignore[arg-type]  # a tuple, after the above
            if s == 0:
                raise ValueError(f"std[{c}] is 0: normalize would divide by zero")
        try:
            _INTERPOLATION[self.interpolation]
        except (KeyError, TypeError):
            raise ValueError(
                f"interpolation must be 'bilinear' or 'nearest' (or the InterpolationMode), got "
                f"{self.interpolation!r}"
            ) from None
        if not isinstance(self.antialias, bool):
            raise TypeError(f"antialias must be a bool, got {type(self.antialias).__name__}")
        if self.dtype not in _OUT_DTYPES:
            raise TypeError(
                f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {self.dtype}"
            )
        if not isinstance(self.channels_last, bool):
            raise TypeError(
                f"channels_last must be a bool, got {type(self.channels_last).__name__}"
            )
        check_layout(self.image_layout)

    @property
    def mode(self) -> int:
        """The op's interpolation code."""
        return _INTERPOLATION[self.interpolation]

    def per_channel(self, channels: int) -> tuple[list[float], list[float]]:
        """mean and std with one value per channel."""
        values = []
        pairs: tuple[tuple[str, Any], ...] = (("mean", self.mean), ("std", self.std))
        for name, seq in pairs:
            if len(seq) == 1:
                seq = seq * channels
            if len(seq) != channels:
                raise ValueError(
                    f"{name} must have 1 or {channels} values (one per channel), got {len(seq)}"
                )
            values.append(list(seq))
        return values[0], values[1]

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format


def grid_from_boxes(
    boxes: Tensor | Sequence[Sequence[float]],
    sizes: Tensor | Sequence[Sequence[int]],
    out_size: tuple[int, int],
) -> Tensor:
    """The ``grid`` the op takes for crop-then-resize (RandomResizedCrop): ``boxes`` ``[B, 4]``
    (top, left, height, width), each inside its image of ``sizes`` (H, W)."""
    if not isinstance(sizes, Tensor):
        sizes = torch.tensor([[int(v) for v in s] for s in sizes], dtype=torch.int64)
    if not isinstance(boxes, Tensor):
        boxes = torch.as_tensor(boxes, dtype=torch.float64)  # floats: never through float32
    return torch.ops.torchfeed.resized_crop_grid(sizes.reshape(-1, 2), boxes, *out_size)


def resize_center_crop_grid(
    sizes: Tensor, resize: int | Sequence[int], crop: tuple[int, int]
) -> Tensor:
    """Resize-then-crop geometry ``[B, 10]``: torchvision's ``resize(size)`` (an int resizes the
    shorter side, keeping the aspect ratio) then ``center_crop(crop)``."""
    rh, rw = (resize, -1) if isinstance(resize, int) else resize
    return torch.ops.torchfeed.resize_center_crop_grid(sizes, rh, rw, crop[0], crop[1])


# --- running the op -------------------------------------------------------------------------------


def run(
    batch: ImageBatch,
    grid: Tensor,
    flips: Tensor,
    out_size: tuple[int, int],
    options: ImageOptions,
    out: Tensor | None = None,
    buffer: OutputBuffer | None = None,
) -> Tensor:
    """Runs the op on a batch with its geometry (``grid`` ``[B, 10]`` float64 and ``flips``
    ``[B]`` bool, on the host), into ``out`` (checked here) or a new (or ``buffer``'s reused)
    output."""
    channels = batch.channels or len(cast(tuple, options.mean))  # validated: a tuple
    mean, std = options.per_channel(channels)
    shape = (len(batch), channels, *out_size)
    device = batch.device
    if out is None:
        if buffer is not None:
            out = buffer.get(shape, options.dtype, device, options.memory_format)
        else:
            out = torch.empty(
                shape, dtype=options.dtype, device=device, memory_format=options.memory_format
            )
    elif (
        not isinstance(out, Tensor)
        or tuple(out.shape) != shape
        or out.dtype not in _OUT_DTYPES
        or out.device != device
    ):
        got = (
            f"{out.dtype} {list(out.shape)} on {out.device}"
            if isinstance(out, Tensor)
            else type(out).__name__
        )
        raise ValueError(
            f"out must be a float32/float16/bfloat16 tensor of shape {list(shape)} on {device}, "
            f"got {got}"
        )
    if len(batch) == 0:
        return out
    if has_kernel("crop_flip_normalize_out", device.type):
        _launch(batch, grid, flips, options.mode, options.antialias, mean, std, out)
        return out
    warn_fallback(
        "crop_flip_normalize", device.type, "computing on the CPU and copying the result back"
    )
    cpu_out = torch.empty_like(out, device="cpu")
    _launch(batch, grid, flips, options.mode, options.antialias, mean, std, cpu_out, cpu=True)
    return out.copy_(cpu_out)


def _launch(batch, grid, flips, mode, antialias, mean, std, out, cpu: bool = False) -> None:
    ops = torch.ops.torchfeed
    if batch.dense is not None:
        dense = batch.dense.cpu() if cpu else batch.dense
        ops.crop_flip_normalize_out(dense, grid, flips, mode, antialias, mean, std, out)
    elif batch.packed is not None:
        data = batch.packed.cpu() if cpu else batch.packed
        ops.crop_flip_normalize_packed_out(
            data, batch.shapes, grid, flips, mode, antialias, mean, std, out, batch.hwc
        )
    else:
        images = [t.cpu() for t in batch.images] if cpu else batch.images
        ops.crop_flip_normalize_list_out(
            images, grid, flips, mode, antialias, mean, std, out, batch.hwc
        )


# --- the functional API ---------------------------------------------------------------------------


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
    batch = ImageBatch(images, image_layout)
    out_size = size_pair(size)
    boxes = host_parameter(boxes, "boxes", batch.device, torch.float64)
    flips = check_flips(flips, len(batch), batch.device)
    if len(batch) == 0:
        if boxes.numel() != 0:
            raise ValueError(f"boxes must have shape [0, 4] for no images, got {list(boxes.shape)}")
        return run(batch, boxes.reshape(0, 10), flips, out_size, options, out)
    grid = torch.ops.torchfeed.resized_crop_grid(batch.sizes(), boxes, *out_size)
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
    batch = ImageBatch(images, image_layout)
    crop_size = size_pair(crop, "crop")
    resize = resize_arg(resize)
    flips = torch.zeros(len(batch), dtype=torch.bool)
    if len(batch) == 0:
        return run(batch, torch.empty(0, 10, dtype=torch.float64), flips, crop_size, options, out)
    grid = resize_center_crop_grid(batch.sizes(), resize, crop_size)
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


@torch.library.register_fake("torchfeed::sample_resized_crop")
def _sample_resized_crop_fake(sizes, scale_lo, scale_hi, ratio_lo, ratio_hi, generator=None):
    return sizes.new_empty((sizes.shape[0], 4), dtype=torch.int64)


read_kernels(*_KERNEL_OPS)
