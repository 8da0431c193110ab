"""Decoding at a reduced scale: the window decoder at 1/2, 1/4 and 1/8 against Pillow's own
reduced decode of the whole file (libjpeg's scaled IDCT, sliced), the scale each transform picks,
the fallback's parity, and the result against the full-scale pipeline."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

import torchfeed.ops._jpeg as jpeg_op
from torchfeed.decode import DecodeCenterCrop, DecodeRandomCrop, decode_window
from torchfeed.ops.decode_jpeg_window import decode_jpeg_window
from torchfeed.transforms import ResizeRandomFlipNormalize

from jpeg_cases import (
    JPEGS,
    encode,
    full_decode,
    needs_window_decoder,
    picture,
    random_boxes,
    scans,
    sends_every_bit,
    without_scan,
)


def pillow_reduced(data: bytes, r: int) -> torch.Tensor:
    """The whole JPEG decoded by Pillow at 1/r (its draft mode picks libjpeg's scale)."""
    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        im.draft(im.mode, (w // r, h // r))
        assert im.size == (math.ceil(w / r), math.ceil(h / r))
        rgb = np.asarray(im.convert("RGB")).copy()
    return torch.from_numpy(rgb).permute(2, 0, 1)


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


LARGE = {
    "4:2:0": lambda: encode(picture(611, 803, seed=8), quality=90, subsampling=2),
    "4:4:4 progressive": lambda: encode(
        picture(480, 517, seed=9), quality=85, subsampling=0, progressive=True
    ),
    "grayscale": lambda: encode(picture(300, 421, "L", seed=10)),
    "4:2:2 restart markers": lambda: encode(
        picture(333, 444, seed=11), quality=80, subsampling=1, restart_marker_rows=1
    ),
    # progressive files the 1/8-scale decoder reads without some of their scans
    "4:2:2 progressive restart markers": lambda: encode(
        picture(350, 461, seed=13), subsampling=1, progressive=True, restart_marker_blocks=7
    ),
    "grayscale progressive optimized": lambda: encode(
        picture(290, 333, "L", seed=14), quality=95, progressive=True, optimize=True
    ),
    "4:2:0 progressive": lambda: encode(
        picture(515, 733, seed=15), quality=75, subsampling=2, progressive=True
    ),
}

# At 1/8, the scans the decoder drops: every AC scan of a component whose blocks become single
# pixels (4:2:0's chroma blocks become 2 x 2 and keep theirs). libjpeg's progressive script has
# 10 scans for colour (2 DC; AC: 4 for luma, 2 for each chroma component) and 6 for grayscale.
DROPPED_AT_EIGHTH = {
    "progressive": 4,  # 4:2:0: luma's AC scans only
    "4:2:0 progressive": 4,
    "4:4:4 progressive": 8,  # every AC scan
    "4:2:2 progressive restart markers": 8,  # 4:2:2 chroma is at full height: 1 x 1 too
    "grayscale progressive optimized": 4,
}


@needs_window_decoder
@pytest.mark.parametrize("r", [2, 4, 8])
@pytest.mark.parametrize("kind", [*LARGE, "progressive", "4:2:2"])
def test_a_scaled_window_is_the_scaled_decode_sliced(kind, r):
    data = (LARGE.get(kind) or JPEGS[kind])()
    scaled = pillow_reduced(data, r)
    height, width = scaled.shape[1:]
    boxes = [(0, 0, height, width), (height - 1, width - 1, 1, 1), *random_boxes(height, width, 8)]
    for top, left, h, w in boxes:
        window = decode_jpeg_window(as_tensor(data), (top, left, h, w), r)
        assert torch.equal(window, scaled[:, top : top + h, left : left + w]), (top, left, h, w)
        assert window.permute(1, 2, 0).is_contiguous()


@needs_window_decoder
@pytest.mark.parametrize("kind", DROPPED_AT_EIGHTH)
def test_a_progressive_file_at_an_eighth_is_decoded_without_its_unread_scans(kind):
    """The window decoder's input at 1/8: the file without the AC scans whose coefficients a
    1 x 1 IDCT never reads (the test above checks its pixels against Pillow's decode of the
    whole file, bit for bit). At 1/2 and 1/4, and for sequential files, nothing is dropped."""
    from torchfeed._extension import C

    data = (LARGE.get(kind) or JPEGS[kind])()
    kept, scans, dropped, rows = C._testing.jpeg_scans_filtered(as_tensor(data), 8)
    assert (scans, dropped) == (6 if "grayscale" in kind else 10, DROPPED_AT_EIGHTH[kind])
    assert rows == Image.open(io.BytesIO(data)).height  # a window down to the last row
    assert len(kept) < len(data) and kept.endswith(b"\xff\xd9")
    # a valid JPEG (Pillow reads it; its pixels differ, as Pillow smooths the blocks whose AC
    # terms are missing, which the window decoder turns off)
    assert pillow_reduced(kept, 8).shape == pillow_reduced(data, 8).shape
    for r in (1, 2, 4):
        assert C._testing.jpeg_scans_filtered(as_tensor(data), r) == (b"", 0, 0, 0)
    sequential = JPEGS["4:4:4"]()
    assert C._testing.jpeg_scans_filtered(as_tensor(sequential), 8) == (b"", 0, 0, 0)


PROGRESSIVE = [kind for kind in DROPPED_AT_EIGHTH if kind != "progressive"]


def scaled_decode(data: bytes, r: int) -> torch.Tensor:
    return full_decode(data) if r == 1 else pillow_reduced(data, r)


@needs_window_decoder
@pytest.mark.parametrize("r", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", PROGRESSIVE)
def test_a_progressive_file_is_decoded_down_to_the_windows_rows_only(kind, r):
    """libjpeg decodes every scan of a progressive file before a row comes out; the window
    decoder's copy of the file declares only the rows down to the window's iMCU row and one more
    (so that chroma upsampling at the window's last row sees the whole file's neighbours), and
    libjpeg skips each scan's data below them. Windows ending on either side of every iMCU
    boundary in the top rows are the whole decode sliced, bit for bit."""
    from torchfeed._extension import C

    data = LARGE[kind]()
    whole = scaled_decode(data, r)
    height, width = whole.shape[1:]
    with Image.open(io.BytesIO(data)) as im:
        image_w, image_h = im.size
    imcu = 16 if kind.startswith("4:2:0") else 8
    for bottom in range(1, min(height, 3 * imcu // r + 3)):
        kept, _, _, rows = C._testing.jpeg_scans_filtered(as_tensor(data), r, bottom)
        assert rows == min(image_h, math.ceil(bottom * r / imcu) * imcu + imcu), bottom
        assert rows < image_h
        with Image.open(io.BytesIO(kept)) as im:
            assert im.size == (image_w, rows)
        for top, left, w in ((bottom - 1, 0, width), (0, width // 3, 5)):
            window = decode_jpeg_window(as_tensor(data), (top, left, bottom - top, w), r)
            assert torch.equal(window, whole[:, top:bottom, left : left + w]), (top, bottom)
    # a window down to the last rows: nothing to cut
    assert C._testing.jpeg_scans_filtered(as_tensor(data), r, height)[3] in (0, image_h)
    with pytest.raises(ValueError, match=f"bottom must be .* height {height}, got {height + 1}"):
        C._testing.jpeg_scans_filtered(as_tensor(data), r, height + 1)
    with pytest.raises(ValueError, match="bottom must be .*, got -1"):
        C._testing.jpeg_scans_filtered(as_tensor(data), r, -1)
    with pytest.raises(ValueError, match="scale_denom must be 1, 2, 4 or 8, got 3"):
        C._testing.jpeg_scans_filtered(as_tensor(data), 3, 1)


@needs_window_decoder
def test_corrupt_data_below_a_progressive_window_is_not_decoded():
    """Like a sequential file's rows below the window, a progressive file's are not decoded: the
    DC scan's data cut short near its end (it runs into the next scan's marker) goes unseen by a
    window in the top rows, whose pixels are the clean file's, and is refused by a window down to
    the last row. A marker where none belongs, below the window, is refused either way: libjpeg
    stops at it when it skips the rest of the scan."""
    clean = LARGE["4:2:0 progressive"]()
    whole = full_decode(clean)
    _, end, *_ = scans(clean)[0]
    cut_short = bytearray(clean)
    del cut_short[end - 400 : end - 10]
    corrupt = as_tensor(bytes(cut_short))
    assert torch.equal(decode_jpeg_window(corrupt, (0, 0, 40, 733), 1), whole[:, :40])
    with pytest.raises(RuntimeError, match="Corrupt JPEG data"):
        decode_jpeg_window(corrupt, (500, 0, 15, 10), 1)
    marker = bytearray(clean)
    marker[end - 10 : end - 8] = b"\xff\x13"
    for box in ((0, 0, 40, 733), (500, 0, 15, 10)):
        with pytest.raises(RuntimeError, match="Corrupt JPEG data|Unsupported marker"):
            decode_jpeg_window(as_tensor(bytes(marker)), box, 1)


@needs_window_decoder
@pytest.mark.parametrize("kind", ["4:2:0 progressive", "4:4:4 progressive"])
def test_a_progressive_file_whose_scans_stop_short_is_read_whole_at_an_eighth(kind):
    """A valid progressive file without one of its last-bit AC scans: libjpeg smooths its
    blocks (it estimates the terms it was never sent, the kept components' too), so decoding it
    without the unread scans and smoothing off would change pixels (4:2:0 without its second
    chroma refinement: by 7 levels). The decoder reads the whole file then, and gives the
    scaled decode's pixels."""
    from torchfeed._extension import C

    data = LARGE[kind]()
    assert sends_every_bit(data)
    last_bits = [k for k, (*_, ss, _se, al) in enumerate(scans(data)) if ss > 0 and al == 0]
    assert len(last_bits) == 3  # one per component
    for k in last_bits:
        short = without_scan(data, k)
        assert not sends_every_bit(short)
        assert C._testing.jpeg_scans_filtered(as_tensor(short), 8) == (b"", 0, 0, 0)
        assert C._testing.jpeg_scans_filtered(as_tensor(short), 1, 1) == (b"", 0, 0, 0)
        eighth = pillow_reduced(short, 8)
        height, width = eighth.shape[1:]
        window = decode_jpeg_window(as_tensor(short), (0, 0, height, width), 8)
        assert torch.equal(window, eighth), k


@needs_window_decoder
@pytest.mark.parametrize("r", [1, 2, 8])
@pytest.mark.parametrize("cut", ["EOI after 4 scans", "no last luma scan"])
def test_every_window_of_a_file_libjpeg_smooths_is_a_slice_of_its_whole_decode(cut, r):
    """A progressive file that ends early (an EOI where a scan was) or lacks a last-bit scan is
    valid, and libjpeg smooths its blocks from their neighbours', two blocks each side: a window
    cropped out of it took its left edge for the image's and differed from the whole decode by
    2 levels. Every window is the whole decode sliced. (Against this machine's libjpeg, not
    Pillow's: versions of libjpeg-turbo smooth differently.)"""
    data = LARGE["4:2:0 progressive"]()
    found = scans(data)
    short = data[: found[4][0]] + b"\xff\xd9" if cut.startswith("EOI") else without_scan(data, 9)
    assert not sends_every_bit(short)
    height, width = math.ceil(515 / r), math.ceil(733 / r)
    whole = decode_jpeg_window(as_tensor(short), (0, 0, height, width), r)
    boxes = [*random_boxes(height, width, 6, seed=r), (height // 3, width // 2, height // 3, 9)]
    for top, left, h, w in boxes:
        window = decode_jpeg_window(as_tensor(short), (top, left, h, w), r)
        assert torch.equal(window, whole[:, top : top + h, left : left + w]), (top, left, h, w)


def scan_data_start(data: bytes, *, ac_of: int | None) -> int:
    """Where the entropy-coded data of a scan begins: the first DC scan (ac_of=None) or the
    first AC scan of component `ac_of`."""
    for at, _end, ids, ss, _se, _al in scans(data):
        if (ac_of is None and ss == 0) or (ids == [ac_of] and ss > 0):
            return at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    raise AssertionError("no such scan")


@needs_window_decoder
def test_corrupt_data_in_a_kept_scan_is_refused_at_an_eighth_and_in_a_dropped_one_unseen():
    """Corrupt entropy-coded data: a marker in the middle of the DC scan, which every scale
    reads, is refused at 1/8 too (whether the filter follows the file or not). The
    luma's first AC scan cut short (its data runs into the next marker) is refused at full
    scale; 1/8 leaves that scan out and returns the clean file's pixels: the corruption could
    not have changed one."""
    clean = LARGE["4:2:0 progressive"]()
    luma = clean[clean.index(b"\xff\xc2") + 10]  # the frame header's first component id
    eighth = pillow_reduced(clean, 8)
    height, width = eighth.shape[1:]
    for ac_of, refused_at_an_eighth in ((None, True), (luma, False)):
        data = bytearray(clean)
        at = scan_data_start(clean, ac_of=ac_of) + 20
        if ac_of is None:
            data[at : at + 2] = b"\xff\x13"  # an unknown marker inside the scan's data
        else:
            del data[at : at + 400]
        corrupt = as_tensor(bytes(data))
        with pytest.raises(RuntimeError, match="Corrupt JPEG data"):
            decode_jpeg_window(corrupt, (0, 0, 10, 10), 1)
        if refused_at_an_eighth:
            with pytest.raises(RuntimeError, match="Corrupt JPEG data"):
                decode_jpeg_window(corrupt, (0, 0, height, width), 8)
        else:
            assert torch.equal(decode_jpeg_window(corrupt, (0, 0, height, width), 8), eighth)


@needs_window_decoder
def test_the_scale_is_the_largest_that_keeps_the_output_size():
    data = LARGE["4:2:0"]()  # 611 x 803
    g = torch.Generator().manual_seed(0)
    crop = DecodeRandomCrop(size=64, scale=(0.02, 1.0), return_box=True, generator=g)
    seen = set()
    for _ in range(80):
        window, (top, left, h, w) = crop(data)
        r = next((r for r in (8, 4, 2) if h >= r * 65 and w >= r * 65), 1)
        seen.add(r)
        assert window.shape[1:] == (
            math.floor((top + h) / r + 0.5) - math.floor(top / r + 0.5),
            math.floor((left + w) / r + 0.5) - math.floor(left / r + 0.5),
        )
        # never less than the output: the resize after it only shrinks
        assert min(window.shape[1:]) >= 64
        if r > 1:  # and one more halving would have gone below it
            assert min(window.shape[1:]) < 4 * 65
    assert seen == {1, 2, 4, 8}


@needs_window_decoder
def test_without_size_the_random_crop_is_the_full_scale_window():
    data = LARGE["4:2:0"]()
    a = DecodeRandomCrop(return_box=True, generator=torch.Generator().manual_seed(3))
    b = DecodeRandomCrop(size=None, return_box=True, generator=torch.Generator().manual_seed(3))
    full = full_decode(data)
    for _ in range(5):
        (wa, box), (wb, box_b) = a(data), b(data)
        top, left, h, w = box
        assert box == box_b and torch.equal(wa, wb)
        assert torch.equal(wa, full[:, top : top + h, left : left + w])


@pytest.mark.parametrize("kind", ["4:2:0", "4:4:4 progressive", "cmyk"])
def test_the_fallback_decodes_at_the_same_scale(kind, monkeypatch):
    """Pillow's reduced decode, sliced, is what the window decoder gives (and what a build
    without libjpeg-turbo, or a CMYK JPEG, gets)."""
    data = (LARGE.get(kind) or (lambda: encode(picture(400, 420, "CMYK", seed=12))))()
    out = []
    for use_window_decoder in (True, False):
        if not jpeg_op.window_decoder() and use_window_decoder:
            continue
        monkeypatch.setattr(jpeg_op, "_use_window_decoder", use_window_decoder)
        g = torch.Generator().manual_seed(5)
        crop = DecodeRandomCrop(size=48, return_box=True, generator=g)
        out.append([*(crop(data) for _ in range(6)), (DecodeCenterCrop(100, 48)(data), None)])
    assert min(out[0][-1][0].shape[1:]) < 400 // 2  # the center crop was reduced
    for (wa, ba), (wb, bb) in zip(out[0], out[-1], strict=True):
        assert ba == bb and torch.equal(wa, wb)


def test_png_is_never_scaled():
    data = encode(picture(400, 400), "PNG")
    window, (top, left, h, w) = DecodeRandomCrop(
        size=32, return_box=True, generator=torch.Generator().manual_seed(1)
    )(data)
    assert torch.equal(window, full_decode(data)[:, top : top + h, left : left + w])
    t = DecodeCenterCrop(64, 32)
    top, left, h, w = t.box(400, 400)
    assert (h, w) == (200, 200)  # 32 of 64 resized pixels: 200 of 400
    assert torch.equal(t(data), full_decode(data)[:, top : top + h, left : left + w])


def center_reference(image: torch.Tensor, resize, crop) -> torch.Tensor:
    """torchvision's evaluation pipeline on the full image, to float in [0, 1]."""
    out = v2.CenterCrop(crop)(v2.Resize(resize, antialias=True)(image))
    return out.float() / 255


@pytest.mark.parametrize(("resize", "crop"), [(256, 224), (64, 56), ((100, 90), 80), (57, 57)])
def test_center_crop_box_is_the_preimage_of_the_crop(resize, crop):
    t = DecodeCenterCrop(resize, crop, reduced=False)
    for height, width in [(611, 803), (803, 611), (300, 300), (1000, 257)]:
        top, left, h, w = t.box(height, width)
        assert top >= 0 and top + h <= height and left >= 0 and left + w <= width
        # it holds the preimage of the crop, widened by under a pixel each side
        rh, rw = v2.functional.resize(torch.empty(1, height, width), resize).shape[1:]
        ch, cw = (crop, crop) if isinstance(crop, int) else crop
        fy, fx = height / rh, width / rw
        ct, cl = round((rh - ch) / 2) * fy, round((rw - cw) / 2) * fx
        assert top <= ct < top + 1 and left <= cl < left + 1
        assert top + h >= ct + ch * fy > top + h - 1 or top + h == height
        assert left + w >= cl + cw * fx > left + w - 1 or left + w == width


@pytest.mark.parametrize("reduced", [False, True])
def test_center_crop_after_its_resize_is_close_to_torchvision(reduced):
    data = LARGE["4:2:0"]()
    full = full_decode(data)
    window = DecodeCenterCrop(96, 80, reduced=reduced)(data)
    if reduced:  # the 611 x 803 image, resized to 96 short side: a window of ~509 px -> 1/4
        assert min(window.shape[1:]) < 611 // 2
    op = ResizeRandomFlipNormalize(80, p_flip=0.0, mean=(0, 0, 0), std=(1, 1, 1))
    ours = op(window.unsqueeze(0))[0]
    theirs = center_reference(full, 96, 80)
    diff = (ours - theirs).abs()
    # rounded edges (under a pixel) and, reduced, another filter: small, not zero
    assert diff.mean() < 0.03 and diff.mean() > 0
    assert ours.shape == theirs.shape == (3, 80, 80)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: DecodeRandomCrop(size=0), ValueError, r"size must be positive"),
        (lambda: DecodeRandomCrop(size=(224, "x")), TypeError, r"size must be an int or"),
        (
            lambda: DecodeRandomCrop(size=True),
            TypeError,
            r"size must be an int or \(height, width\), got bool",
        ),
        (lambda: DecodeRandomCrop(return_box=1), TypeError, r"return_box must be a bool, got int"),
        (lambda: DecodeCenterCrop(256, 0), ValueError, r"crop must be positive"),
        (lambda: DecodeCenterCrop("256", 224), TypeError, r"resize"),
        (
            lambda: DecodeCenterCrop(256, 224, reduced="yes"),
            TypeError,
            r"reduced must be a bool, got str",
        ),
    ],
)
def test_bad_configuration(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_a_crop_larger_than_the_resized_image_is_an_error():
    data = JPEGS["4:2:0"]()  # 123 x 157
    with pytest.raises(
        ValueError,
        match=r"crop \(100, 100\) is larger than the 123 x 157 image resized to \(64, 81\)",
    ):
        DecodeCenterCrop(64, 100)(data)


def test_repr_names_the_options():
    assert repr(DecodeRandomCrop(size=224)).endswith("size=(224, 224))")
    assert (
        repr(DecodeCenterCrop(256, 224))
        == "DecodeCenterCrop(resize=256, crop=(224, 224), reduced=True)"
    )


@pytest.mark.parametrize("kind", ["4:2:0", "4:4:4 progressive"])
def test_decode_window_with_a_size_is_the_random_crops_window(kind):
    data = LARGE[kind]()
    crop = DecodeRandomCrop(size=40, return_box=True, generator=torch.Generator().manual_seed(2))
    for _ in range(5):
        window, box = crop(data)
        assert torch.equal(decode_window(data, box, size=40), window)
        assert torch.equal(decode_window(data, box, size=(40, 40)), window)
    with pytest.raises(ValueError, match="size must be positive"):
        decode_window(data, box, size=-1)
