"""The fused transform: a torchvision v2 ``Transform`` that runs a spatial plan (crop, resize,
flip: :mod:`torchfeed.transforms._plan`), the conversion to float and the normalization as one
pass of the op, on whatever a v2 transform takes (:mod:`torchfeed.transforms._inputs`): a batch,
one image, or a nested sample whose targets follow their image. Its options are validated once,
at construction; a call validates nothing of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import PIL.Image
import torch
from torch import Tensor
from torch.utils._pytree import tree_flatten, tree_unflatten
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode

from torchfeed._options import check_bool, check_generator
from torchfeed._output_buffer import OutputBuffer
from torchfeed._packing import Layout
from torchfeed._pil import CHANNELS as PIL_CHANNELS
from torchfeed._pil import OP_IMAGE_TYPES, as_op_image
from torchfeed.decode import _as_encoded, _reduction, _Source
from torchfeed.images import RaggedImages
from torchfeed.ops._image_op import ImageOptions, OpImages, output_box, run
from torchfeed.transforms._inputs import TARGETS, is_encoded, is_image, split_batch
from torchfeed.transforms._plan import NotExact, Plan

__all__ = ["FusedTransform"]


class FusedTransform(v2.Transform):
    """See the module's docstring. ``fallback`` (a fused pipeline's original steps) runs instead
    of the op where the op cannot reproduce them exactly: an image that is not 8-bit, a center
    crop larger than the image (torchvision pads); without it, those raise."""

    _transformed_types = OP_IMAGE_TYPES

    def __init__(
        self,
        plan: Plan,
        options: ImageOptions,
        generator: torch.Generator | None,
        return_params: bool,
        fallback: Callable[..., Any] | None = None,
        reduced_decode: bool = False,
    ) -> None:
        super().__init__()
        check_bool("return_params", return_params)
        check_bool("reduced_decode", reduced_decode)
        if reduced_decode and not plan.resizes:
            raise ValueError(
                f"{type(self).__name__}: reduced_decode decodes at reduced scale what the steps "
                f"then resize, and these steps resize nothing ({plan.describe()}): there is no "
                "scale to reduce"
            )
        check_generator(generator)
        self.plan = plan
        self.options = options
        self.generator = generator
        self.return_params = return_params
        self._fallback = fallback
        self.reduced_decode = reduced_decode
        self._hwc = options.image_layout == "HWC"
        self._buffer = OutputBuffer()

    # the options, read-only (validated once, at construction)
    @property
    def mean(self) -> list[float]:
        return list(self.options.mean)  # type: ignore[arg-type]  # a tuple, once validated

    @property
    def std(self) -> list[float]:
        return list(self.options.std)  # type: ignore[arg-type]

    @property
    def interpolation(self) -> str | InterpolationMode:
        return self.options.interpolation

    @property
    def antialias(self) -> bool:
        return self.options.antialias

    @property
    def dtype(self) -> torch.dtype:
        return self.options.dtype

    @property
    def channels_last(self) -> bool:
        return self.options.channels_last

    @property
    def image_layout(self) -> Layout:
        return self.options.image_layout

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_buffer"] = OutputBuffer()  # a pickled transform carries no output batch
        return state

    def output_shape(self, images: Sequence[Tensor]) -> tuple[int, int, int, int]:
        """The output's ``[B, C, H, W]`` for a list of images (of this transform's layout)."""
        batch = OpImages(list(images), self._hwc)
        return (len(batch), batch.channels, *self.plan.batch_size_of(batch.size_table()))

    def apply(self, images: Any, out: Tensor | None = None) -> tuple[Tensor, dict, OpImages]:
        """Transforms a batch (a ``[B, C, H, W]`` tensor, a list of images, RaggedImages), each
        image with its own parameters, into ``out`` if given. Returns the output, the drawn
        parameters and the batch as the op saw it."""
        if isinstance(images, list | tuple) and any(type(x) is not Tensor for x in images):
            images = [as_op_image(x, self._hwc) for x in images]
        batch = OpImages(images, self._hwc)
        if len(batch) == 0:
            params = {"boxes": torch.empty(0, 4, dtype=torch.int64)}
            params["flips"] = torch.empty(0, dtype=torch.bool)
            grid = torch.empty(0, 10, dtype=torch.float64)
            fixed = self.plan.fixed_size() or (0, 0)
            return run(batch, grid, params["flips"], fixed, self.options, out), params, batch
        sizes = batch.size_table()
        out_size = self.plan.batch_size_of(sizes)
        params = self.plan.draw(sizes, self.generator)
        try:
            grid = self.plan.grid(sizes, params, out_size)
        except NotExact as e:
            raise ValueError(f"{type(self).__name__}: {e}") from None
        flips = self.plan.flip_of(params, len(batch))
        buffer = None if torch.compiler.is_compiling() else self._buffer
        return run(batch, grid, flips, out_size, self.options, out, buffer), params, batch

    def forward(self, *inputs: Any) -> Any:
        sample = inputs if len(inputs) > 1 else inputs[0]
        try:
            if is_encoded(sample):  # a file's bytes: only the pixels the taps read are decoded
                image, params = self._one_encoded(sample)
                return (image, params) if self.return_params else image
            if is_image(sample):  # the per-sample fast path: one image, nothing to walk
                image, params = self._one(sample)
                return (image, params) if self.return_params else image
            split = split_batch(sample)
            if split is not None:
                return self._batch(*split)
            return self._sample(sample)
        except _Unfusable as e:
            assert self._fallback is not None
            if e.image is not None:  # the original steps take the decoded image, not its bytes
                return self._fallback(e.image)
            return self._fallback(*inputs)

    def _batch(self, images: Any, targets: Sequence[Any] | None) -> Any:
        if self._fallback is not None and not _eight_bit(images):
            raise _Unfusable
        out, params, batch = self.apply(images)
        if isinstance(images, tv_tensors.Image) or (
            isinstance(images, list | tuple) and isinstance(images[0], tv_tensors.Image)
        ):
            out = tv_tensors.Image(out)
        result: Any = out
        if targets is not None:
            if len(targets) != len(batch):
                raise ValueError(
                    f"targets must be a list with one entry per image ({len(batch)}), got "
                    f"{type(targets).__name__} of length {len(targets)}"
                )
            result = (out, [self._targets(t, params, b) for b, t in enumerate(targets)])
        return (result, params) if self.return_params else result

    def _one(self, image: Any) -> tuple[Any, dict[str, Tensor]]:
        """One image: the op on a batch of one, with one draw of the parameters."""
        if self._fallback is not None and not _eight_bit(image):
            raise _Unfusable
        if isinstance(image, PIL.Image.Image):
            return self._one_pil(image)
        plain = as_op_image(image, self._hwc)
        batch = OpImages([plain], self._hwc)
        # one 3-D image: its size from its shape (the kernel op checks the image itself)
        h, w = plain.shape[:2] if self._hwc else plain.shape[1:]
        sizes, out_size, params = self._draw_one(h, w)
        out = self._run_one(batch, sizes, params, out_size)
        return (tv_tensors.Image(out) if isinstance(image, tv_tensors.Image) else out), params

    def _draw_one(self, h: int, w: int) -> tuple[Tensor, tuple[int, int], dict[str, Tensor]]:
        """One ``h`` x ``w`` image's size table, output size and drawn parameters."""
        sizes = torch.tensor([[h, w]], dtype=torch.int64)
        return sizes, self.plan.batch_size_of(sizes), self.plan.draw(sizes, self.generator)

    def _one_pil(self, image: PIL.Image.Image) -> tuple[Tensor, dict[str, Tensor]]:
        """A PIL image: only the pixels the crop's taps read are copied out of Pillow (its
        ``tobytes`` is the costly step for a large photo), then the op on them."""
        w, h = image.size
        sizes, out_size, params = self._draw_one(h, w)
        grid = self._grid(sizes, params, out_size)
        (y0, x0, y1, x1), grid = _taps_window(grid)
        if (x0, y0, x1, y1) != (0, 0, w, h):
            image = image.crop((x0, y0, x1, y1))
        plain = as_op_image(image, self._hwc)
        batch = OpImages([plain], self._hwc)
        out = run(batch, grid, self.plan.flip_of(params, 1), out_size, self.options)[0]
        return out, params

    def _one_encoded(self, data: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """An encoded image (a JPEG: see torchfeed.decode): its size from the header, the draw,
        then only the window the crop's taps read is decoded (bit for bit those pixels of the
        whole decode), so the output is the one of the decoded image, with less decoding; with
        ``reduced_decode``, the crop at reduced scale (see :meth:`_reduced_window`)."""
        source = _Source(_as_encoded(data, "the encoded image"))
        h, w = source.size
        sizes, out_size, params = self._draw_one(h, w)
        flips = self.plan.flip_of(params, 1)
        try:
            grid = self._grid(sizes, params, out_size)
        except _Unfusable as e:
            e.image = source.window((0, 0, h, w))
            raise
        scaled = None
        if self.reduced_decode and source.scalable:
            scaled = self._reduced_window(source, grid, out_size)
        if scaled is not None:
            window, grid = scaled
        else:
            (y0, x0, y1, x1), grid = _taps_window(grid)
            window = source.window((y0, x0, y1 - y0, x1 - x0))
        plain = window.permute(1, 2, 0) if self._hwc else window
        out = run(OpImages([plain], self._hwc), grid, flips, out_size, self.options)[0]
        return out, params

    def _reduced_window(
        self, source: _Source, grid: Tensor, out_size: tuple[int, int]
    ) -> tuple[Tensor, Tensor] | None:
        """The source box the output stands for (``output_box``: a random crop's box, a center
        crop's preimage under its resize, a whole resized image; mirrored when the flip comes
        first) decoded at the largest of 1/2, 1/4, 1/8 at which it still has ``out_size``
        pixels each way (DecodeRandomCrop(size=...)'s and DecodeCenterCrop's window), and the
        grid that resizes all of it to ``out_size``; None when it is too small to reduce (the
        exact path then decodes it at full scale)."""
        box = output_box(grid, out_size)
        if _reduction(box[2], box[3], out_size) == 1:
            return None
        window = source.window(box, out_size)
        size = torch.tensor([window.shape[1:]], dtype=torch.int64)
        whole = torch.cat([torch.zeros_like(size), size], dim=1)
        return window, torch.ops.torchfeed.resized_crop_grid(size, whole, *out_size)

    def _grid(self, sizes: Tensor, params: dict[str, Tensor], out_size: tuple[int, int]) -> Tensor:
        try:
            return self.plan.grid(sizes, params, out_size)
        except NotExact as e:
            if self._fallback is not None:
                raise _Unfusable from None
            raise ValueError(f"{type(self).__name__}: {e}") from None

    def _run_one(
        self, batch: OpImages, sizes: Tensor, params: dict[str, Tensor], out_size: tuple[int, int]
    ) -> Tensor:
        grid = self._grid(sizes, params, out_size)
        flips = self.plan.flip_of(params, 1)
        return run(batch, grid, flips, out_size, self.options)[0]

    def _sample(self, sample: Any) -> Any:
        """A nested sample, as v2 walks one: its images by v2's rule (tv_tensors.Image and PIL
        images, else the first pure tensor), all of one size, get one draw of the parameters;
        its targets follow; everything else passes through."""
        flat, spec = tree_flatten(sample)
        needs = self._needs_transform_list(flat)
        images = [x for x, n in zip(flat, needs, strict=True) if n and not isinstance(x, TARGETS)]
        if not images:
            raise TypeError(
                f"{type(self).__name__}: the sample holds no image (a PIL image, an image tensor "
                "or a tv_tensors.Image) to transform"
            )
        for x in images:
            if not (is_image(x) or isinstance(x, tv_tensors.Image)):
                raise TypeError(
                    f"{type(self).__name__} transforms images (a PIL image, a [C, H, W] tensor, a "
                    f"tv_tensors.Image) and their targets, got {type(x).__name__} of shape "
                    f"{list(getattr(x, 'shape', []))} in the sample"
                )
            if self._fallback is not None and not _eight_bit(x):
                raise _Unfusable
        plain = [as_op_image(x, self._hwc) for x in images]
        sizes = OpImages(plain, self._hwc).size_table()
        if len({tuple(s) for s in sizes.tolist()}) != 1:
            raise ValueError(
                f"{type(self).__name__}: the images of one sample must have one size (they get "
                f"one crop), got (H, W) {sorted({tuple(s) for s in sizes.tolist()})}"
            )
        out_size = self.plan.batch_size_of(sizes[:1])
        params = self.plan.draw(sizes[:1], self.generator)
        done = iter(
            self._run_one(OpImages([p], self._hwc), sizes[:1], params, out_size) for p in plain
        )
        outputs = []
        for x, n in zip(flat, needs, strict=True):
            if not n:
                outputs.append(x)
            elif isinstance(x, TARGETS):
                outputs.append(self._targets(x, params, 0))
            else:
                out = next(done)
                outputs.append(tv_tensors.Image(out) if isinstance(x, tv_tensors.Image) else out)
        result = tree_unflatten(outputs, spec)
        return (result, params) if self.return_params else result

    def _targets(self, target: Any, params: dict[str, Tensor], b: int) -> Any:
        """Every target (boxes, masks, key points) in ``target`` through image b's steps."""
        interpolation = self.options.interpolation
        if not isinstance(interpolation, InterpolationMode):
            interpolation = InterpolationMode(interpolation)
        flat, spec = tree_flatten(target)
        out = [
            self.plan.apply_to_target(x, params, b, interpolation, self.options.antialias)
            if isinstance(x, TARGETS)
            else x
            for x in flat
        ]
        return tree_unflatten(out, spec)

    def extra_repr(self) -> str:
        o = self.options
        return (
            f"{self.plan.describe()}, mean={self.mean}, std={self.std}, "
            f"interpolation={o.interpolation}, antialias={o.antialias}, dtype={o.dtype}"
        )


def _taps_window(grid: Tensor) -> tuple[tuple[int, int, int, int], Tensor]:
    """The rows [y0, y1) and columns [x0, x1) a one-image grid's taps read, and the grid for
    those pixels alone (a grid row per axis: start, extent, virtual size, offset, end of the
    taps)."""
    row = grid[0].tolist()
    y0, x0, y1, x1 = int(row[0]), int(row[5]), int(row[4]), int(row[9])
    if (y0, x0) != (0, 0):
        row[0], row[4], row[5], row[9] = row[0] - y0, row[4] - y0, row[5] - x0, row[9] - x0
        grid = torch.tensor([row], dtype=torch.float64)
    return (y0, x0, y1, x1), grid


class _Unfusable(Exception):
    """This input takes the original steps (a fused pipeline's fallback); ``image``: what they
    take in its place (an encoded image, decoded)."""

    image: Tensor | None = None


def _eight_bit(images: Any) -> bool:
    """Whether the op can read these images: uint8 tensors and arrays, 8-bit PIL modes."""
    if isinstance(images, RaggedImages):
        return images.data.dtype == torch.uint8
    if isinstance(images, list | tuple):
        return all(_eight_bit(x) for x in images)
    if isinstance(images, Tensor | np.ndarray):
        return images.dtype in (torch.uint8, np.uint8)
    if isinstance(images, PIL.Image.Image):
        return images.mode in PIL_CHANNELS
    return False
