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
