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
from typing import Any

import torch
from torch import Tensor
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from torchfeed._output_buffer import OutputBuffer
from torchfeed.images import Layout, RaggedImages, check_layout
from torchfeed.ops._dispatch import has_kernel, read_kernels, warn_fallback

__all__ = [
    "ImageBatch",
    "ImageOptions",
    "check_boxes",
    "check_flips",
    "crop_flip_normalize",
    "grid_from_boxes",
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
_KERNEL_OPS = ("crop_flip_normalize_out", "crop_flip_normalize_list_out")


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
    return pair  # type: ignore[return-value]


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

    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str | InterpolationMode = "bilinear"
    antialias: bool = True
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    image_layout: Layout = "CHW"

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _channel_values("mean", self.mean))
        object.__setattr__(self, "std", _channel_values("std", self.std))
        for c, s in enumerate(self.std):
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
        for name, seq in (("mean", self.mean), ("std", self.std)):
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


# --- the batch and its geometry ------------------------------------------------------------------


class ImageBatch:
    """The images of a batch as the ops take them: a dense [B, C, H, W] uint8 tensor (any
    strides) or a list of [C, H_i, W_i] views."""

    def __init__(self, images: Any, image_layout: Layout) -> None:
        check_layout(image_layout)
        self.dense: Tensor | None = None
        self.list: list[Tensor] | None = None
        if isinstance(images, RaggedImages):
            self.list = images.images()
        elif isinstance(images, Tensor):
            if images.dim() != 4:
                raise ValueError(
                    f"images must be a [B, C, H, W] batch ([B, H, W, C] with image_layout='HWC'), "
                    f"a list of images or RaggedImages, got a tensor of shape {list(images.shape)}"
                )
            self.dense = images.as_subclass(Tensor)
            if image_layout == "HWC":
                self.dense = self.dense.permute(0, 3, 1, 2)
        elif isinstance(images, Sequence) and not isinstance(images, str):
            views = []
            for i, im in enumerate(images):
                if not isinstance(im, Tensor):
                    raise TypeError(f"images[{i}] must be a tensor, got {type(im).__name__}")
                if im.dim() != 3:
                    raise ValueError(f"images[{i}] must be 3-D, got shape {list(im.shape)}")
                im = im.as_subclass(Tensor)
                views.append(im.permute(2, 0, 1) if image_layout == "HWC" else im)
            self.list = views
        else:
            raise TypeError(
                "images must be a uint8 tensor batch, a list of uint8 images or RaggedImages, "
                f"got {type(images).__name__}"
            )
        tensors = [self.dense] if self.dense is not None else self.list
        if not tensors and self.list is not None:
            self.device = torch.device("cpu")
            self.channels = 0
            self.sizes = []
            return
        for i, t in enumerate(tensors):
            if t.dtype != torch.uint8:
                where = "images" if self.dense is not None else f"images[{i}]"
                raise TypeError(f"{where} must be uint8, got {t.dtype}")
        self.device = tensors[0].device
        if self.dense is not None:
            self.channels = self.dense.shape[1]
            self.sizes = [tuple(self.dense.shape[2:])] * self.dense.shape[0]
        else:
            self.channels = self.list[0].shape[0]
            self.sizes = [tuple(t.shape[1:]) for t in self.list]
            for i, t in enumerate(self.list):
                if t.shape[0] != self.channels:
                    raise ValueError(
                        f"images[{i}] has {t.shape[0]} channels but images[0] has {self.channels}"
                    )
                if t.device != self.device:
                    raise ValueError(
                        f"images[{i}] is on {t.device} but images[0] is on {self.device}"
                    )
        if not 1 <= self.channels <= 4:
            raise ValueError(f"images must have 1 to 4 channels, got {self.channels}")

    def __len__(self) -> int:
        return len(self.sizes)


def check_boxes(boxes: Any, sizes: Sequence[tuple[int, int]], device: torch.device) -> Tensor:
    """Boxes (top, left, height, width) per image as a float64 CPU tensor, each inside its
    image with a positive size."""
    if isinstance(boxes, Tensor):
        if boxes.device != device:
            raise ValueError(f"boxes are on {boxes.device} but the images are on {device}")
        boxes = boxes.detach().to("cpu", torch.float64)
    else:
        boxes = torch.as_tensor(boxes, dtype=torch.float64)
    if boxes.shape != (len(sizes), 4):
        raise ValueError(
            f"boxes must have shape [{len(sizes)}, 4] (top, left, height, width per image), got "
            f"{list(boxes.shape)}"
        )
    if len(sizes):
        hw = torch.tensor(sizes, dtype=torch.float64)
        top, left, height, width = boxes.unbind(1)
        bad = (
            ~torch.isfinite(boxes).all(1)
            | (height <= 0)
            | (width <= 0)
            | (top < 0)
            | (left < 0)
            | (top + height > hw[:, 0])
            | (left + width > hw[:, 1])
        )
        if bool(bad.any()):
            b = int(bad.nonzero()[0])
            raise ValueError(
                f"boxes[{b}] = {boxes[b].tolist()} (top, left, height, width) must have a positive "
                f"size and lie inside image {b} of size (H, W) = {tuple(sizes[b])}"
            )
    return boxes


def check_flips(flips: Any, batch: int, device: torch.device) -> Tensor:
    if flips is None:
        return torch.zeros(batch, dtype=torch.bool)
    if isinstance(flips, Tensor):
        if flips.device != device:
            raise ValueError(f"flips are on {flips.device} but the images are on {device}")
        flips = flips.detach().cpu()
    else:
        flips = torch.as_tensor(flips)
    if flips.dtype != torch.bool:
        raise TypeError(f"flips must be bool, got {flips.dtype}")
    if flips.shape != (batch,):
        raise ValueError(f"flips must have shape [{batch}], got {list(flips.shape)}")
    return flips


def grid_from_boxes(
    boxes: Tensor, sizes: Sequence[tuple[int, int]], out_size: tuple[int, int]
) -> Tensor:
    """Crop-then-resize geometry (``csrc/ops/crop_flip_normalize.h``, AxisGeom): taps stay
    inside each box, as in torchvision's resized_crop."""
    top, left, height, width = boxes.unbind(1)
    hw = torch.tensor(sizes, dtype=torch.float64).reshape(-1, 2)
    zeros = torch.zeros_like(top)
    y = [
        top,
        height,
        torch.full_like(top, out_size[0]),
        zeros,
        torch.minimum((top + height).ceil(), hw[:, 0]),
    ]
    x = [
        left,
        width,
        torch.full_like(top, out_size[1]),
        zeros,
        torch.minimum((left + width).ceil(), hw[:, 1]),
    ]
    return torch.stack(y + x, dim=1)


def resize_center_crop_grid(
    sizes: Sequence[tuple[int, int]], resize: int | tuple[int, int], crop: tuple[int, int]
) -> Tensor:
    """Resize-then-crop geometry: torchvision's ``resize(size)`` (an int resizes the shorter side,
    keeping the aspect ratio) followed by ``center_crop(crop)``; taps may read the whole image,
    exactly as the resize does before the crop."""
    rows = []
    for h, w in sizes:
        new_h, new_w = TF._geometry._compute_resized_output_size((h, w), size=resize)
        if crop[0] > new_h or crop[1] > new_w:
            raise ValueError(
                f"crop {crop} is larger than image ({h}, {w}) resized to ({new_h}, {new_w})"
            )
        top = round((new_h - crop[0]) / 2.0)  # torchvision: int(round(...))
        left = round((new_w - crop[1]) / 2.0)
        rows.append([0.0, h, new_h, top, h, 0.0, w, new_w, left, w])
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, 10)


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
    """Runs the op on a checked batch with its geometry (``grid`` ``[B, 10]`` float64 and
    ``flips`` ``[B]`` bool, on the host), into ``out`` (checked here) or a new (or ``buffer``'s
    reused) output."""
    channels = batch.channels or len(options.mean)
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
    else:
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a tensor, got {type(out).__name__}")
        if tuple(out.shape) != shape or out.dtype not in _OUT_DTYPES or out.device != device:
            raise ValueError(
                f"out must be a float32/float16/bfloat16 tensor of shape {list(shape)} on "
                f"{device}, got {out.dtype} {list(out.shape)} on {out.device}"
            )
    if len(batch) == 0:
        return out
    if not all(has_kernel(op, device.type) for op in _KERNEL_OPS):
        return _run_on_cpu(batch, grid, flips, options.mode, options.antialias, mean, std, out)
    grid = grid.to(device, non_blocking=True)
    flips = flips.to(device, non_blocking=True)
    if batch.dense is not None:
        torch.ops.torchfeed.crop_flip_normalize_out(
            batch.dense, grid, flips, options.mode, options.antialias, mean, std, out
        )
    else:
        torch.ops.torchfeed.crop_flip_normalize_list_out(
            batch.list, grid, flips, options.mode, options.antialias, mean, std, out
        )
    return out


def _run_on_cpu(batch, grid, flips, mode, antialias, mean, std, out) -> Tensor:
    """Devices without a compiled kernel (MPS, ...): the CPU kernel, then one copy back."""
    warn_fallback(
        "crop_flip_normalize",
        batch.device.type,
        "computing on the CPU and copying the result back",
    )
    cpu_out = torch.empty_like(out, device="cpu")
    if batch.dense is not None:
        torch.ops.torchfeed.crop_flip_normalize_out(
            batch.dense.cpu(), grid, flips, mode, antialias, mean, std, cpu_out
        )
    else:
        torch.ops.torchfeed.crop_flip_normalize_list_out(
            [t.cpu() for t in batch.list], grid, flips, mode, antialias, mean, std, cpu_out
        )
    out.copy_(cpu_out)
    return out


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
    C is 1 to 4. ``boxes`` and ``flips``: host tensors or lists are best; CUDA tensors are read
    back to check them, which synchronizes the device (the transforms draw them on the host and
    never do). Returns ``[B, C, size[0], size[1]]`` of ``dtype`` (float32/16, bfloat16),
    channels_last if asked, or writes into ``out`` and returns it.
    """
    options = ImageOptions(mean, std, interpolation, antialias, dtype, channels_last, image_layout)
    batch = ImageBatch(images, image_layout)
    out_size = size_pair(size)
    boxes = check_boxes(boxes, batch.sizes, batch.device)
    flips = check_flips(flips, len(batch), batch.device)
    grid = grid_from_boxes(boxes, batch.sizes, out_size)
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
    grid = resize_center_crop_grid(batch.sizes, resize_arg(resize), crop_size)
    flips = torch.zeros(len(batch), dtype=torch.bool)
    return run(batch, grid, flips, crop_size, options, out)


@torch.library.register_fake("torchfeed::crop_flip_normalize_out")
def _crop_flip_normalize_out_fake(images, grid, flips, interpolation, antialias, mean, std, out):
    return None


@torch.library.register_fake("torchfeed::crop_flip_normalize_list_out")
def _crop_flip_normalize_list_out_fake(
    images, grid, flips, interpolation, antialias, mean, std, out
):
    return None


read_kernels(*_KERNEL_OPS)
