"""Decoding in the workers: decode only the part of an image that the random crop keeps.

With ``RandomResizedCrop``'s default scale (0.08, 1) the crop covers about half of the image on
average, yet the usual pipeline decodes every pixel and then throws the rest away. Here the
worker reads the JPEG's header, draws the crop there (torchvision's algorithm), and libjpeg-turbo
decodes just that window: rows below it are never decoded, and rows above it and columns beside
it are only entropy-decoded. (NVIDIA DALI's ``decoders.image_random_crop`` does the same.) The
window's pixels are bit-identical to a full decode sliced afterwards, so what follows (resize,
flip, normalize: :class:`torchfeed.transforms.ResizeRandomFlipNormalize`) gives exactly the
result of the usual ``RandomResizedCrop`` on the full image.

Crop-window decoding needs the extension built with libjpeg-turbo (``build_info()["jpeg"]``).
Without it, and for files it cannot decode that way (PNG and other formats, CMYK JPEGs), the
whole image is decoded with torchvision and the window sliced out: the same pixels, more work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchfeed._options import check_generator, check_range
from torchfeed.limits import check_image_pixels
from torchfeed.ops._jpeg import Box, check_box, decode_whole, jpeg_header
from torchfeed.ops.decode_jpeg_window import decode_jpeg_window
from torchfeed.sampling import resized_crop_box

__all__ = ["DecodeRandomCrop", "decode_window", "image_size"]


def _as_encoded(data: Any, name: str = "data") -> Tensor:
    """An encoded file as a contiguous 1-D uint8 CPU tensor: from such a tensor (what
    ``torchvision.io.read_file`` returns), ``bytes``, ``bytearray``, ``memoryview`` or a 1-D
    uint8 numpy array. Shares memory where it can (writable, contiguous buffers); copies
    read-only ones (``bytes``), which a tensor cannot wrap safely."""
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


def decode_window(data: Any, box: Sequence[int] | Tensor) -> Tensor:
    """The RGB pixels of ``box`` = (top, left, height, width) of an encoded image: uint8
    ``[3, height, width]`` (HWC memory order, as torchvision's decoder returns). For JPEGs only
    the window is decoded; the result equals ``decode_image(data, RGB)[:, top:top+height,
    left:left+width]`` exactly."""
    data = _as_encoded(data)
    header = _decodable_header(data)
    if header is None:
        return _slice_window(decode_whole(data), box)
    top, left, h, w = check_box(box, *header)
    return decode_jpeg_window(data, (top, left, h, w))


class DecodeRandomCrop:
    """A per-sample transform for the workers: encoded bytes in, the RGB pixels of a random crop
    out (uint8 ``[3, h, w]``), drawn with torchvision's ``RandomResizedCrop`` algorithm
    (``scale``, ``ratio``) and decoded alone (see the module's docstring). Resize, flip and
    normalize the batch afterwards with :class:`torchfeed.transforms.ResizeRandomFlipNormalize`; the
    two together equal ``RandomResizedCrop -> RandomHorizontalFlip -> ToDtype -> Normalize``.

    Draws from ``generator``, else from torch's global generator, which the DataLoader seeds
    apart in each worker (and :func:`torchfeed.data.seed_worker` per rank too). With
    ``return_box=True`` it returns ``(window, (top, left, height, width))``, for targets that
    must follow the crop."""

    def __init__(
        self,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
        generator: torch.Generator | None = None,
        return_box: bool = False,
    ) -> None:
        self.scale = check_range("scale", scale, positive=False)
        self.ratio = check_range("ratio", ratio, positive=True)
        self.generator = check_generator(generator)
        self.return_box = bool(return_box)

    def __call__(self, data: Any) -> Tensor | tuple[Tensor, Box]:
        data = _as_encoded(data)
        header = _decodable_header(data)
        if header is None:
            image = decode_whole(data)
            height, width = image.shape[1], image.shape[2]
            box = resized_crop_box(height, width, self.scale, self.ratio, self.generator)
            window = _slice_window(image, box)
        else:
            box = resized_crop_box(*header, self.scale, self.ratio, self.generator)
            window = decode_jpeg_window(data, box)
        return (window, box) if self.return_box else window

    def __repr__(self) -> str:
        return f"{type(self).__name__}(scale={self.scale}, ratio={self.ratio})"
