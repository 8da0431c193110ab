"""Decoding a random crop in a worker: torchfeed's crop-window decode against Pillow's
whole-image decode followed by the same crop (what ``RandomResizedCrop`` does to a PIL image
loaded in ``__getitem__``; torchvision 0.29 deprecates its own decoder), on the same JPEGs with
the same boxes (RandomResizedCrop's default scale, (0.08, 1): the crop covers about half the
image on average). Both give the same pixels (tests/test_decode.py).

Two sets: 64 of the bench dataset's images (300-600 px a side, quality 90), and 12 photo-sized
ones (the bench's large variant: 2-12 MP, some progressive; or 12 files drawn from your own folder,
TORCHFEED_BENCH_PHOTOS=DIR). On each, torchfeed also decodes the window at the largest DCT scale
still giving 224 pixels each way (``DecodeRandomCrop(size=224)``: other pixels, see README), and
the floor is libjpeg-turbo decoding the whole file at 1/8 scale (Pillow's draft mode), about
the cost of reading its entropy-coded data once. A third group decodes whole progressive files at
1/8, which torchfeed does without the scans that scale never reads; a fourth, random crops of
progressive files at reduced scale, which torchfeed decodes only down to the crop's last row
(libjpeg decodes all of a progressive file's scans before its first row comes out). The last
group decodes whole images (``decode_image``) against Pillow's decode into a tensor.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import torchfeed.decode as tio
import torchfeed.ops._jpeg as jpeg_op
from torchfeed._doctor import _header  # (height, width, format, progressive) from Pillow
from torchfeed._pil import decode_rgb, encode_jpeg
from torchfeed._pipeline_bench.dataset import (
    list_image_folder,
    photo_encoding,
    sample_image_folder,
    synthetic_image,
    synthetic_photo,
)
from torchfeed.decode import _reduction, _scaled_box
from torchfeed.sampling import resized_crop_box

SETS = ("64 JPEGs 300-600 px", "12 photo-sized JPEGs")


def _files(name: str) -> list[bytes]:
    if name == SETS[0]:
        return [encode_jpeg(synthetic_image(i), quality=90) for i in range(64)]
    folder = os.environ.get("TORCHFEED_BENCH_PHOTOS")
    if folder:
        return [p.read_bytes() for p in sample_image_folder(Path(folder), 12)[0]]
    return [encode_jpeg(synthetic_photo(i), **photo_encoding(i)) for i in range(12)]


@pytest.fixture(scope="module", params=SETS)
def jpegs(request):
    files = _files(request.param)
    g = torch.Generator().manual_seed(0)
    boxes = [resized_crop_box(*tio.image_size(f), generator=g) for f in files]
    return f"decode random crop, {request.param} (CPU)", files, boxes


def test_decode_crop_torchfeed_window(benchmark, role, jpegs):
    if not jpeg_op.window_decoder():
        pytest.skip("built without libjpeg-turbo")
    benchmark.group, files, boxes = jpegs
    role("torchfeed")
    benchmark(lambda: [tio.decode_window(f, b) for f, b in zip(files, boxes, strict=True)])


def test_decode_crop_torchfeed_window_reduced_scale(benchmark, role, jpegs):
    benchmark.group, files, boxes = jpegs
    role("torchfeed")
    size = (224, 224)
    benchmark(
        lambda: [tio.decode_window(f, b, size=size) for f, b in zip(files, boxes, strict=True)]
    )


def test_decode_crop_pillow_full_then_crop(benchmark, role, jpegs):
    benchmark.group, files, boxes = jpegs
    role("baseline")

    def run():
        out = []
        for f, (top, left, h, w) in zip(files, boxes, strict=True):
            image = decode_rgb(torch.frombuffer(bytearray(f), dtype=torch.uint8))
            out.append(image[:, top : top + h, left : left + w])
        return out

    benchmark(run)


def test_decode_floor_pillow_whole_file_at_one_eighth(benchmark, role, jpegs):
    benchmark.group, files, _ = jpegs
    role("floor")
    encoded = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]
    benchmark(lambda: [decode_rgb(e, reduce=8) for e in encoded])


# Progressive photos decoded whole at 1/8: the window decoder leaves out the AC scans that scale
# never reads (the same pixels); Pillow's draft decode of the same files is libjpeg-turbo doing
# all the work, the baseline (and the floor of the sets above). Six of the large variant's
# progressive files (every fifth is), or the progressive ones of TORCHFEED_BENCH_PHOTOS.
PROGRESSIVE = "whole progressive photo-sized JPEGs at 1/8 (CPU)"


@pytest.fixture(scope="module")
def progressive():
    folder = os.environ.get("TORCHFEED_BENCH_PHOTOS")
    if folder:
        paths = [p for p in list_image_folder(Path(folder))[0] if (h := _header(p)) and h[3]]
        files = [p.read_bytes() for p in paths[:12]]
    else:
        files = [encode_jpeg(synthetic_photo(i), **photo_encoding(i)) for i in range(0, 30, 5)]
    if not files:
        pytest.skip("no progressive JPEGs")
    return [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files]


def test_decode_progressive_torchfeed_without_unread_scans(benchmark, role, progressive):
    if not jpeg_op.window_decoder():
        pytest.skip("built without libjpeg-turbo")
    benchmark.group = PROGRESSIVE
    role("torchfeed")
    shapes = [tuple(decode_rgb(e, reduce=8).shape[1:]) for e in progressive]

    def run():
        return [
            torch.ops.torchfeed.decode_jpeg_window(e, 0, 0, h, w, 0, 8)
            for e, (h, w) in zip(progressive, shapes, strict=True)
        ]

    out = benchmark(run)
    pillow = [decode_rgb(e, reduce=8) for e in progressive]
    assert all(torch.equal(a, b) for a, b in zip(out, pillow, strict=True))  # the same pixels


def test_decode_progressive_pillow_at_one_eighth(benchmark, role, progressive):
    benchmark.group = PROGRESSIVE
    role("baseline")
    benchmark(lambda: [decode_rgb(e, reduce=8) for e in progressive])


# Random crops of the same progressive files at reduced scale (the scale DecodeRandomCrop(size=224)
# picks): torchfeed's window decoder against Pillow's decode of the whole file at that scale,
# sliced. The same pixels (checked); torchfeed decodes each scan only down to the crop's rows.
PROGRESSIVE_CROPS = "random crops of progressive photo-sized JPEGs at reduced scale (CPU)"


@pytest.fixture(scope="module")
def progressive_crops(progressive):
    g = torch.Generator().manual_seed(0)
    crops = []
    for e in progressive:
        height, width = tio.image_size(e)
        box = resized_crop_box(height, width, generator=g)
        r = _reduction(box[2], box[3], (224, 224))
        crops.append((e, r, _scaled_box(box, r, -(-height // r), -(-width // r))))
    return crops


def test_decode_progressive_crop_torchfeed_window(benchmark, role, progressive_crops):
    if not jpeg_op.window_decoder():
        pytest.skip("built without libjpeg-turbo")
    benchmark.group = PROGRESSIVE_CROPS
    role("torchfeed")

    def run():
        return [
            torch.ops.torchfeed.decode_jpeg_window(e, *box, 0, r) for e, r, box in progressive_crops
        ]

    out = benchmark(run)
    for window, (e, r, (top, left, h, w)) in zip(out, progressive_crops, strict=True):
        assert torch.equal(window, decode_rgb(e, reduce=r)[:, top : top + h, left : left + w])


def test_decode_progressive_crop_pillow_scaled_then_crop(benchmark, role, progressive_crops):
    benchmark.group = PROGRESSIVE_CROPS
    role("baseline")

    def run():
        return [
            decode_rgb(e, reduce=r)[:, top : top + h, left : left + w]
            for e, r, (top, left, h, w) in progressive_crops
        ]

    benchmark(run)


# Whole images, as a pipeline that decodes every pixel does (the collate-then-crop pipelines,
# ImageFolder's loader): torchfeed.decode.decode_image (libjpeg-turbo straight into the tensor)
# against Pillow's decode into a tensor (its RGBX image, then the copy out). The same pixels
# (checked).
@pytest.fixture(scope="module", params=SETS)
def whole(request):
    files = [torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in _files(request.param)]
    return f"decode whole images, {request.param} (CPU)", files


def test_decode_whole_torchfeed(benchmark, role, whole):
    if not jpeg_op.window_decoder():
        pytest.skip("built without libjpeg-turbo")
    benchmark.group, files = whole
    role("torchfeed")
    out = benchmark(lambda: [tio.decode_image(f) for f in files])
    assert all(torch.equal(a, decode_rgb(f)) for a, f in zip(out, files, strict=True))


def test_decode_whole_pillow(benchmark, role, whole):
    benchmark.group, files = whole
    role("baseline")
    benchmark(lambda: [decode_rgb(f) for f in files])
