"""JPEG (and PNG) test files made with Pillow: every chroma subsampling, progressive, restart
markers, grayscale, odd sizes, and the boxes to decode from them (shared by the decode tests)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import torchfeed.ops._jpeg as jpeg_op

needs_window_decoder = pytest.mark.skipif(
    not jpeg_op.window_decoder(),
    reason="built without libjpeg-turbo (build_info()['jpeg'] is None)",
)


def picture(h: int, w: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """Smooth gradients plus noise: chroma varies across every block edge, so an upsampling
    mistake at a window's edge shows."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(3 * x + y) % 256, (5 * y) % 256, (x * y // 7) % 256], -1)
    rgb = (rgb + rng.integers(0, 48, rgb.shape)).clip(0, 255).astype(np.uint8)
    return Image.fromarray(rgb).convert(mode)


def encode(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


# Every chroma subsampling libjpeg's encoder writes, progressive, restart markers, grayscale,
# sizes that are not multiples of the 8/16-pixel blocks, and 1 x 1.
JPEGS = {
    "4:2:0": lambda: encode(picture(123, 157), quality=90, subsampling=2),
    "4:2:2": lambda: encode(picture(131, 150, seed=1), quality=90, subsampling=1),
    "4:4:4": lambda: encode(picture(97, 203, seed=2), quality=90, subsampling=0),
    "progressive": lambda: encode(picture(200, 301, seed=3), quality=85, progressive=True),
    "restart markers": lambda: encode(picture(150, 170, seed=4), quality=80, restart_marker_rows=1),
    "grayscale": lambda: encode(picture(77, 91, "L", seed=5)),
    "1x1": lambda: encode(picture(1, 1, seed=6)),
    "1 row": lambda: encode(picture(1, 66, seed=7)),
}


def full_decode(data: bytes) -> torch.Tensor:
    """The whole image decoded to RGB by Pillow (its libjpeg-turbo), uint8 ``[3, H, W]``: the
    reference every window is a slice of. A file Pillow cannot read raises RuntimeError."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            rgb = np.asarray(im.convert("RGB")).copy()
    except (OSError, SyntaxError, ValueError) as e:
        raise RuntimeError(f"Pillow cannot decode it: {e}") from e
    return torch.from_numpy(rgb).permute(2, 0, 1)


def random_boxes(height: int, width: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


def edge_boxes(height: int, width: int):
    """The whole image, every corner, and 1-pixel strips along each border."""
    yield 0, 0, height, width
    for top in (0, height - 1):
        for left in (0, width - 1):
            yield top, left, 1, 1
    yield 0, 0, 1, width
    yield height - 1, 0, 1, width
    yield 0, 0, height, 1
    yield 0, width - 1, height, 1
    yield height // 2, width // 2, height - height // 2, width - width // 2


def scans(data: bytes) -> list[tuple[int, int, list[int], int, int, int]]:
    """Every scan a decoder reads from a JPEG, up to its end of image (EOI): (offset of the SOS
    marker, offset of the marker after its data, component ids, Ss, Se, Al). A marker walk: the
    segments by their lengths, and inside entropy-coded data a 0xFF followed by a stuffed zero
    or a restart marker is data. Stops at anything it cannot follow."""
    found: list[tuple[int, int, list[int], int, int, int]] = []
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        while at + 1 < len(data) and data[at + 1] == 0xFF:
            at += 1  # fill bytes
        code = data[at + 1]
        if code == 0xD9:  # end of image: what follows is never read
            break
        end = at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        if code == 0xDA:
            ns = data[at + 4]
            header = data[at + 5 : at + 5 + 2 * ns + 3]
            if not 1 <= ns <= 4 or len(header) < 2 * ns + 3:
                break
            scan_end = end
            while (
                (scan_end := data.find(b"\xff", scan_end)) >= 0
                and scan_end + 1 < len(data)
                and (data[scan_end + 1] == 0 or 0xD0 <= data[scan_end + 1] <= 0xD7)
            ):
                scan_end += 2
            scan_end = scan_end if scan_end >= 0 else len(data)
            ids = [header[2 * k] for k in range(ns)]
            ss, se, al = header[2 * ns], header[2 * ns + 1], header[2 * ns + 2] & 15
            found.append((at, scan_end, ids, ss, se, al))
            end = scan_end
        at = end
    return found


def without_scan(data: bytes, k: int) -> bytes:
    """The JPEG without its k-th scan (its header and data; the tables between scans stay): a
    valid progressive file whose coefficients stop short of some bits."""
    at, end, *_ = scans(data)[k]
    return data[:at] + data[end:]


def sends_every_bit(data: bytes) -> bool:
    """Whether a progressive JPEG's scans send every coefficient of every component down to its
    last bit. When they stop short, libjpeg estimates the missing terms (block smoothing) and
    versions of libjpeg-turbo estimate differently, so only a complete file has one true set of
    pixels across libraries. An unreadable scan list counts as incomplete."""
    sof = data.find(b"\xff\xc2")
    if sof < 0 or sof + 10 > len(data):
        return sof < 0  # not progressive: a sequential scan sends everything
    components = data[sof + 9]
    ids = [data[sof + 10 + 3 * c] for c in range(components) if sof + 10 + 3 * c < len(data)]
    sent_to = {c: [None] * 64 for c in ids}
    for _, _, scan_ids, ss, se, al in scans(data):
        if ss > se or se > 63 or any(c not in sent_to for c in scan_ids):
            return False
        for c in scan_ids:
            sent_to[c][ss : se + 1] = [al] * (se - ss + 1)
    return all(bit == 0 for bits in sent_to.values() for bit in bits)
