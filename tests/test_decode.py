"""torchfeed.decode: crop-window decoding against Pillow's whole-image decode, the fallback
without libjpeg-turbo, DecodeRandomCrop in DataLoader workers, and every user error."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfeed
import torchfeed.decode as tio
import torchfeed.ops._jpeg as jpeg_op
from torchfeed.decode import DecodeRandomCrop, decode_window, image_size
from torchfeed.decode import _as_encoded as as_encoded
from torchfeed.sampling import resized_crop_box

from jpeg_cases import (
    JPEGS,
    edge_boxes,
    encode,
    full_decode,
    needs_window_decoder,
    picture,
    random_boxes,
)


@pytest.mark.parametrize("kind", list(JPEGS))
def test_window_equals_full_decode_sliced(kind):
    data = JPEGS[kind]()
    full = full_decode(data)
    height, width = full.shape[1:]
    assert image_size(data) == (height, width)
    for box in [*edge_boxes(height, width), *random_boxes(height, width, 60)]:
        top, left, h, w = box
        window = decode_window(data, box)
        assert window.dtype == torch.uint8 and window.shape == (3, h, w), box
        assert torch.equal(window, full[:, top : top + h, left : left + w]), (kind, box)
        # HWC memory order, like a decoder's output: ragged collation stays one copy
        assert window.permute(1, 2, 0).is_contiguous()


@needs_window_decoder
def test_the_window_decoder_is_the_one_used_for_jpegs(monkeypatch):
    """Guards the test above: for JPEGs the op runs, not the Pillow fallback."""
    monkeypatch.setattr(tio, "decode_whole", None)  # any use of the fallback would raise
    data = JPEGS["4:2:0"]()
    assert decode_window(data, (10, 20, 30, 40)).shape == (3, 30, 40)
    assert image_size(data) == (123, 157)


@pytest.mark.parametrize("kind", ["cmyk", "png", "gray png", "rgba png"])
def test_formats_the_window_decoder_does_not_take_fall_back_to_pillow(kind):
    data = {
        "cmyk": lambda: encode(picture(50, 60, "CMYK")),
        "png": lambda: encode(picture(40, 33), "PNG"),
        "gray png": lambda: encode(picture(21, 35, "L"), "PNG"),
        "rgba png": lambda: encode(picture(30, 30, "RGBA"), "PNG"),
    }[kind]()
    full = full_decode(data)
    height, width = full.shape[1:]
    assert image_size(data) == (height, width)
    for top, left, h, w in [*edge_boxes(height, width), *random_boxes(height, width, 10)]:
        window = decode_window(data, (top, left, h, w))
        assert torch.equal(window, full[:, top : top + h, left : left + w])
        assert window.permute(1, 2, 0).is_contiguous()


def test_fallback_without_the_window_decoder(monkeypatch):
    """A build without libjpeg-turbo: the same pixels, from Pillow."""
    data = JPEGS["4:2:0"]()
    full = full_decode(data)
    monkeypatch.setattr(jpeg_op, "_use_window_decoder", False)
    assert image_size(data) == (123, 157)
    assert torch.equal(decode_window(data, (3, 4, 50, 60)), full[:, 3:53, 4:64])
    crop = DecodeRandomCrop(generator=torch.Generator().manual_seed(1), return_box=True)
    window, (top, left, h, w) = crop(data)
    assert torch.equal(window, full[:, top : top + h, left : left + w])


def test_build_info_names_the_jpeg_library():
    jpeg = torchfeed.build_info()["jpeg"]
    assert (jpeg is None) == (not jpeg_op.window_decoder())
    if jpeg is not None:
        assert jpeg.startswith("libjpeg")


def test_every_kind_of_encoded_input_gives_the_same_window():
    data = JPEGS["4:4:4"]()
    want = decode_window(data, (5, 6, 20, 30))
    as_tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    strided = torch.zeros(2 * len(data), dtype=torch.uint8)
    strided[::2] = as_tensor  # a non-contiguous view of the bytes
    for variant in [
        as_tensor,
        strided[::2],
        bytearray(data),
        memoryview(data),
        np.frombuffer(data, dtype=np.uint8),
    ]:
        assert torch.equal(decode_window(variant, (5, 6, 20, 30)), want)
    arr = np.zeros(2 * len(data), dtype=np.uint8)
    arr[::2] = np.frombuffer(data, dtype=np.uint8)
    assert torch.equal(decode_window(arr[::2], (5, 6, 20, 30)), want)  # non-contiguous numpy
    assert torch.equal(decode_window(data, torch.tensor([5, 6, 20, 30])), want)  # box as tensor


def test_inputs_are_not_modified():
    data = JPEGS["4:2:0"]()
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    before = tensor.clone()
    decode_window(tensor, (0, 0, 10, 10))
    DecodeRandomCrop()(tensor)
    assert torch.equal(tensor, before)


def test_as_encoded_shares_memory_where_it_can():
    tensor = torch.frombuffer(bytearray(JPEGS["1x1"]()), dtype=torch.uint8)
    assert as_encoded(tensor).data_ptr() == tensor.data_ptr()
    array = np.frombuffer(bytearray(JPEGS["1x1"]()), dtype=np.uint8)
    assert as_encoded(array).data_ptr() == array.ctypes.data


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        ("a.jpg", TypeError, "data must be encoded bytes .* got str"),
        (torch.zeros(4, dtype=torch.float32), TypeError, "data must be a 1-D uint8 CPU tensor"),
        (torch.zeros(2, 4, dtype=torch.uint8), TypeError, r"data must be a 1-D .*shape \[2, 4\]"),
        (np.zeros(4, dtype=np.int32), TypeError, "data must be a 1-D uint8 array"),
        (b"", ValueError, r"data is empty \(0 bytes\)"),
        (torch.zeros(0, dtype=torch.uint8), ValueError, r"data is empty \(0 bytes\)"),
    ],
)
def test_bad_data(data, error, match):
    with pytest.raises(error, match=match):
        decode_window(data, (0, 0, 1, 1))
    with pytest.raises(error, match=match):
        image_size(data)
    with pytest.raises(error, match=match):
        DecodeRandomCrop()(data)


@pytest.mark.parametrize("kind", ["4:2:0", "png"])
@pytest.mark.parametrize(
    ("box", "match"),
    [
        ((0, 0, 0, 5), r"box's height and width must be >= 1, got 0 x 5"),
        ((0, 0, 5, -1), r"box's height and width must be >= 1, got 5 x -1"),
        ((-1, 0, 5, 5), r"box \(top -1, left 0, height 5, width 5\) must lie inside the"),
        ((0, 150, 5, 8), r"must lie inside the 123 x 157 image"),
        ((100, 0, 24, 8), r"must lie inside the 123 x 157 image"),
        ((0, 0, 5), r"box must be \(top, left, height, width\), got \(0, 0, 5\)"),
        (7, r"box must be \(top, left, height, width\), got 7"),
    ],
)
def test_bad_box(kind, box, match):
    data = encode(picture(123, 157), "PNG") if kind == "png" else JPEGS[kind]()
    with pytest.raises(ValueError, match=match):
        decode_window(data, box)


@needs_window_decoder
@pytest.mark.parametrize(
    ("text", "refused", "refused_with_rows_cut"),
    [
        ("Premature end of JPEG file", True, True),
        ("Corrupt JPEG data: premature end of data segment", True, True),
        ("Corrupt JPEG data: bad Huffman code", True, True),
        ("Corrupt JPEG data: found marker 0xd9 instead of RST3", True, True),
        ("Corrupt JPEG data: bad arithmetic code", True, True),
        ("Inconsistent progression sequence for component 0 coefficient 1", True, True),
        # a frame header cut short of its scans leaves their rest as "extraneous" bytes
        ("Corrupt JPEG data: 12 extraneous bytes before marker 0xd9", True, False),
        ("Warning: unknown JFIF revision number 1.03", False, False),
        ("Invalid SOS parameters for sequential JPEG", False, False),
    ],
)
def test_libjpeg_warnings_are_told_apart_by_their_text(text, refused, refused_with_rows_cut):
    """The loaded libjpeg's own words decide, never the codes of the headers we compiled
    against: those shift between libjpeg builds (6.2 and 8 APIs, versions)."""
    assert torchfeed._C._testing.jpeg_warning_refused(text) is refused
    assert torchfeed._C._testing.jpeg_warning_refused(text, rows_cut=True) is refused_with_rows_cut


def other_libjpeg() -> str | None:
    """The libjpeg-turbo that Pillow's wheel bundles (3.x, where the build's is 2.1.5 here)."""
    import PIL

    found = sorted((Path(PIL.__file__).parents[1] / "pillow.libs").glob("libjpeg-*.so*"))
    return str(found[0]) if found else None


@needs_window_decoder
@pytest.mark.skipif(other_libjpeg() is None, reason="no second libjpeg (Pillow's bundled one)")
def test_another_libjpeg_loaded_at_run_time_decodes_alike_and_says_so(tmp_path):
    whole = JPEGS["4:2:0"]()
    (tmp_path / "whole.jpg").write_bytes(whole)
    (tmp_path / "cut.jpg").write_bytes(whole[: len(whole) // 2])
    code = f"""
import torch, torchfeed
from torchfeed.decode import decode_window
print(torchfeed.build_info()["jpeg_runtime"])
data = open({str(tmp_path / "whole.jpg")!r}, "rb").read()
torch.save(decode_window(data, (3, 5, 40, 50)), {str(tmp_path / "window.pt")!r})
try:
    decode_window(open({str(tmp_path / "cut.jpg")!r}, "rb").read(), (0, 0, 123, 157))
except RuntimeError as e:
    print(e)
"""
    env = {**os.environ, "LD_PRELOAD": other_libjpeg()}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.splitlines()  # fmt: skip
    assert out[0].startswith(other_libjpeg() + " (its message codes "), out
    assert out[1] == "decode_jpeg_window: corrupt JPEG: Premature end of JPEG file", out
    window = torch.load(tmp_path / "window.pt")
    assert torch.equal(window, decode_window(whole, (3, 5, 40, 50)))


def test_truncated_jpeg_raises_like_pillow():
    data = JPEGS["4:2:0"]()
    cut = data[: len(data) // 2]
    with pytest.raises(RuntimeError):
        full_decode(cut)
    truncated = "Premature end of JPEG file|truncated"  # ours | Pillow's (its wording varies)
    with pytest.raises(RuntimeError, match=truncated):
        decode_window(cut, (0, 0, 123, 157))  # the window needs rows past the cut
    with pytest.raises(RuntimeError, match=truncated):
        decode_window(cut, (120, 0, 3, 5))
    # the header alone is cut: Pillow reports it
    with pytest.raises(RuntimeError):
        decode_window(data[:100], (0, 0, 1, 1))


@pytest.mark.parametrize("data", [b"\xff\xd8\xff\x00garbage" * 3, b"not an image at all"])
def test_garbage_raises(data):
    with pytest.raises(RuntimeError):
        decode_window(data, (0, 0, 1, 1))
    with pytest.raises(RuntimeError):
        DecodeRandomCrop()(data)


@pytest.mark.parametrize("kind", ["4:2:0", "progressive", "grayscale", "png"])
def test_decode_random_crop_is_resized_crop_box_then_the_window(kind):
    data = encode(picture(90, 70), "PNG") if kind == "png" else JPEGS[kind]()
    full = full_decode(data)
    height, width = full.shape[1:]
    crop = DecodeRandomCrop(
        scale=(0.2, 0.9),
        ratio=(0.5, 2.0),
        return_box=True,
        generator=torch.Generator().manual_seed(4),
    )
    g = torch.Generator().manual_seed(4)
    boxes = set()
    for _ in range(20):
        window, box = crop(data)
        assert box == resized_crop_box(height, width, (0.2, 0.9), (0.5, 2.0), g)
        top, left, h, w = box
        assert torch.equal(window, full[:, top : top + h, left : left + w])
        boxes.add(box)
    assert len(boxes) > 10  # a fresh draw each call


def test_decode_random_crop_uses_the_global_generator_by_default():
    data = JPEGS["4:2:0"]()
    crop = DecodeRandomCrop(return_box=True)
    torch.manual_seed(8)
    first = [crop(data)[1] for _ in range(5)]
    torch.manual_seed(8)
    assert [crop(data)[1] for _ in range(5)] == first
    assert not isinstance(DecodeRandomCrop()(data), tuple)


def test_decode_random_crop_pickles():
    crop = pickle.loads(pickle.dumps(DecodeRandomCrop(scale=(0.5, 1.0))))
    assert crop.scale == (0.5, 1.0) and "DecodeRandomCrop" in repr(crop)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(scale=(0.9, 0.1)), ValueError, r"scale must be \(min, max\) with min <= max"),
        (dict(ratio=(0.0, 1.0)), ValueError, "ratio values must be > 0"),
        (dict(generator=1), TypeError, "generator must be a torch.Generator"),
    ],
)
def test_bad_decode_random_crop_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        DecodeRandomCrop(**kwargs)


class EncodedFiles(Dataset):
    def __init__(self, blobs):
        self.blobs = blobs
        self.crop = DecodeRandomCrop(return_box=True)

    def __len__(self):
        return len(self.blobs)

    def __getitem__(self, i):
        window, box = self.crop(self.blobs[i])
        return window, torch.tensor(box), i


def test_in_dataloader_workers():
    blobs = [encode(picture(64 + 8 * i, 80 - 4 * i, seed=i), quality=85) for i in range(12)]
    loader = DataLoader(
        EncodedFiles(blobs),
        batch_size=None,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    boxes = []
    for window, box, i in loader:
        top, left, h, w = box.tolist()
        assert torch.equal(window, full_decode(blobs[i])[:, top : top + h, left : left + w])
        boxes.append((h, w))
    assert len(boxes) == 12 and len(set(boxes)) > 6  # the workers draw apart
