"""The three fused transforms users name: torchvision's training and evaluation pipelines, and the
second half of the training one for crops decoded in the workers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

import torch
from torchvision.transforms.v2 import InterpolationMode
from typing_extensions import NotRequired, Unpack

from torchfeed._options import check_p_flip, check_range
from torchfeed._packing import Layout
from torchfeed.ops._image_op import ImageOptions, resize_arg, size_pair
from torchfeed.transforms._base import FusedTransform
from torchfeed.transforms._plan import CenterCrop, Flip, Plan, RandomCrop, Resize

__all__ = [
    "RandomResizedCropFlipNormalize",
    "ResizeCenterCropNormalize",
    "ResizeRandomFlipNormalize",
]


class Options(TypedDict):
    """The keyword options every fused transform takes (defaults: :class:`ImageOptions`)."""

    mean: Sequence[float] | float
    std: Sequence[float] | float
    interpolation: NotRequired[str | InterpolationMode]
    antialias: NotRequired[bool]
    dtype: NotRequired[torch.dtype]
    channels_last: NotRequired[bool]
    image_layout: NotRequired[Layout]
    generator: NotRequired[torch.Generator | None]
    return_params: NotRequired[bool]
    reduced_decode: NotRequired[bool]


_OPTIONS = tuple(Options.__annotations__)


def _build(transform: str, plan: Plan, options: Options) -> dict[str, Any]:
    unknown = [name for name in options if name not in _OPTIONS]
    if unknown:
        raise TypeError(
            f"{transform}: unexpected keyword argument {unknown[0]!r}; its options are "
            f"{', '.join(_OPTIONS)} (after size and the steps' own arguments)"
        )
    missing = [name for name in ("mean", "std") if name not in options]
    if missing:
        raise TypeError(
            f"{transform}: {' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} required "
            "(the Normalize step's per-channel values, one for all channels or one per "
            "channel; ImageNet's: "
            "mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))"
        )
    kwargs: dict = dict(options)
    return {
        "plan": plan,
        "generator": kwargs.pop("generator", None),
        "return_params": kwargs.pop("return_params", False),
        "reduced_decode": kwargs.pop("reduced_decode", False),
        "options": ImageOptions(**kwargs),
    }


class RandomResizedCropFlipNormalize(FusedTransform):
    """torchvision's ``RandomResizedCrop(size, scale, ratio) -> RandomHorizontalFlip(p_flip) ->
    ToDtype(dtype, scale=True) -> Normalize(mean, std)`` in one fused pass, with its parameters
    drawn per image (torchvision v2 draws one set for a whole batch tensor).

    Takes what a v2 transform takes: a PIL image, one ``[C, H, W]`` uint8 tensor (``[H, W, C]``
    with ``image_layout="HWC"``) or ``tv_tensors.Image`` (one image out, ``[C, size]``), a
    ``[B, C, H, W]`` batch, a list of images of any sizes or :class:`~torchfeed.RaggedImages`
    (``[B, C, size]`` out), optionally as ``(images, targets)`` with ``targets[b]`` image b's,
    or any nested sample (dict, tuple, list) whose images (torchvision's rule: tv_tensors.Image
    and PIL images, else the first plain tensor) get one crop and whose ``tv_tensors``
    targets (BoundingBoxes, Mask, KeyPoints) follow it; everything else passes through.
    Keyword options: ``mean`` and ``std`` (required), ``interpolation`` ("bilinear" or
    "nearest"), ``antialias`` (True), output ``dtype`` (float32, float16, bfloat16),
    ``channels_last``, ``image_layout`` ("CHW" or "HWC"), ``generator`` (the host generator it
    draws from; torch's global one by default), ``return_params`` (also return ``{"boxes":
    [B, 4] (top, left, height, width), "flips": [B]}``) and ``reduced_decode``.

    One image may also come encoded (a JPEG's bytes, as ``ImageFolder(root,
    loader=torchfeed.decode.read_file)`` hands it over: ``bytes`` or a 1-D uint8 tensor or
    array): only the pixels the crop reads are decoded, and the output is the one of the
    decoded image. With ``reduced_decode=True`` (off by default), such a crop is decoded at the
    largest of libjpeg-turbo's scales (1/2, 1/4, 1/8) at which it still has ``size`` pixels
    each way, and that window resized: several times less decoding on photos, and not
    bit-identical to the full-scale result (README, "Decoding at reduced scale": as
    ``DecodeRandomCrop(size=...)`` followed by ResizeRandomFlipNormalize).
    """

    def __init__(
        self,
        size: int | Sequence[int],
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        p_flip: float = 0.5,
        **options: Unpack[Options],
    ) -> None:
        self.size = size_pair(size)
        self.scale = check_range("scale", scale, positive=False)
        self.ratio = check_range("ratio", ratio, positive=True)
        self.p_flip = check_p_flip(p_flip)
        steps = (RandomCrop(self.size, self.scale, self.ratio), Flip(self.p_flip))
        super().__init__(**_build(type(self).__name__, Plan(steps), options))


class ResizeRandomFlipNormalize(FusedTransform):
    """``Resize((size, size)) -> RandomHorizontalFlip(p_flip) -> ToDtype(dtype, scale=True) ->
    Normalize(mean, std)`` in one fused pass: each WHOLE image is resized to ``size`` (no aspect
    ratio kept) and flipped with probability ``p_flip``, drawn per image.

    The second half of :class:`RandomResizedCropFlipNormalize` for images that are crops
    already, as :class:`torchfeed.decode.DecodeRandomCrop` decodes them in the workers: the two
    together give RandomResizedCropFlipNormalize's result on the full images with the same
    boxes. Inputs, outputs and keyword options as RandomResizedCropFlipNormalize's (the drawn
    parameters are ``{"flips": [B]}``)."""

    def __init__(
        self, size: int | Sequence[int], p_flip: float = 0.5, **options: Unpack[Options]
    ) -> None:
        self.size = size_pair(size)
        self.p_flip = check_p_flip(p_flip)
        super().__init__(
            **_build(type(self).__name__, Plan((Resize(self.size), Flip(self.p_flip))), options)
        )


class ResizeCenterCropNormalize(FusedTransform):
    """The usual evaluation transform, ``Resize(resize) -> CenterCrop(crop) ->
    ToDtype(dtype, scale=True) -> Normalize(mean, std)``, in one fused pass: each image becomes
    one resampling of exactly the pixels the crop keeps (an int ``resize`` sets the shorter
    side). Inputs, outputs and keyword options as :class:`RandomResizedCropFlipNormalize`'s
    (nothing is random: no parameters are drawn).

    On an encoded JPEG, ``reduced_decode=True`` (off by default) decodes the crop's preimage
    (the source pixels the crop keeps, widened to whole pixels) at the largest of 1/2, 1/4 and
    1/8 at which it still has ``crop`` pixels each way, and resizes it: what
    :class:`torchfeed.decode.DecodeCenterCrop` followed by ResizeRandomFlipNormalize(crop,
    p_flip=0) does to a batch, per sample, and not bit-identical to the full-scale result
    (README, "Decoding at reduced scale")."""

    def __init__(
        self, resize: int | Sequence[int], crop: int | Sequence[int], **options: Unpack[Options]
    ) -> None:
        self.resize = resize_arg(resize)
        self.crop = size_pair(crop, "crop")
        size = self.resize if isinstance(self.resize, int) else (self.resize[0], self.resize[1])
        super().__init__(
            **_build(type(self).__name__, Plan((Resize(size), CenterCrop(self.crop))), options)
        )
