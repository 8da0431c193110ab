"""The spatial plan of a fused transform: the torchvision steps it stands for, in the pipeline's
order (a random resized crop, a resize, a center crop, a random horizontal flip), how each
image's geometry row for the op is planned from them, and how a target (boxes, masks, key
points) goes through the same steps with torchvision's functionals.

The op crops one box per image, resizes it and flips the output; every chain of steps here is one
such box (in the source image, possibly fractional) and one output size, computed by the C++
planning ops with torchvision's rounding. A flip before the crop is the mirrored crop, flipped.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as TF

from torchfeed._batch_rng import draws_for
from torchfeed.ops._image_op import resize_center_crop_grid, resized_size

__all__ = ["CenterCrop", "Flip", "NotExact", "Plan", "RandomCrop", "Resize", "Step"]


class NotExact(Exception):
    """The fused op cannot reproduce these steps exactly for this input (a center crop larger
    than the image, which torchvision pads): a fused pipeline runs the original steps instead."""


@dataclass(frozen=True)
class RandomCrop:
    """``RandomResizedCrop(size, scale, ratio)``: a box drawn per image, resized to ``size``."""

    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]


@dataclass(frozen=True)
class Resize:
    """``Resize(size)``: an int sets the shorter side (the aspect ratio kept, torchvision's
    rounding), a pair the output size."""

    size: int | tuple[int, int]

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        return resized_size(h, w, self.size)


@dataclass(frozen=True)
class CenterCrop:
    """``CenterCrop(size)`` (which torchvision pads when the image is smaller: not fused)."""

    size: tuple[int, int]

    def box(self, h: int, w: int) -> tuple[int, int, int, int]:
        ch, cw = self.size
        if ch > h or cw > w:
            raise NotExact(f"CenterCrop{self.size} of a {h} x {w} image pads it")
        # torchvision: int(round((size - crop) / 2.0)), Python's half-to-even round
        return round((h - ch) / 2.0), round((w - cw) / 2.0), ch, cw


@dataclass(frozen=True)
class Flip:
    """``RandomHorizontalFlip(p)``."""

    p: float


Step = RandomCrop | Resize | CenterCrop | Flip

# The chains of spatial steps one box and one output size can stand for.
_CHAINS = {
    (),
    (RandomCrop,),
    (Resize,),
    (CenterCrop,),
    (Resize, CenterCrop),
    (CenterCrop, Resize),
}


def chain_of(steps: Sequence[Step]) -> tuple[type, ...] | None:
    """The chain of ``steps`` (flips aside), or None when the op cannot do them in one pass:
    more than one flip, or a flip between a resize and the center crop after it."""
    kinds = tuple(type(s) for s in steps if not isinstance(s, Flip))
    flips = [i for i, s in enumerate(steps) if isinstance(s, Flip)]
    if kinds not in _CHAINS or len(flips) > 1:
        return None
    if flips and kinds == (Resize, CenterCrop) and 0 < flips[0] < len(steps) - 1:
        return None
    return kinds


@dataclass(frozen=True)
class Plan:
    """Spatial steps in the pipeline's order; see the module's docstring."""

    steps: tuple[Step, ...]
    # What every call asks of the steps, found once in __post_init__ (a per-sample transform's
    # calls are each a few microseconds of work around the op).
    _spatial: tuple[Step, ...] = field(init=False, repr=False, compare=False)  # flips aside
    _flip: Flip | None = field(init=False, repr=False, compare=False)
    _crop: RandomCrop | None = field(init=False, repr=False, compare=False)
    _fixed: tuple[int, int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if chain_of(self.steps) is None:
            raise ValueError(f"these steps are not one crop, resize and flip: {self.steps}")
        spatial = tuple(s for s in self.steps if not isinstance(s, Flip))
        object.__setattr__(self, "_spatial", spatial)
        object.__setattr__(
            self, "_flip", next((s for s in self.steps if isinstance(s, Flip)), None)
        )
        crop = next((s for s in spatial if isinstance(s, RandomCrop)), None)
        object.__setattr__(self, "_crop", crop)
        last = spatial[-1] if spatial else None
        sized = isinstance(last, RandomCrop | CenterCrop) or (
            isinstance(last, Resize) and not isinstance(last.size, int)
        )
        object.__setattr__(self, "_fixed", last.size if sized else None)  # type: ignore[union-attr]

    @property
    def flip(self) -> Flip | None:
        return self._flip

    @property
    def random_crop(self) -> bool:
        """Whether a random crop is drawn (its box is in the drawn ``boxes``)."""
        return self._crop is not None

    @property
    def resizes(self) -> bool:
        """Whether a step resamples (a random resized crop or a resize): what a reduced-scale
        decode can stand in for."""
        return any(isinstance(s, RandomCrop | Resize) for s in self.steps)

    @property
    def flip_first(self) -> bool:
        """Whether the flip comes before the crop (then the op crops the mirrored box)."""
        return len(self.steps) > 1 and isinstance(self.steps[0], Flip)

    def fixed_size(self) -> tuple[int, int] | None:
        """The output size when every image gets it (None: it follows each image's size)."""
        return self._fixed

    def out_size(self, h: int, w: int) -> tuple[int, int]:
        """The output size for an image of ``h`` x ``w``."""
        for s in self._spatial:
            if isinstance(s, RandomCrop | CenterCrop):
                h, w = s.size
            elif isinstance(s, Resize):
                h, w = s.out_size(h, w)
        return h, w

    def batch_size_of(self, sizes: Tensor) -> tuple[int, int]:
        """The one output size of a batch of images of ``sizes`` ``[B, 2]``."""
        fixed = self.fixed_size()
        if fixed is not None:
            return fixed
        outs = {self.out_size(int(h), int(w)) for h, w in sizes.tolist()}
        if len(outs) != 1:
            raise ValueError(
                f"this transform's output size follows each image's size ({self._spatial or 'no '}"
                f"resize to a fixed size), and the images of this batch give {sorted(outs)}: a "
                "batch must have images that give one output size"
            )
        return outs.pop()

    def draw(self, sizes: Tensor, generator: torch.Generator | None) -> dict[str, Tensor]:
        """The random parameters of a batch: ``boxes`` ``[B, 4]`` int64 (top, left, height,
        width) with a random crop, ``flips`` ``[B]`` bool with a flip; boxes first, then flips
        (one op draws both: a compiled graph cannot reorder them). In a DevicePrefetcher that
        knows the batch's samples, image j's from uniforms of sample j's (_batch_rng)."""
        crop, flip = self._crop, self._flip
        width = (0 if crop is None else 22) + (0 if flip is None else 1)
        generator, u = draws_for(generator, sizes.shape[0], width)
        if crop is not None and flip is not None:
            boxes, flips = torch.ops.torchfeed.sample_crops_and_flips(
                sizes, *crop.scale, *crop.ratio, flip.p, generator, u
            )
            return {"boxes": boxes, "flips": flips}
        if crop is not None:
            boxes = torch.ops.torchfeed.sample_resized_crop(
                sizes, *crop.scale, *crop.ratio, generator, u
            )
            return {"boxes": boxes}
        if flip is not None and u is not None:
            return {"flips": u[:, 0] < flip.p}
        if flip is not None:
            # torch.rand's draws; uniform_ also traces for a symbolic batch size (torch.compile)
            coins = torch.empty(sizes.shape[0], dtype=torch.float32).uniform_(generator=generator)
            return {"flips": coins < flip.p}
        return {}

    def grid(self, sizes: Tensor, params: dict[str, Tensor], out: tuple[int, int]) -> Tensor:
        """The op's geometry ``[B, 10]`` float64 for images of ``sizes`` with ``params``."""
        spatial = self._spatial
        resize, crop = spatial if len(spatial) == 2 else (None, None)
        # isinstance, not a tuple of types compared: what torch.compile 2.11 traces too
        if isinstance(resize, Resize) and isinstance(crop, CenterCrop):
            try:
                grid = resize_center_crop_grid(sizes, _resize_arg(resize.size), crop.size)
            except ValueError as e:  # the crop is larger than the resized image: torchvision pads
                raise NotExact(str(e)) from None
        else:
            grid = torch.ops.torchfeed.resized_crop_grid(sizes, self._boxes(sizes, params), *out)
        if self.flip_first and "flips" in params:
            grid = _mirrored(grid, sizes, params["flips"], out[1])
        return grid

    def _boxes(self, sizes: Tensor, params: dict[str, Tensor]) -> Tensor:
        if "boxes" in params:
            return params["boxes"]
        first = self._spatial[0] if self._spatial else None
        if isinstance(first, CenterCrop):
            return torch.tensor([first.box(h, w) for h, w in sizes.tolist()], dtype=torch.int64)
        return torch.cat([torch.zeros_like(sizes), sizes], dim=1)  # the whole images

    def flip_of(self, params: dict[str, Tensor], count: int) -> Tensor:
        """The op's output flips (all False without a flip step)."""
        flips = params.get("flips")
        return torch.zeros(count, dtype=torch.bool) if flips is None else flips

    def apply_to_target(
        self,
        leaf: Any,
        params: dict[str, Tensor],
        b: int,
        interpolation: InterpolationMode,
        antialias: bool,
    ) -> Any:
        """``leaf`` (boxes, a mask, key points) through the steps, image b's parameters, with
        torchvision's functionals in the pipeline's order (masks resampled nearest)."""
        mode = InterpolationMode.NEAREST if isinstance(leaf, tv_tensors.Mask) else interpolation
        for s in self.steps:
            if isinstance(s, Flip):
                if bool(params["flips"][b]):
                    leaf = TF.horizontal_flip(leaf)
            elif isinstance(s, RandomCrop):
                top, left, h, w = params["boxes"][b].tolist()
                leaf = TF.resized_crop(
                    leaf,
                    top,
                    left,
                    h,
                    w,
                    size=list(s.size),
                    interpolation=mode,
                    antialias=antialias,
                )
            elif isinstance(s, Resize):
                size = [s.size] if isinstance(s.size, int) else list(s.size)
                leaf = TF.resize(leaf, size, interpolation=mode, antialias=antialias)
            else:
                leaf = TF.center_crop(leaf, list(s.size))
        return leaf

    def describe(self) -> str:
        return " -> ".join(_describe(s) for s in self.steps) or "no resize"


def _resize_arg(size: int | tuple[int, int]) -> int | list[int]:
    return size if isinstance(size, int) else list(size)


def _mirrored(grid: Tensor, sizes: Tensor, flips: Tensor, out_w: int) -> Tensor:
    """The geometry of a flip BEFORE the crop: for flipped images, the crop's mirror in x (the
    source window [start, start + extent) of a width-W image becomes [W - start - extent, W -
    start), the output window [offset, offset + out_w) of the virtual width V becomes [V - offset
    - out_w, V - offset)); the op then flips the output, which restores the orientation."""
    if not bool(flips.any()):
        return grid
    grid = grid.clone()
    x = grid[flips, 5:10]  # x axis: start, extent, virtual size, offset, end of the taps
    width = sizes[flips, 1].to(torch.float64)
    start = width - x[:, 0] - x[:, 1]
    x[:, 3] = x[:, 2] - x[:, 3] - out_w
    x[:, 0] = start
    x[:, 4] = torch.minimum(torch.ceil(start + x[:, 1]), width)
    grid[flips, 5:10] = x
    return grid


def _describe(s: Step) -> str:
    if isinstance(s, RandomCrop):
        return f"RandomResizedCrop(size={s.size}, scale={s.scale}, ratio={_short(s.ratio)})"
    if isinstance(s, Resize):
        return f"Resize({s.size})"
    if isinstance(s, CenterCrop):
        return f"CenterCrop({s.size})"
    return f"RandomHorizontalFlip(p={s.p})"


def _short(pair: tuple[float, float]) -> str:
    return "(" + ", ".join(f"{v:.4g}" if math.isfinite(v) else str(v) for v in pair) + ")"
