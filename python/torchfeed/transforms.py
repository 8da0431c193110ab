"""Fused per-image crop / flip / resize / normalize on uint8 batches, as functions and as
torchvision v2 transforms.

The semantics are torchvision's ``resized_crop -> horizontal_flip -> to_dtype(float32,
scale=True) -> normalize``, computed in float in one pass per image, without rounding the resized
image to uint8 in between. torchvision's own uint8 path rounds after the resize, so its results
differ from these by up to 0.5/255/std (plus the error of its fixed-point weights); against
torchvision applied to the image converted to float first, the difference is float rounding
(< 1e-4 after normalization).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from torchfeed.images import Layout, RaggedImages, check_layout

_INTERPOLATION = {
    "nearest": 0,
    "bilinear": 1,
    InterpolationMode.NEAREST: 0,
    InterpolationMode.BILINEAR: 1,
}
_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# --- argument checks ------------------------------------------------------------------------------


def _size_pair(size: int | Sequence[int], name: str = "size") -> tuple[int, int]:
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


def _interpolation(interpolation: str | InterpolationMode) -> int:
    try:
        return _INTERPOLATION[interpolation]
    except (KeyError, TypeError):
        raise ValueError(
            f"interpolation must be 'bilinear' or 'nearest' (or the InterpolationMode), got "
            f"{interpolation!r}"
        ) from None


def _mean_std(mean: Sequence[float], std: Sequence[float], channels: int) -> tuple[list, list]:
    values = []
    for name, seq in (("mean", mean), ("std", std)):
        if isinstance(seq, Tensor):
            seq = seq.tolist()
        if isinstance(seq, int | float):
            seq = [seq]
        seq = [float(v) for v in seq]
        if len(seq) == 1:
            seq = seq * channels
        if len(seq) != channels:
            raise ValueError(
                f"{name} must have 1 or {channels} values (one per channel), got {len(seq)}"
            )
        values.append(seq)
    for c, s in enumerate(values[1]):
        if s == 0:
            raise ValueError(f"std[{c}] is 0: normalize would divide by zero")
    return values[0], values[1]


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in _OUT_DTYPES:
        raise TypeError(
            f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype}"
        )
    return dtype


class _Batch:
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


def _check_boxes(boxes: Any, sizes: Sequence[tuple[int, int]], device: torch.device) -> Tensor:
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


def _check_flips(flips: Any, batch: int, device: torch.device) -> Tensor:
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


# --- output buffers -------------------------------------------------------------------------------


def _storage_uses(t: Tensor) -> int:
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class OutputBuffer:
    """Reuses the memory of earlier outputs that nothing refers to any more.

    A fresh float32 batch of 64x3x224x224 is 38.5 MB, above glibc's mmap threshold, so each new
    one costs page faults (about 9 ms here). A loop like ``for b in loader: x = t(b)`` still holds
    the previous output while the next is made, so a few buffers take turns. Reuse is decided
    from reference counts: while the caller holds an output, or any view of it, its buffer is
    not touched, so nobody's tensor is ever overwritten. CUDA outputs come from PyTorch's caching
    allocator, which already reuses memory in stream order, so they are always allocated."""

    def __init__(self, slots: int = 3) -> None:
        self._slots = slots
        self._bufs: list[Tensor] = []

    def get(self, shape, dtype, device, memory_format) -> Tensor:
        if device.type != "cpu" or torch.utils.data.get_worker_info() is not None:
            # In a DataLoader worker the batch goes to the main process through shared memory:
            # the main process still reads it when the worker's references are all gone.
            return torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
        for buf in self._bufs:
            # References to buf here: the list, the loop variable and getrefcount's argument;
            # uses of its storage: the tensor and the temporary storage handle. Anything more
            # is the caller's.
            if (
                buf.shape == shape
                and buf.dtype == dtype
                and buf.is_contiguous(memory_format=memory_format)
                and sys.getrefcount(buf) <= 3
                and _storage_uses(buf) <= 2
            ):
                return buf
        buf = torch.empty(shape, dtype=dtype, device=device, memory_format=memory_format)
        self._bufs = [*self._bufs[-(self._slots - 1) :], buf]
        return buf


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
    C is 1 to 4. ``boxes`` and ``flips`` live on the images' device (CUDA ones are read back to
    check them, which synchronizes; the transforms draw them on the host and never do).
    Returns ``[B, C, size[0], size[1]]`` of ``dtype`` (float32/16, bfloat16), channels_last if
    asked, or writes into ``out`` and returns it.
    """
    batch = _Batch(images, image_layout)
    out_size = _size_pair(size)
    mode = _interpolation(interpolation)
    mean_c, std_c = _mean_std(mean, std, max(batch.channels, 1))
    boxes = _check_boxes(boxes, batch.sizes, batch.device)
    flips = _check_flips(flips, len(batch), batch.device)
    grid = grid_from_boxes(boxes, batch.sizes, out_size)
    return _launch(
        batch, grid, flips, out_size, mode, antialias, mean_c, std_c, dtype, channels_last, out
    )


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
    batch = _Batch(images, image_layout)
    crop_size = _size_pair(crop, "crop")
    resize_arg = _resize_arg(resize)
    mode = _interpolation(interpolation)
    mean_c, std_c = _mean_std(mean, std, max(batch.channels, 1))
    grid = resize_center_crop_grid(batch.sizes, resize_arg, crop_size)
    flips = torch.zeros(len(batch), dtype=torch.bool)
    return _launch(
        batch, grid, flips, crop_size, mode, antialias, mean_c, std_c, dtype, channels_last, out
    )


def _resize_arg(resize: int | Sequence[int]) -> int | list[int]:
    if isinstance(resize, int) and not isinstance(resize, bool):
        if resize <= 0:
            raise ValueError(f"resize must be positive, got {resize}")
        return resize
    return list(_size_pair(resize, "resize"))


def _launch(
    batch,
    grid,
    flips,
    out_size,
    mode,
    antialias,
    mean,
    std,
    dtype,
    channels_last,
    out,
    buffer: OutputBuffer | None = None,
) -> Tensor:
    dtype = _out_dtype(dtype)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    shape = (len(batch), max(batch.channels, 1), *out_size)
    if out is None:
        if buffer is not None:
            out = buffer.get(shape, dtype, batch.device, memory_format)
        else:
            out = torch.empty(shape, dtype=dtype, device=batch.device, memory_format=memory_format)
    else:
        if not isinstance(out, Tensor):
            raise TypeError(f"out must be a tensor, got {type(out).__name__}")
        if tuple(out.shape) != shape or out.dtype not in _OUT_DTYPES or out.device != batch.device:
            raise ValueError(
                f"out must be a float32/float16/bfloat16 tensor of shape {list(shape)} on "
                f"{batch.device}, got {out.dtype} {list(out.shape)} on {out.device}"
            )
    if len(batch) == 0:
        return out
    device = batch.device
    if device.type not in ("cpu", "cuda") or not _has_kernel(device.type):
        return _launch_on_cpu(batch, grid, flips, mode, antialias, mean, std, out)
    grid = grid.to(device, non_blocking=True)
    flips = flips.to(device, non_blocking=True)
    if batch.dense is not None:
        torch.ops.torchfeed.crop_flip_normalize_out(
            batch.dense, grid, flips, mode, antialias, mean, std, out
        )
    else:
        torch.ops.torchfeed.crop_flip_normalize_list_out(
            batch.list, grid, flips, mode, antialias, mean, std, out
        )
    return out


def _has_kernel(device_type: str) -> bool:
    return _KERNELS.get(device_type, False)


_warned_fallback: set[str] = set()


def _launch_on_cpu(batch, grid, flips, mode, antialias, mean, std, out) -> Tensor:
    """Devices without a compiled kernel (MPS, ...): the CPU kernel, then one copy back."""
    device = batch.device
    if device.type not in _warned_fallback:
        _warned_fallback.add(device.type)
        import warnings

        warnings.warn(
            f"torchfeed.crop_flip_normalize: no compiled kernel for {device.type}; computing on "
            "the CPU and copying the result back",
            RuntimeWarning,
            stacklevel=4,
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


# --- random parameters ----------------------------------------------------------------------------


def _sizes_list(sizes: Any) -> list[tuple[int, int]]:
    if isinstance(sizes, Tensor):
        sizes = sizes.tolist()
    out = []
    for i, s in enumerate(sizes):
        h, w = (int(v) for v in s)
        if h <= 0 or w <= 0:
            raise ValueError(f"sizes[{i}] must be positive (H, W), got {tuple(s)}")
        out.append((h, w))
    return out


def _check_range(name: str, value: Sequence[float], positive: bool) -> tuple[float, float]:
    lo, hi = (float(v) for v in value)
    if lo > hi:
        raise ValueError(f"{name} must be (min, max) with min <= max, got {tuple(value)}")
    if positive and lo <= 0:
        raise ValueError(f"{name} values must be > 0, got {tuple(value)}")
    return lo, hi


def sample_resized_crop_params(
    sizes: Sequence[tuple[int, int]] | Tensor,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """Per image, torchvision's ``RandomResizedCrop.get_params``: up to 10 attempts at an area
    fraction uniform in ``scale`` and an aspect ratio log-uniform in ``ratio``, the first that
    fits placed uniformly, else the central crop of the nearest allowed ratio. Vectorized over
    the batch; draws from ``generator`` (the global generator if None). Returns int64
    ``[B, 4]`` boxes (top, left, height, width)."""
    hw = torch.tensor(_sizes_list(sizes), dtype=torch.float64).reshape(-1, 2)
    s0, s1 = _check_range("scale", scale, positive=False)
    r0, r1 = _check_range("ratio", ratio, positive=True)
    batch = hw.shape[0]
    height, width = hw[:, 0:1], hw[:, 1:2]
    area = height * width
    u = torch.rand(batch, 10, 2, dtype=torch.float64, generator=generator)
    target_area = area * (s0 + (s1 - s0) * u[..., 0])
    log_ratio = math.log(r0) + (math.log(r1) - math.log(r0)) * u[..., 1]
    aspect = torch.exp(log_ratio)
    # round() is Python's half-to-even, as torch.round is
    w = torch.round(torch.sqrt(target_area * aspect))
    h = torch.round(torch.sqrt(target_area / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    found = fits.any(dim=1)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    w = w.gather(1, first).squeeze(1)
    h = h.gather(1, first).squeeze(1)
    place = torch.rand(batch, 2, dtype=torch.float64, generator=generator)
    height, width = height.squeeze(1), width.squeeze(1)
    top = torch.floor(place[:, 0] * (height - h + 1))
    left = torch.floor(place[:, 1] * (width - w + 1))
    if not bool(found.all()):
        # torchvision's fallback: the central crop, at the nearest allowed aspect ratio
        in_ratio = width / height
        fw = torch.where(
            in_ratio < r0, width, torch.where(in_ratio > r1, torch.round(height * r1), width)
        )
        fh = torch.where(in_ratio < r0, torch.round(width / r0), height)
        ft = torch.div(height - fh, 2, rounding_mode="floor")
        fl = torch.div(width - fw, 2, rounding_mode="floor")
        w, h = torch.where(found, w, fw), torch.where(found, h, fh)
        top, left = torch.where(found, top, ft), torch.where(found, left, fl)
    return torch.stack([top, left, h, w], dim=1).to(torch.int64)


def resized_crop_box(
    height: int,
    width: int,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    generator: torch.Generator | None = None,
) -> tuple[int, int, int, int]:
    """:func:`sample_resized_crop_params` for ONE image of ``height`` x ``width``, in plain Python
    (a few microseconds instead of ~100: for drawing per sample in a worker). It draws the same
    numbers in the same order, so the same generator state gives the same box. Returns
    ``(top, left, height, width)``."""
    if height < 1 or width < 1:
        raise ValueError(f"the image must be at least 1 x 1, got {height} x {width}")
    s0, s1 = _check_range("scale", scale, positive=False)
    r0, r1 = _check_range("ratio", ratio, positive=True)
    u = torch.rand(22, dtype=torch.float64, generator=generator).tolist()
    area = float(height * width)
    log_r0, log_r1 = math.log(r0), math.log(r1)
    for i in range(10):
        target_area = area * (s0 + (s1 - s0) * u[2 * i])
        aspect = math.exp(log_r0 + (log_r1 - log_r0) * u[2 * i + 1])
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = math.floor(u[20] * (height - h + 1))
            left = math.floor(u[21] * (width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < r0:
        w, h = width, round(width / r0)
    elif in_ratio > r1:
        w, h = round(height * r1), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def _check_p_flip(p: float) -> float:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p_flip must be in [0, 1], got {p}")
    return float(p)


def _check_generator(generator: Any) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def sample_flips(batch: int, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Per image, flip with probability ``p`` (torchvision: ``torch.rand(1) < p``)."""
    p = _check_p_flip(p)
    return torch.rand(batch, generator=generator) < p


# --- torchvision v2 transforms --------------------------------------------------------------------


class _BatchTransform(v2.Transform):
    """Shared by the batch transforms: splits the input into images and per-image targets, runs
    the fused kernel once for the batch, and applies each image's geometry to its targets.

    Its keyword arguments are every batch transform's options, defined here once: ``mean`` and
    ``std`` (required, per channel or one for all), ``interpolation`` ("bilinear" or
    "nearest"), ``antialias``, the output ``dtype`` (float32, float16 or bfloat16),
    ``channels_last``, ``image_layout`` of dense inputs ("CHW" or "HWC") and ``return_params``."""

    def __init__(
        self,
        *,
        mean: Sequence[float],
        std: Sequence[float],
        interpolation: str | InterpolationMode = "bilinear",
        antialias: bool = True,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        image_layout: Layout = "CHW",
        return_params: bool = False,
    ) -> None:
        super().__init__()
        self.mean = [float(v) for v in (mean if isinstance(mean, Sequence) else [mean])]
        self.std = [float(v) for v in (std if isinstance(std, Sequence) else [std])]
        for c, s in enumerate(self.std):
            if s == 0:
                raise ValueError(f"std[{c}] is 0: normalize would divide by zero")
        self.interpolation = interpolation
        self._mode = _interpolation(interpolation)
        self.antialias = bool(antialias)
        self.dtype = _out_dtype(dtype)
        self.channels_last = bool(channels_last)
        check_layout(image_layout)
        self.image_layout = image_layout
        self.return_params = bool(return_params)
        self._buffer = OutputBuffer()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffer"] = OutputBuffer()  # a pickled transform carries no output batch
        return state

    def output_shape(self, batch_size: int, channels: int) -> tuple[int, ...]:
        return (batch_size, channels, *self._out_size())

    def apply(self, images: Any, out: Tensor | None = None) -> tuple[Tensor, dict, _Batch]:
        """Transforms a batch of images (into ``out`` if given); returns the output, the drawn
        parameters and the batch as the ops saw it."""
        batch = _Batch(images, self.image_layout)
        grid, flips, params = self._geometry(batch)
        mean, std = _mean_std(self.mean, self.std, max(batch.channels, 1))
        out = _launch(
            batch,
            grid,
            flips,
            self._out_size(),
            self._mode,
            self.antialias,
            mean,
            std,
            self.dtype,
            self.channels_last,
            out,
            self._buffer,
        )
        return out, params, batch

    def forward(self, *inputs: Any) -> Any:
        sample = inputs if len(inputs) > 1 else inputs[0]
        images, targets = _split(sample)
        out, params, batch = self.apply(images)
        if isinstance(images, tv_tensors.Image) or (
            isinstance(images, Sequence) and images and isinstance(images[0], tv_tensors.Image)
        ):
            out = tv_tensors.Image(out)
        result: Any = out
        if targets is not None:
            result = (out, self._transform_targets(targets, batch, params))
        if self.return_params:
            return result, params
        return result

    def _transform_targets(self, targets: Any, batch: _Batch, params: dict) -> list:
        if not isinstance(targets, Sequence) or len(targets) != len(batch):
            raise ValueError(
                f"targets must be a list with one entry per image ({len(batch)}), got "
                f"{type(targets).__name__}"
                + (f" of length {len(targets)}" if isinstance(targets, Sequence) else "")
            )
        return [
            _map_leaves(t, lambda leaf, b=b: self._transform_leaf(leaf, b, params))
            for b, t in enumerate(targets)
        ]


def _is_image_batch(obj: Any) -> bool:
    if isinstance(obj, RaggedImages):
        return True
    if isinstance(obj, Tensor):
        return obj.dim() == 4
    return (
        isinstance(obj, list | tuple)
        and len(obj) > 0
        and all(isinstance(t, Tensor) and t.dim() == 3 for t in obj)
    )


def _split(sample: Any) -> tuple[Any, Any]:
    """(images, per-image targets or None): ``images`` alone, or ``(images, targets)``."""
    if (
        isinstance(sample, tuple)
        and len(sample) == 2
        and _is_image_batch(sample[0])
        and isinstance(sample[1], list | tuple)
        and not _is_image_batch(sample)
    ):
        return sample[0], sample[1]
    return sample, None


def _map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(obj, tv_tensors.BoundingBoxes | tv_tensors.Mask):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_leaves(v, fn) for k, v in obj.items()}
    if isinstance(obj, list | tuple) and not isinstance(obj, Tensor):
        return type(obj)(_map_leaves(v, fn) for v in obj)
    return obj


class RandomResizedCropFlipNormalize(_BatchTransform):
    """torchvision's ``RandomResizedCrop(size, scale, ratio) -> RandomHorizontalFlip(p_flip) ->
    ToDtype(dtype, scale=True) -> Normalize(mean, std)`` for a whole BATCH, with parameters drawn
    per image (torchvision's v2 draws one set for a whole batch tensor), in one fused pass.

    Input: a uint8 ``[B, C, H, W]`` tensor or ``tv_tensors.Image`` (``[B, H, W, C]`` with
    ``image_layout="HWC"``), a list of images of any sizes, or :class:`RaggedImages`; optionally
    as ``(images, targets)`` where ``targets[b]`` holds image b's ``tv_tensors.BoundingBoxes``
    and ``tv_tensors.Mask`` (alone, or in dicts/lists), which get image b's crop, resize and flip.
    Output: ``[B, C, size, size]`` of ``dtype`` (and the targets; and the drawn parameters
    ``{"boxes": [B, 4] (top, left, height, width), "flips": [B]}`` with ``return_params=True``).
    Works on CPU and GPU tensors; draws from ``generator`` on the host (else from torch's global
    generator). Keyword ``options``: ``mean`` and ``std`` (required), ``interpolation``
    ("bilinear" or "nearest"; default bilinear), ``antialias`` (True), output ``dtype`` (float32,
    float16 or bfloat16; float32), ``channels_last`` (False), ``image_layout`` of dense inputs
    ("CHW" or "HWC"; CHW), ``return_params`` (False).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        p_flip: float = 0.5,
        *,
        generator: torch.Generator | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.size = _size_pair(size)
        self.scale = _check_range("scale", scale, positive=False)
        self.ratio = _check_range("ratio", ratio, positive=True)
        self.p_flip = _check_p_flip(p_flip)
        self.generator = _check_generator(generator)

    def _out_size(self) -> tuple[int, int]:
        return self.size

    def make_params(self, flat_inputs: list[Any]) -> dict[str, Any]:
        sizes = [tuple(TF.get_size(i)) for i in flat_inputs]
        boxes = sample_resized_crop_params(sizes, self.scale, self.ratio, self.generator)
        return {"boxes": boxes, "flips": sample_flips(len(sizes), self.p_flip, self.generator)}

    def _geometry(self, batch: _Batch):
        boxes = sample_resized_crop_params(batch.sizes, self.scale, self.ratio, self.generator)
        flips = sample_flips(len(batch), self.p_flip, self.generator)
        grid = grid_from_boxes(boxes.to(torch.float64), batch.sizes, self.size)
        return grid, flips, {"boxes": boxes, "flips": flips}

    def _transform_leaf(self, leaf: Any, b: int, params: dict) -> Any:
        return _crop_resize_flip(self, leaf, params["boxes"][b].tolist(), params["flips"][b])


def _crop_resize_flip(t: _BatchTransform, leaf: Any, box: list[int], flip: Tensor) -> Any:
    """A target (boxes, mask) through the crop, resize and flip its image got."""
    top, left, height, width = box
    out = TF.resized_crop(
        leaf,
        top,
        left,
        height,
        width,
        size=list(t.size),
        interpolation=InterpolationMode.NEAREST
        if isinstance(leaf, tv_tensors.Mask)
        else t.interpolation,
        antialias=t.antialias,
    )
    return TF.horizontal_flip(out) if bool(flip) else out


class ResizeFlipNormalize(_BatchTransform):
    """``Resize((size, size)) -> RandomHorizontalFlip(p_flip) -> ToDtype(dtype, scale=True) ->
    Normalize(mean, std)`` for a whole batch, in one fused pass: each WHOLE image is resized to
    ``size`` (no aspect ratio kept), flipped with probability ``p_flip`` (drawn per image, from
    ``generator`` or torch's global generator).

    This is the second half of :class:`RandomResizedCropFlipNormalize` for images that are
    already crops, such as the windows :class:`torchfeed.io.DecodeRandomCrop` decodes in the
    workers: crop-window decoding followed by this transform gives exactly what
    RandomResizedCropFlipNormalize gives on the full images with the same boxes. Same keyword
    ``options``, inputs and outputs as RandomResizedCropFlipNormalize (targets get the resize and
    the flip; the drawn parameters are ``{"flips": [B]}``)."""

    def __init__(
        self,
        size: int | Sequence[int],
        p_flip: float = 0.5,
        *,
        generator: torch.Generator | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.size = _size_pair(size)
        self.p_flip = _check_p_flip(p_flip)
        self.generator = _check_generator(generator)

    def _out_size(self) -> tuple[int, int]:
        return self.size

    def _geometry(self, batch: _Batch):
        sizes = batch.sizes
        boxes = torch.tensor([[0, 0, h, w] for h, w in sizes], dtype=torch.float64).reshape(-1, 4)
        flips = sample_flips(len(batch), self.p_flip, self.generator)
        return grid_from_boxes(boxes, sizes, self.size), flips, {"flips": flips}

    def _transform_leaf(self, leaf: Any, b: int, params: dict) -> Any:
        h, w = TF.get_size(leaf)
        return _crop_resize_flip(self, leaf, [0, 0, h, w], params["flips"][b])


class ResizeCenterCropNormalize(_BatchTransform):
    """The usual evaluation transform, ``Resize(resize) -> CenterCrop(crop) -> ToDtype(scale=True)
    -> Normalize(mean, std)``, for a whole batch in one fused pass: each image becomes one
    resampling of exactly the pixels the crop keeps. Same keyword ``options``, inputs and outputs
    as :class:`RandomResizedCropFlipNormalize`."""

    def __init__(
        self,
        resize: int | Sequence[int],
        crop: int | Sequence[int],
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.resize = _resize_arg(resize)
        self.crop = _size_pair(crop, "crop")

    def _out_size(self) -> tuple[int, int]:
        return self.crop

    def _geometry(self, batch: _Batch):
        grid = resize_center_crop_grid(batch.sizes, self.resize, self.crop)
        flips = torch.zeros(len(batch), dtype=torch.bool)
        return grid, flips, {"grid": grid}

    def _transform_leaf(self, leaf: Any, b: int, params: dict) -> Any:
        out = TF.resize(
            leaf,
            self.resize if isinstance(self.resize, list) else [self.resize],
            interpolation=InterpolationMode.NEAREST
            if isinstance(leaf, tv_tensors.Mask)
            else self.interpolation,
            antialias=self.antialias,
        )
        return TF.center_crop(out, list(self.crop))


_KERNELS = {
    device_type: all(
        torch._C._dispatch_has_kernel_for_dispatch_key(f"torchfeed::{op}", key)
        for op in ("crop_flip_normalize_out", "crop_flip_normalize_list_out")
    )
    for device_type, key in (("cpu", "CPU"), ("cuda", "CUDA"))
}


@torch.library.register_fake("torchfeed::crop_flip_normalize_out")
def _crop_flip_normalize_out_fake(images, grid, flips, interpolation, antialias, mean, std, out):
    return None


@torch.library.register_fake("torchfeed::crop_flip_normalize_list_out")
def _crop_flip_normalize_list_out_fake(
    images, grid, flips, interpolation, antialias, mean, std, out
):
    return None
