"""fuse(): an existing torchvision pipeline (``v2.Compose``, the v1 ``transforms.Compose``, or a
list of steps), with every maximal run of steps the fused op does exactly replaced by one fused
step, and every other step left where it was, in order.

A run is steps the op can do in one pass: conversions to a tensor (``ToImage``,
``PILToTensor``, ``ToTensor``, ``ToPureTensor``); at most one crop/resize chain
(``RandomResizedCrop``; ``Resize``; ``CenterCrop``; ``Resize`` then ``CenterCrop``;
``CenterCrop`` then ``Resize``) and one ``RandomHorizontalFlip``; exactly one conversion to
float with scaling (``ToDtype(float32/float16/bfloat16, scale=True)``, ``ConvertImageDtype``,
``ToTensor``); at most one ``Normalize`` after it. A step whose arguments the op cannot honour
exactly (``Resize(max_size=...)``, an interpolation other than bilinear and nearest, an
antialias that is not a bool, ``ToDtype`` to another dtype or without scaling, a per-type
dtype dict) ends the run and stays torchvision's, as does everything else (``ColorJitter``,
``RandAugment``, ``RandomErasing``, your own).

A file's bytes (``ImageFolder(root, loader=torchfeed.decode.read_file)``) go to the first step:
a fused one decodes only what its crop reads; before a first step that stays torchvision's, fuse
puts ``DecodeBytes()``, which decodes them whole and passes every other input through.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torchvision.transforms as v1
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode

from torchfeed._options import check_bool, check_generator
from torchfeed.decode import decode_image
from torchfeed.ops._image_op import ImageOptions
from torchfeed.transforms._base import FusedTransform
from torchfeed.transforms._inputs import is_encoded
from torchfeed.transforms._plan import (
    CenterCrop,
    Flip,
    Plan,
    RandomCrop,
    Resize,
    Step,
    chain_of,
)

__all__ = ["fuse"]

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_DECODE = (v2.ToImage, v2.PILToTensor, v2.ToPureTensor, v1.PILToTensor)
_TO_TENSOR = (v1.ToTensor, *((v2.ToTensor,) if hasattr(v2, "ToTensor") else ()))
_MODES = (InterpolationMode.BILINEAR, InterpolationMode.NEAREST)


class FusedSteps(FusedTransform):
    """A run of torchvision steps done by the fused op in one pass (see :func:`fuse`); where the
    op cannot reproduce them exactly for an input (an image that is not 8-bit, a center crop
    that torchvision would pad) the original steps run instead."""

    def __init__(
        self,
        steps: Sequence[Callable[..., Any]],
        plan: Plan,
        options: ImageOptions,
        generator: torch.Generator | None,
        original: Callable[..., Any],
        to_image: bool,
        reduced_decode: bool = False,
    ) -> None:
        super().__init__(
            plan, options, generator, False, fallback=original, reduced_decode=reduced_decode
        )
        self.steps = list(steps)
        self._to_image = to_image

    def forward(self, *inputs: Any) -> Any:
        out = super().forward(*inputs)
        # v2's ToImage makes a tv_tensors.Image, which the steps after it keep
        if self._to_image and type(out) is torch.Tensor:
            return tv_tensors.Image(out)
        return out

    def __repr__(self) -> str:
        return f"Fused({', '.join(repr(step) for step in self.steps)})"


class DecodeBytes:
    """The first step of a fused pipeline whose first step stays torchvision's: a file's bytes
    (``loader=torchfeed.decode.read_file``) are decoded whole (:func:`torchfeed.decode.
    decode_image`), for torchvision's steps do not take them; every other input passes
    through unchanged."""

    def __call__(self, *inputs: Any) -> Any:
        if len(inputs) == 1 and is_encoded(inputs[0]):
            return decode_image(inputs[0])
        return inputs if len(inputs) > 1 else inputs[0]

    def __repr__(self) -> str:
        return "DecodeBytes()"


def fuse(
    pipeline: Any, *, generator: torch.Generator | None = None, reduced_decode: bool = False
) -> Any:
    """``pipeline`` (a ``v2.Compose``, a v1 ``transforms.Compose`` or a list of steps) with each
    maximal run of steps the fused op does exactly replaced by one :class:`FusedSteps`, the other
    steps left as they are, in order. Returns a pipeline of the same family (a v1 ``Compose`` for
    a v1 one, else a ``v2.Compose``) whose ``repr`` shows what was fused.

    The result equals the original's with the same parameters, within float rounding: the op
    computes torchvision's steps in float without rounding to uint8 after the resize (where the
    original resizes uint8 images, up to one level, 1/255/std, apart; PIL's own resize, for a
    v1 pipeline on PIL images, a little more). Random parameters are drawn as torchvision draws
    them, from ``generator`` (torch's global generator by default). A batch tensor gets
    parameters per image (torchvision v2 draws one set for a whole batch).

    A fused step that comes first also takes an encoded image (a JPEG's bytes:
    ``ImageFolder(root, loader=torchfeed.decode.read_file)``) and decodes only the pixels its
    crop reads, with the same result; before a first step that stays torchvision's, the result
    starts with :class:`DecodeBytes`, which decodes them whole. ``reduced_decode=True`` decodes
    what the first step resizes (a random crop; a center crop's preimage under its resize; a
    whole resized image) at reduced scale (see :class:`RandomResizedCropFlipNormalize`; not
    bit-identical); without a fused first step that resizes, it is refused.
    """
    check_generator(generator)
    check_bool("reduced_decode", reduced_decode)
    if isinstance(pipeline, v1.Compose):
        steps, compose = _flatten(pipeline.transforms, v1.Compose), v1.Compose
    elif isinstance(pipeline, v2.Compose):
        steps, compose = _flatten(pipeline.transforms, v2.Compose), v2.Compose
    elif isinstance(pipeline, list | tuple):
        steps, compose = _flatten(list(pipeline), v2.Compose), v2.Compose
    else:
        raise TypeError(
            "fuse takes a torchvision pipeline: a v2.Compose, a transforms.Compose or a list of "
            f"steps, got {type(pipeline).__name__}"
        )
    out: list[Any] = []
    i = 0
    while i < len(steps):
        for j in range(len(steps), i, -1):  # the longest run from step i
            fused = _compile(steps[i:j], compose, generator, reduced_decode)
            if fused is not None:
                out.append(fused)
                i = j
                break
        else:
            out.append(steps[i])
            i += 1
    first = out[0] if out else None
    if reduced_decode and not (isinstance(first, FusedSteps) and first.reduced_decode):
        raise ValueError(
            "fuse: reduced_decode decodes a file's bytes at reduced scale, which only a first "
            "step that fuses a RandomResizedCrop or a Resize sees; this pipeline's first step is "
            f"{first!r} (a step between the crop or resize and ToDtype keeps it from fusing)"
        )
    if not isinstance(first, FusedSteps):
        out.insert(0, DecodeBytes())
    return compose(out)


def _flatten(steps: list[Any], compose: type) -> list[Any]:
    flat: list[Any] = []
    for s in steps:
        nested = type(s) is compose
        flat.extend(_flatten(list(s.transforms), compose) if nested else [s])
    return flat


def _compile(
    steps: list[Any], compose: type, generator: torch.Generator | None, reduced_decode: bool
) -> Any:
    """The fused step for ``steps``, or None when the op cannot do them all in one pass."""
    spatial: list[Step] = []
    resampling: Any = None
    dtype: torch.dtype | None = None
    mean_std: tuple[Sequence[float], Sequence[float]] | None = None
    to_image = False
    for s in steps:
        kind = _spatial(s)
        if kind is not None:
            spatial.append(kind)
            if isinstance(kind, RandomCrop | Resize):
                resampling = s
            continue
        if _is_decode(s):
            to_image = to_image or isinstance(s, v2.ToImage)
            if isinstance(s, _TO_TENSOR):
                if dtype is not None:
                    return None
                dtype = torch.float32
            continue
        converted = _to_float(s)
        if converted is not None:
            if dtype is not None:
                return None
            dtype = converted
            continue
        if isinstance(s, v1.Normalize | v2.Normalize) and dtype is not None and mean_std is None:
            mean_std = (list(s.mean), list(s.std))
            continue
        return None  # a step the op does not do
    if dtype is None or chain_of(spatial) is None:
        return None  # the output of the op is always float
    mode = _mode(resampling.interpolation) if resampling is not None else None
    mode = mode or InterpolationMode.BILINEAR
    antialias = resampling.antialias if resampling is not None else True
    mean, std = mean_std if mean_std is not None else ([0.0], [1.0])
    options = ImageOptions(mean, std, mode, antialias, dtype)
    plan = Plan(tuple(spatial))
    reduced = reduced_decode and plan.resizes  # a step that resizes nothing has no scale
    return FusedSteps(steps, plan, options, generator, compose(steps), to_image, reduced)


def _is_decode(s: Any) -> bool:
    return isinstance(s, _DECODE + _TO_TENSOR)


def _to_float(s: Any) -> torch.dtype | None:
    if isinstance(s, v2.ToDtype):
        if s.scale and s.dtype in _FLOATS:  # a dict of dtypes per type: not fused
            return s.dtype
        return None
    if isinstance(s, v1.ConvertImageDtype | v2.ConvertImageDtype) and s.dtype in _FLOATS:
        return s.dtype
    return None


def _spatial(s: Any) -> Step | None:
    """The plan step of a torchvision crop, resize or flip it can do exactly, else None."""
    if isinstance(s, v1.RandomHorizontalFlip | v2.RandomHorizontalFlip):
        return Flip(float(s.p))
    if isinstance(s, v1.CenterCrop | v2.CenterCrop):
        return CenterCrop(_pair(s.size))
    if isinstance(s, v1.RandomResizedCrop | v2.RandomResizedCrop):
        if not _resamples_exactly(s):
            return None
        scale = (float(s.scale[0]), float(s.scale[1]))
        ratio = (float(s.ratio[0]), float(s.ratio[1]))
        return RandomCrop(_pair(s.size), scale, ratio)
    if isinstance(s, v1.Resize | v2.Resize):
        if not _resamples_exactly(s) or s.max_size is not None or s.size is None:
            return None
        size = s.size
        if isinstance(size, int):
            return Resize(size)
        return Resize(int(size[0])) if len(size) == 1 else Resize(_pair(size))
    return None


def _resamples_exactly(s: Any) -> bool:
    return _mode(s.interpolation) in _MODES and isinstance(s.antialias, bool)


def _mode(interpolation: Any) -> InterpolationMode | None:
    """A step's interpolation as an InterpolationMode (torchvision 0.29 keeps a str)."""
    if isinstance(interpolation, InterpolationMode):
        return interpolation
    try:
        return InterpolationMode(interpolation)
    except ValueError:
        return None


def _pair(size: Any) -> tuple[int, int]:
    if isinstance(size, int):
        return size, size
    values = [int(v) for v in size]
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])
