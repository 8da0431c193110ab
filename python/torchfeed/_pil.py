"""Images through Pillow, torchvision's own dependency and the decoder torchfeed falls back to
(torchvision 0.29 deprecates its own ``torchvision.io`` codec in favour of TorchCodec, which
needs FFmpeg; Pillow bundles libjpeg-turbo, decodes JPEGs bit for bit as torchvision did, and
can decode a JPEG at a reduced DCT scale with ``draft``): the pixels of a PIL image as a uint8
tensor, decoding encoded bytes, reading and writing files."""

from __future__ import annotations

import io
import os
import warnings
from typing import Any

import numpy as np
import PIL.Image
import torch
from torch import Tensor

__all__ = [
    "CHANNELS",
    "OP_IMAGE_TYPES",
    "as_op_image",
    "decode_rgb",
    "encode_jpeg",
    "pixels",
    "read_bytes",
]

# PIL modes whose pixels are 8-bit channels, as torchvision's pil_to_tensor reads them ("P" and
# "1" give one channel: palette indices, 0/1), with the channel count.
CHANNELS = {"L": 1, "P": 1, "1": 1, "LA": 2, "RGB": 3, "YCbCr": 3, "RGBA": 4, "CMYK": 4}


def pixels(image: PIL.Image.Image) -> Tensor:
    """An 8-bit PIL image's pixels, uint8 ``[H, W, C]``, with one copy (Pillow's ``tobytes``)."""
    channels = CHANNELS.get(image.mode)
    if channels is None:
        raise TypeError(
            f"a PIL image of mode {image.mode!r} has no 8-bit channels the fused op reads "
            f"(modes {sorted(CHANNELS)}); convert it first, e.g. image.convert('RGB')"
        )
    width, height = image.size
    if image.mode == "1":  # pil_to_tensor reads mode "1" as 0 and 1
        return torch.from_numpy(np.array(image, dtype=np.uint8)).reshape(height, width, 1)
    data = image.tobytes()
    with warnings.catch_warnings():
        # bytes are read-only; nothing writes them (torch warns that it cannot enforce that)
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.frombuffer(data, dtype=torch.uint8)
    return flat.view(height, width, channels)


# What as_op_image takes: v2's rule for what a transform touches, plus numpy images (as ToImage
# takes them)
OP_IMAGE_TYPES = (Tensor, PIL.Image.Image, np.ndarray)


def as_op_image(image: Any, hwc: bool) -> Tensor:
    """An image as the op reads it, without copying where it can: a tensor as it is (a
    ``tv_tensors.Image`` as a plain tensor), a numpy array wrapped, a PIL image's pixels (one copy,
    Pillow's ``tobytes``) viewed ``[C, H, W]`` (``[H, W, C]`` when ``hwc``)."""
    if isinstance(image, Tensor):
        return image if type(image) is Tensor else image.as_subclass(Tensor)
    if isinstance(image, np.ndarray):
        if not image.flags.writeable:  # torch cannot wrap a read-only array
            image = image.copy()
        hwc_view = torch.from_numpy(image)
        return hwc_view if hwc else hwc_view.permute(2, 0, 1)
    if isinstance(image, PIL.Image.Image):
        hwc_view = pixels(image)
        return hwc_view if hwc else hwc_view.permute(2, 0, 1)
    raise TypeError(
        "images must be PIL images, uint8 tensors ([C, H, W], or [H, W, C] with "
        "image_layout='HWC'; [B, C, H, W] for a batch), numpy arrays [H, W, C] or RaggedImages, "
        f"got {type(image).__name__}"
    )


def open_encoded(data: Tensor) -> PIL.Image.Image:
    """A PIL image of encoded bytes (a 1-D uint8 CPU tensor), its header read, nothing decoded."""
    return PIL.Image.open(io.BytesIO(data.numpy().tobytes()))


def decode_rgb(data: Tensor, reduce: int = 1) -> Tensor:
    """The RGB pixels of an encoded image, uint8 ``[3, H, W]`` viewing HWC memory (as
    torchvision's decoder returned them); a JPEG with ``reduce`` of 2, 4 or 8 is decoded at that
    fraction of its size by libjpeg-turbo's scaled IDCT (Pillow's ``draft``)."""
    try:
        return _decode_rgb(data, reduce)
    except PIL.UnidentifiedImageError as e:  # (its words name a BytesIO object: say what it saw)
        head = bytes(data[:8].tolist())
        raise RuntimeError(
            f"cannot decode the image: its first bytes {head!r} match no image format Pillow "
            f"reads ({data.numel()} bytes in all)"
        ) from e
    except (OSError, SyntaxError, ValueError) as e:  # Pillow's words for a file it cannot read
        raise RuntimeError(f"cannot decode the image: {e}") from e


def _decode_rgb(data: Tensor, reduce: int) -> Tensor:
    image = open_encoded(data)
    width, height = image.size
    if reduce > 1 and image.format == "JPEG" and width >= reduce and height >= reduce:
        # Pillow picks the largest scale s with size * s <= the image: floor sizes ask for
        # exactly 1/reduce, whose output is ceil(size / reduce) (libjpeg's rounding)
        image.draft(image.mode, (width // reduce, height // reduce))
    if image.mode != "RGB":
        image = image.convert("RGB")
    return pixels(image).permute(2, 0, 1)


def read_bytes(path: str | os.PathLike) -> Tensor:
    """A file's bytes as a 1-D uint8 tensor."""
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8))


def encode_jpeg(image: Tensor, quality: int = 90, **options: Any) -> bytes:
    """A uint8 ``[3, H, W]`` image as JPEG bytes (Pillow; ``progressive=True`` and the other
    options of ``Image.save``)."""
    buf = io.BytesIO()
    array = image.permute(1, 2, 0).contiguous().numpy()
    PIL.Image.fromarray(array).save(buf, "JPEG", quality=quality, **options)
    return buf.getvalue()
