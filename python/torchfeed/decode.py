"""Decoding in the workers: decode only the part of an image that the random crop keeps.

With ``RandomResizedCrop``'s default scale (0.08, 1) the crop covers about half of the image on
average, yet the usual pipeline decodes every pixel and then throws the rest away. Here the
worker reads the JPEG's header, draws the crop there (torchvision's algorithm), and libjpeg-turbo
decodes just that window: rows below it are never decoded, and rows above it and columns beside
it are only entropy-decoded. (NVIDIA DALI's ``decoders.image_random_crop`` does the same.) The
window's pixels are bit-identical to a full decode sliced afterwards, so what follows (resize,
flip, normalize: :class:`torchfeed.transforms.ResizeRandomFlipNormalize`) gives exactly the
result of the usual ``RandomResizedCrop`` on the full image.

Large photos can also be decoded at a reduced scale: given the output size, the crop is decoded
at the largest of libjpeg-turbo's scales (1/2, 1/4, 1/8) at which it still has at least that many
pixels (``DecodeRandomCrop(size=...)``, :class:`DecodeCenterCrop`), which skips most of the
inverse DCT and colour conversion of a multi-megapixel JPEG. That is close to, not equal to, the
full-scale result (README, "Decoding at reduced scale").

A progressive JPEG is a series of scans over the whole image, and libjpeg decodes all of them
before the first row comes out, which made it 3-5x slower than a sequential one. The window
decoder gives libjpeg a copy whose frame header declares only the rows down to the window's
(and one iMCU row more), so every scan stops there; at 1/8 it also leaves out the scans of
coefficients that scale never reads (the AC scans of every component whose 8 x 8 blocks become
single pixels: the luma of a 4:2:0 file, every component of a 4:4:4 or 4:2:2 one). The pixels
are those of decoding the whole file (a file whose scans stop short of some coefficients' last
bits, which libjpeg smooths, is decoded whole). Corrupt data below the window or in a scan it
leaves out is therefore not noticed, as in a sequential file's rows below the window: it would
not have changed a pixel of it.

Whole images: :func:`decode_image` and :func:`read_image` (an ``ImageFolder`` loader) take the
place of torchvision's deprecated ``decode_image`` and ``read_image``, with Pillow's pixels and
one pass fewer than Pillow for a JPEG.

Crop-window decoding needs the extension built with libjpeg-turbo (``build_info()["jpeg"]``).
Without it, and for files it cannot decode that way (PNG and other formats, CMYK JPEGs), the
whole image is decoded with Pillow (a JPEG at the same reduced scale) and the window sliced out:
the same pixels, more work.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchfeed._batch_rng import resolve
from torchfeed._options import check_bool, check_generator, check_range
from torchfeed._pil import read_bytes
from torchfeed.limits import check_image_pixels
from torchfeed.ops._image_op import (
    output_box,
    resize_arg,
    resize_center_crop_grid,
    resized_size,
    size_pair,
)
from torchfeed.ops._jpeg import Box, check_box, decode_whole, jpeg_frame_size, jpeg_header
from torchfeed.ops.decode_jpeg_window import decode_jpeg_window
from torchfeed.sampling import resized_crop_box

__all__ = [
    "DecodeCenterCrop",
    "DecodeRandomCrop",
    "decode_image",
    "decode_window",
    "image_size",
    "read_file",
    "read_image",
]


def _as_encoded(data: Any, name: str = "data") -> Tensor:
    """An encoded file as a contiguous 1-D uint8 CPU tensor: from such a tensor (a file's
    bytes, as ``torchvision.io.read_file`` gave them), ``bytes``, ``bytearray``, ``memoryview``
    or a 1-D uint8 numpy array. Shares memory where it can (writable, contiguous buffers);
    copies read-only ones (``bytes``), which a tensor cannot wrap safely."""
    if isinstance(data, Tensor):
        if data.dtype != torch.uint8 or data.dim() != 1 or data.device.type != "cpu":
            raise TypeError(
                f"{name} must be a 1-D uint8 CPU tensor of encoded bytes, got {data.dtype} "
                f"shape {list(data.shape)} on {data.device}"
            )
        if data.numel() == 0:
            raise ValueError(f"{name} is empty (0 bytes)")
        return data.contiguous()
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 1:
            raise TypeError(
                f"{name} must be a 1-D uint8 array of encoded bytes, got {data.dtype} "
                f"shape {list(data.shape)}"
            )
        if data.size == 0:
            raise ValueError(f"{name} is empty (0 bytes)")
        if not data.flags.writeable:  # torch tensors cannot be read-only: copy
            return torch.from_numpy(data.copy())
        return torch.from_numpy(np.ascontiguousarray(data))
    if isinstance(data, bytes | bytearray | memoryview):
        view = memoryview(data)
        if view.nbytes == 0:
            raise ValueError(f"{name} is empty (0 bytes)")
        if view.readonly or not view.c_contiguous:  # bytes, read-only or strided views: copy
            return torch.frombuffer(bytearray(view.tobytes()), dtype=torch.uint8)
        return torch.frombuffer(view.cast("B"), dtype=torch.uint8)
    raise TypeError(
        f"{name} must be encoded bytes (a uint8 tensor, bytes, bytearray, memoryview or numpy "
        f"array), got {type(data).__name__}"
    )


def _slice_window(image: Tensor, box: Any) -> Tensor:
    """The window of a whole decoded image, copied into HWC memory order (the window decoder's
    and torchvision's decoder's order), so ragged collation stays a plain copy."""
    top, left, h, w = check_box(box, image.shape[1], image.shape[2])
    hwc = image.permute(1, 2, 0)[top : top + h, left : left + w]
    return hwc.contiguous().permute(2, 0, 1)


def _decodable_header(data: Tensor) -> tuple[int, int] | None:
    """The JPEG's (height, width) when the window decoder takes it, after checking the size it
    declares against torchfeed.limits (before anything is allocated); None: the fallback."""
    header = jpeg_header(data)
    if header is not None:
        check_image_pixels(*header, "the JPEG")
    return header


def image_size(data: Any) -> tuple[int, int]:
    """(height, width) of an encoded image. JPEGs: from the header alone; other formats are
    decoded to find out."""
    data = _as_encoded(data)
    header = jpeg_header(data)
    if header is not None:
        return header
    image = decode_whole(data)
    return int(image.shape[1]), int(image.shape[2])


def decode_image(data: Any) -> Tensor:
    """The RGB pixels of a whole encoded image: uint8 ``[3, H, W]`` in HWC memory order, as
    ``torchvision.io.decode_image(data, ImageReadMode.RGB)`` returned them (a grayscale or
    palette image is converted to RGB; EXIF orientation is not applied, as there by default).

    A JPEG goes straight from libjpeg-turbo into the tensor (the window decoder with the whole
    image as its window), one pass fewer than Pillow's RGBX image and its copy out: 1.2-1.5x
    faster on photos (README, "Decoding in the loader"), the pixels Pillow's exactly. Other
    formats, CMYK JPEGs and builds without libjpeg-turbo are decoded with
    Pillow. torchvision 0.29 deprecates ``torchvision.io.decode_image``; this takes its place
    in a pipeline that decodes whole images."""
    return _decode_image(_as_encoded(data))


def _decode_image(data: Tensor) -> Tensor:
    source = _Source(data)
    if source.image is not None:  # decoded whole already, to learn its size
        return source.image
    return source.window((0, 0, *source.size))


def read_file(path: str | os.PathLike) -> Tensor:
    """A file's bytes as a 1-D uint8 tensor (what ``torchvision.io.read_file``, deprecated in
    0.29, returned): ``ImageFolder(root, loader=read_file, transform=t)`` hands ``t`` the
    encoded image, and a fused transform (``torchfeed.fuse``, ``RandomResizedCropFlipNormalize``)
    decodes only the pixels its crop reads."""
    if not isinstance(path, str | os.PathLike):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    data = read_bytes(path)
    if data.numel() == 0:
        raise ValueError(f"the file {os.fspath(path)!r} is empty (0 bytes)")
    return data


def read_image(path: str | os.PathLike) -> Tensor:
    """:func:`decode_image` of a file: ``ImageFolder(root, loader=read_image, transform=...)``
    hands the transform uint8 ``[3, H, W]`` tensors in place of PIL images (the fused
    transforms and torchvision's v2 transforms take both)."""
    data = read_file(path)
    try:
        return _decode_image(data)
    except RuntimeError as e:
        raise RuntimeError(f"cannot decode {os.fspath(path)!r}: {e}") from e


def decode_window(
    data: Any, box: Sequence[int] | Tensor, size: int | Sequence[int] | None = None
) -> Tensor:
    """The RGB pixels of ``box`` = (top, left, height, width) of an encoded image: uint8
    ``[3, height, width]`` (HWC memory order, as decoders return it). For JPEGs only the window
    is decoded; the result equals a full decode (Pillow's, or torchvision's)
    ``[:, top:top+height, left:left+width]`` exactly.

    With ``size`` (the size the window will be resized to), a JPEG is decoded at the largest of
    1/2, 1/4 and 1/8 of its size at which the window still has at least ``size`` pixels each
    way, and the window returned is the box in that scaled image (see
    :class:`DecodeRandomCrop`)."""
    pair = None if size is None else size_pair(size)
    return _Source(_as_encoded(data)).window(box, pair)


def _reduction(height: float, width: float, size: tuple[int, int] | None) -> int:
    """The largest of libjpeg-turbo's SIMD-accelerated scales (1/2, 1/4, 1/8) at which a window
    of ``height`` x ``width`` image pixels still has at least ``size`` pixels each way (a pixel
    to spare, for the rounding of the window to whole scaled pixels); 1 without ``size``."""
    if size is None:
        return 1
    for r in (8, 4, 2):
        if height >= r * (size[0] + 1) and width >= r * (size[1] + 1):
            return r
    return 1


def _scaled_box(box: Box, r: int, height: int, width: int) -> Box:
    """``box`` in image pixels as a window of the image decoded at 1/r (``height`` x ``width``
    pixels then): each edge rounded to the nearest scaled pixel."""
    top, left, h, w = box
    t, b = math.floor(top / r + 0.5), math.floor((top + h) / r + 0.5)
    lft, rgt = math.floor(left / r + 0.5), math.floor((left + w) / r + 0.5)
    t, lft = min(t, height - 1), min(lft, width - 1)
    return t, lft, max(1, min(b, height) - t), max(1, min(rgt, width) - lft)


class _Source:
    """An encoded image and what its header says: its size, and whether the window decoder
    takes it (``header``) or, failing that, whether it is a JPEG that the fallback can decode at
    a reduced scale. A file whose size only a full decode tells is decoded once, here."""

    def __init__(self, data: Tensor) -> None:
        self.data = data
        self.header = _decodable_header(data)
        self.image: Tensor | None = None
        if self.header is not None:
            self.size, self.scalable = self.header, True
            return
        size = jpeg_frame_size(data)
        if size is not None:  # a JPEG the window decoder does not take (CMYK, no libjpeg-turbo)
            self.size, self.scalable = size, True
        else:
            self.image = decode_whole(data)
            self.size, self.scalable = (int(self.image.shape[1]), int(self.image.shape[2])), False

    def window(self, box: Any, size: tuple[int, int] | None = None) -> Tensor:
        """The pixels of ``box`` (image pixels), decoded at the largest reduced scale keeping
        ``size`` pixels each way where the file is a JPEG and ``size`` is given."""
        box = check_box(box, *self.size)
        r = _reduction(box[2], box[3], size) if self.scalable else 1
        if self.header is not None:
            if r == 1:
                return decode_jpeg_window(self.data, box)
            h, w = -(-self.header[0] // r), -(-self.header[1] // r)
            return decode_jpeg_window(self.data, _scaled_box(box, r, h, w), r)
        image = self.image if self.image is not None else decode_whole(self.data, r)
        if r == 1:
            return _slice_window(image, box)
        return _slice_window(image, _scaled_box(box, r, image.shape[1], image.shape[2]))


class DecodeRandomCrop:
    """A per-sample transform for the workers: encoded bytes in, the RGB pixels of a random crop
    out (uint8 ``[3, h, w]``), drawn with torchvision's ``RandomResizedCrop`` algorithm
    (``scale``, ``ratio``) and decoded alone (see the module's docstring). Resize, flip and
    normalize the batch afterwards with :class:`torchfeed.transforms.ResizeRandomFlipNormalize`;
    the two together equal ``RandomResizedCrop -> RandomHorizontalFlip -> ToDtype ->
    Normalize``.

    ``size`` (the output size the crop is resized to, e.g. 224; off by default) lets a JPEG be
    decoded at a reduced scale: the largest of 1/2, 1/4 and 1/8 at which the crop still has at
    least ``size`` pixels each way (libjpeg-turbo's scaled IDCT, which skips most of the work of
    a large photo). The window returned is then the crop in the scaled image, each edge rounded
    to a whole scaled pixel, and never smaller than ``size``, so the resize only ever shrinks it.
    The result is not bit-identical to the full-scale path (the scaled IDCT filters otherwise
    than an antialiased resize, and the edges move by up to half a scaled pixel): README's
    "Decoding at reduced scale" gives the measured difference and speed. Without ``size`` the
    window is bit-identical to decoding everything and slicing.

    Draws from ``generator``, else from torch's global generator, which the DataLoader seeds
    apart in each worker (and torchfeed.loader per sample). With ``return_box=True`` it returns
    ``(window, (top, left, height, width))``, the box in the image's own pixels, for targets
    that must follow the crop."""

    def __init__(
        self,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        generator: torch.Generator | None = None,
        return_box: bool = False,
        size: int | Sequence[int] | None = None,
    ) -> None:
        self.scale = check_range("scale", scale, positive=False)
        self.ratio = check_range("ratio", ratio, positive=True)
        self.generator = check_generator(generator)
        check_bool("return_box", return_box)
        self.return_box = return_box
        self.size = None if size is None else size_pair(size)

    def __call__(self, data: Any) -> Tensor | tuple[Tensor, Box]:
        source = _Source(_as_encoded(data))
        box = resized_crop_box(*source.size, self.scale, self.ratio, resolve(self.generator))
        window = source.window(box, self.size)
        return (window, box) if self.return_box else window

    def __repr__(self) -> str:
        size = "" if self.size is None else f", size={self.size}"
        return f"{type(self).__name__}(scale={self.scale}, ratio={self.ratio}{size})"


class DecodeCenterCrop:
    """The evaluation transform's decode: encoded bytes in, the pixels that ``Resize(resize) ->
    CenterCrop(crop)`` keeps out (uint8 ``[3, h, w]``, the smallest window of whole image pixels
    holding them), decoded alone; at the largest reduced scale (1/2, 1/4, 1/8) at which that
    window still has at least ``crop`` pixels each way when ``reduced`` (the default: an
    evaluation set of large photos decodes several times faster). Resize the windows to
    ``crop`` afterwards (``ResizeRandomFlipNormalize(crop, p_flip=0)``). The result approximates
    ``ResizeCenterCropNormalize(resize, crop)`` on the full image: the window's edges are rounded
    to whole (scaled) pixels, and the reduced scale filters otherwise; README's "Decoding at
    reduced scale" gives the measured difference."""

    def __init__(
        self, resize: int | Sequence[int], crop: int | Sequence[int], reduced: bool = True
    ) -> None:
        self.resize = resize_arg(resize)
        self.crop = size_pair(crop, "crop")
        check_bool("reduced", reduced)
        self.reduced = reduced

    def box(self, height: int, width: int) -> Box:
        """The window of a ``height`` x ``width`` image that the center crop keeps, in its
        pixels (the preimage of the crop under the resize, widened to whole pixels)."""
        rh, rw = resized_size(height, width, self.resize)
        if self.crop[0] > rh or self.crop[1] > rw:
            raise ValueError(
                f"DecodeCenterCrop: crop {self.crop} is larger than the {height} x {width} image "
                f"resized to ({rh}, {rw})"
            )
        sizes = torch.tensor([[height, width]], dtype=torch.int64)
        return output_box(resize_center_crop_grid(sizes, self.resize, self.crop), self.crop)

    def __call__(self, data: Any) -> Tensor:
        source = _Source(_as_encoded(data))
        return source.window(self.box(*source.size), self.crop if self.reduced else None)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resize={self.resize}, crop={self.crop}, reduced={self.reduced})"
        )
