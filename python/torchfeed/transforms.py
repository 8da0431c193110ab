"""Batch transforms in torchvision v2's form: per-image random crop, flip and normalization of a
whole uint8 batch in one fused pass (the op: :mod:`torchfeed.ops.crop_flip_normalize`), with
targets (boxes, masks) that follow their image."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from torchfeed._options import check_generator, check_p_flip, check_range
from torchfeed._output_buffer import OutputBuffer
from torchfeed._packing import Layout
from torchfeed.images import RaggedImages
from torchfeed.ops._image_op import (
    ImageOptions,
    OpImages,
    resize_arg,
    resize_center_crop_grid,
    run,
    size_pair,
)
from torchfeed.sampling import sample_flips

__all__ = [
    "RandomResizedCropFlipNormalize",
    "ResizeCenterCropNormalize",
    "ResizeRandomFlipNormalize",
]


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
        self.options = ImageOptions(
            mean, std, interpolation, antialias, dtype, channels_last, image_layout
        )
        if not isinstance(return_params, bool):
            raise TypeError(f"return_params must be a bool, got {type(return_params).__name__}")
        self.return_params = return_params
        self._buffer = OutputBuffer()

    # the options, read-only (a transform's options are validated once, here)
    mean = property(lambda self: list(self.options.mean))
    std = property(lambda self: list(self.options.std))
    interpolation = property(lambda self: self.options.interpolation)
    antialias = property(lambda self: self.options.antialias)
    dtype = property(lambda self: self.options.dtype)
    channels_last = property(lambda self: self.options.channels_last)
    image_layout = property(lambda self: self.options.image_layout)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffer"] = OutputBuffer()  # a pickled transform carries no output batch
        return state

    def output_shape(self, batch_size: int, channels: int) -> tuple[int, ...]:
        return (batch_size, channels, *self._out_size())

    def apply(self, images: Any, out: Tensor | None = None) -> tuple[Tensor, dict, OpImages]:
        """Transforms a batch of images (into ``out`` if given); returns the output, the drawn
        parameters and the batch as the op saw it."""
        batch = OpImages(images, self.options.image_layout == "HWC")
        if len(batch) == 0:
            none = torch.empty(0, 4, dtype=torch.int64)
            params = {"boxes": none, "flips": torch.empty(0, dtype=torch.bool), "grid": none}
            grid, flips = torch.empty(0, 10, dtype=torch.float64), params["flips"]
        else:
            grid, flips, params = self._geometry(batch, batch.size_table())
        out = run(batch, grid, flips, self._out_size(), self.options, out, self._buffer)
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

    def _transform_targets(self, targets: Any, batch: OpImages, params: dict) -> list:
        if not isinstance(targets, Sequence) or len(targets) != len(batch):
            raise ValueError(
                f"targets must be a list with one entry per image ({len(batch)}), got "
                f"{type(targets).__name__}"
                + (f" of length {len(targets)}" if isinstance(targets, Sequence) else "")
            )
        return [
            _map_leaves(t, functools.partial(self._leaf, b=b, params=params))
            for b, t in enumerate(targets)
        ]

    def _leaf(self, leaf: Any, b: int, params: dict) -> Any:
        return self._transform_leaf(leaf, b, params)


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
        self.size = size_pair(size)
        self.scale = check_range("scale", scale, positive=False)
        self.ratio = check_range("ratio", ratio, positive=True)
        self.p_flip = check_p_flip(p_flip)
        self.generator = check_generator(generator)

    def _out_size(self) -> tuple[int, int]:
        return self.size

    def _geometry(self, batch: OpImages, sizes: Tensor):
        # C++ draws what sample_resized_crop_params draws, in one call for the batch
        boxes = torch.ops.torchfeed.sample_resized_crop(
            sizes, *self.scale, *self.ratio, self.generator
        )
        flips = sample_flips(len(batch), self.p_flip, self.generator)
        grid = torch.ops.torchfeed.resized_crop_grid(sizes, boxes, *self.size)
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


class ResizeRandomFlipNormalize(_BatchTransform):
    """``Resize((size, size)) -> RandomHorizontalFlip(p_flip) -> ToDtype(dtype, scale=True) ->
    Normalize(mean, std)`` for a whole batch, in one fused pass: each WHOLE image is resized to
    ``size`` (no aspect ratio kept), flipped with probability ``p_flip`` (drawn per image, from
    ``generator`` or torch's global generator).

    This is the second half of :class:`RandomResizedCropFlipNormalize` for images that are
    already crops, such as the windows :class:`torchfeed.decode.DecodeRandomCrop` decodes in the
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
        self.size = size_pair(size)
        self.p_flip = check_p_flip(p_flip)
        self.generator = check_generator(generator)

    def _out_size(self) -> tuple[int, int]:
        return self.size

    def _geometry(self, batch: OpImages, sizes: Tensor):
        boxes = torch.cat([torch.zeros_like(sizes), sizes], dim=1)  # the whole images
        flips = sample_flips(len(batch), self.p_flip, self.generator)
        grid = torch.ops.torchfeed.resized_crop_grid(sizes, boxes, *self.size)
        return grid, flips, {"flips": flips}

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
        self.resize = resize_arg(resize)
        self.crop = size_pair(crop, "crop")

    def _out_size(self) -> tuple[int, int]:
        return self.crop

    def _geometry(self, batch: OpImages, sizes: Tensor):
        grid = resize_center_crop_grid(sizes, self.resize, self.crop)
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
