"""The JPEG plumbing of the window decoder (the op's public face is
:mod:`torchfeed.ops.decode_jpeg_window`): what a file's header says (size, decodability by the
window decoder), the box check, and the fallback for builds without libjpeg-turbo and for files
it cannot decode that way (PNG and other formats, CMYK JPEGs): Pillow's full decode (the pixels
torchvision's decoder gave), then a slice (the same pixels, more work)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from torchfeed._extension import C
from torchfeed._pil import decode_rgb
from torchfeed.limits import check_image_pixels

__all__ = [
    "Box",
    "check_box",
    "decode_whole",
    "jpeg_frame_size",
    "jpeg_header",
    "png_size",
    "use_window_decoder",
    "window_decoder",
]

Box = tuple[int, int, int, int]

_JPEG_MAGIC = b"\xff\xd8\xff"

# Whether the window decoder is used: built with libjpeg-turbo (the tests switch it off, through
# use_window_decoder, to check the fallback).
_use_window_decoder = hasattr(C, "jpeg_info")


def window_decoder() -> bool:
    """Whether JPEGs are decoded window by window (a build with libjpeg-turbo)."""
    return _use_window_decoder


def use_window_decoder(enabled: bool) -> None:
    """Switches the window decoder off (or back on, where built): the fallback for every file."""
    global _use_window_decoder
    _use_window_decoder = bool(enabled) and hasattr(C, "jpeg_info")


def jpeg_header(data: Tensor) -> tuple[int, int] | None:
    """(height, width) when the window decoder can decode ``data`` (encoded bytes, a 1-D uint8
    CPU tensor), else None."""
    if not _use_window_decoder or data.numel() < 4 or bytes(data[:3].tolist()) != _JPEG_MAGIC:
        return None
    try:
        height, width, _, rgb_decodable = C.jpeg_info(data)
    except RuntimeError:
        return None  # unreadable header: the fallback decoder gives the error
    return (height, width) if rgb_decodable else None


def decode_whole(data: Tensor, reduce: int = 1) -> Tensor:
    """The fallback: Pillow decodes the whole image (RGB, uint8 ``[3, H, W]`` in HWC memory; a
    JPEG at 1/``reduce`` of its size), after checking the size its header declares (JPEG, PNG)
    against :func:`torchfeed.limits.max_image_pixels`."""
    size = png_size(data) or jpeg_frame_size(data)
    if size is not None:
        check_image_pixels(*size, "the image")
    return decode_rgb(data, reduce)


# Start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC): the frame header holding the size.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_frame_size(data: Tensor) -> tuple[int, int] | None:
    """(height, width) from a JPEG's frame header, read by walking its marker segments (no
    decoder needed, so builds without libjpeg-turbo check the pixel limit too); None when
    ``data`` is not a JPEG or no frame header comes before the scan data."""
    if data.numel() < 4 or bytes(data[:3].tolist()) != _JPEG_MAGIC:
        return None
    buf = data.contiguous().numpy().data  # a memoryview: no copy
    i = 2
    while i + 4 <= len(buf):
        if buf[i] != 0xFF:
            return None  # not a marker where one must be: leave the verdict to the decoder
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a segment
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or the scan: no frame header before it
            return None
        length = int.from_bytes(buf[i + 2 : i + 4], "big")
        if marker in _SOF:
            if length < 7 or i + 9 > len(buf):
                return None
            return int.from_bytes(buf[i + 5 : i + 7], "big"), int.from_bytes(
                buf[i + 7 : i + 9], "big"
            )
        if length < 2:
            return None
        i += 2 + length
    return None


def check_box(box: Any, height: int, width: int) -> Box:
    if not isinstance(box, Sequence | Tensor) or len(box) != 4:
        raise ValueError(f"box must be (top, left, height, width), got {box!r}")
    top, left, h, w = (int(v) for v in (box.tolist() if isinstance(box, Tensor) else box))
    if h < 1 or w < 1:
        raise ValueError(f"box's height and width must be >= 1, got {h} x {w}")
    if top < 0 or left < 0 or top + h > height or left + w > width:
        raise ValueError(
            f"box (top {top}, left {left}, height {h}, width {w}) must lie inside the "
            f"{height} x {width} image"
        )
    return top, left, h, w


def png_size(data: Tensor) -> tuple[int, int] | None:
    """(height, width) from a PNG's IHDR chunk, or None if ``data`` is not a PNG."""
    if data.numel() < 24 or bytes(data[:8].tolist()) != b"\x89PNG\r\n\x1a\n":
        return None
    ihdr = bytes(data[12:24].tolist())
    if ihdr[:4] != b"IHDR":
        return None
    return int.from_bytes(ihdr[8:12], "big"), int.from_bytes(ihdr[4:8], "big")
