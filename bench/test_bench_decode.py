"""Decoding a random crop in a worker: torchfeed's crop-window decode against Pillow's
whole-image decode followed by the same crop (what ``RandomResizedCrop`` does to a PIL image
loaded in ``__getitem__``; torchvision 0.29 deprecates its own decoder), on the same 64 JPEGs
(the bench dataset's images, 300-600 px a side, quality 90) with the same boxes
(RandomResizedCrop's default scale, (0.08, 1): the crop covers about half the image on
average). Both give the same pixels (tests/test_decode.py).
"""

from __future__ import annotations

import pytest
import torch

import torchfeed.decode as tio
import torchfeed.ops._jpeg as jpeg_op
from torchfeed._pil import decode_rgb, encode_jpeg
from torchfeed._pipeline_bench.dataset import synthetic_image
from torchfeed.sampling import resized_crop_box

BATCH = 64
GROUP = "decode random crop, 64 JPEGs (CPU)"


@pytest.fixture(scope="module")
def jpegs():
    files = [encode_jpeg(synthetic_image(i), quality=90) for i in range(BATCH)]
    g = torch.Generator().manual_seed(0)
    boxes = [resized_crop_box(*tio.image_size(f), generator=g) for f in files]
    return files, boxes


def test_decode_crop_torchfeed_window(benchmark, role, jpegs):
    if not jpeg_op.window_decoder():
        pytest.skip("built without libjpeg-turbo")
    benchmark.group = GROUP
    role("torchfeed")
    files, boxes = jpegs
    benchmark(lambda: [tio.decode_window(f, b) for f, b in zip(files, boxes, strict=True)])


def test_decode_crop_pillow_full_then_crop(benchmark, role, jpegs):
    benchmark.group = GROUP
    role("baseline")
    files, boxes = jpegs

    def run():
        out = []
        for f, (top, left, h, w) in zip(files, boxes, strict=True):
            image = decode_rgb(torch.frombuffer(bytearray(f), dtype=torch.uint8))
            out.append(image[:, top : top + h, left : left + w])
        return out

    benchmark(run)
