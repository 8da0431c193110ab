"""torchfeed.decode.decode_image and read_image: whole images, equal to Pillow's decode, through
libjpeg-turbo for JPEGs; every user error. (``ImageFolder(loader=read_image)``:
tests/transforms/test_encoded_input.py.)"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import torchfeed.decode as tio
import torchfeed.ops._jpeg as jpeg_op
from torchfeed.decode import decode_image, read_image

from jpeg_cases import JPEGS, encode, full_decode, needs_window_decoder, picture

OTHER_FORMATS = {
    "cmyk": lambda: encode(picture(50, 60, "CMYK")),
    "png": lambda: encode(picture(40, 33), "PNG"),
    "gray png": lambda: encode(picture(21, 35, "L"), "PNG"),
    "rgba png": lambda: encode(picture(30, 30, "RGBA"), "PNG"),
}


@pytest.mark.parametrize("kind", [*JPEGS, *OTHER_FORMATS])
def test_decode_image_equals_pillows_decode(kind):
    data = {**JPEGS, **OTHER_FORMATS}[kind]()
    image = decode_image(data)
    assert image.dtype == torch.uint8
    assert torch.equal(image, full_decode(data))
    assert image.permute(1, 2, 0).is_contiguous()  # HWC memory, as torchvision's decoder gave


@needs_window_decoder
def test_jpegs_are_decoded_by_the_window_decoder(monkeypatch):
    """Guards the test above: a JPEG does not go through Pillow."""
    monkeypatch.setattr(tio, "decode_whole", None)  # any use of the fallback would raise
    assert decode_image(JPEGS["progressive"]()).shape == (3, 200, 301)


def test_decode_image_without_the_window_decoder(monkeypatch):
    data = JPEGS["4:2:2"]()
    monkeypatch.setattr(jpeg_op, "_use_window_decoder", False)
    assert torch.equal(decode_image(data), full_decode(data))


def test_every_kind_of_encoded_input_gives_the_same_image():
    data = JPEGS["4:4:4"]()
    want = full_decode(data)
    array = np.zeros(2 * len(data), dtype=np.uint8)
    array[::2] = np.frombuffer(data, dtype=np.uint8)
    for variant in [
        torch.frombuffer(bytearray(data), dtype=torch.uint8),
        bytearray(data),
        memoryview(data),
        np.frombuffer(data, dtype=np.uint8),
        array[::2],
    ]:
        assert torch.equal(decode_image(variant), want)


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        ("a.jpg", TypeError, "data must be encoded bytes .* got str"),
        (torch.zeros(4, dtype=torch.float32), TypeError, "data must be a 1-D uint8 CPU tensor"),
        (b"", ValueError, r"data is empty \(0 bytes\)"),
        (
            b"not an image at all",
            RuntimeError,
            r"cannot decode the image: its first bytes b'not an i' match no image format Pillow "
            r"reads \(19 bytes in all\)",
        ),
        (JPEGS["4:2:0"]()[:1500], RuntimeError, "Premature end of JPEG file|truncated"),
    ],
)
def test_decode_image_bad_data(data, error, match):
    with pytest.raises(error, match=match):
        decode_image(data)


def test_read_image(tmp_path):
    data = JPEGS["progressive"]()
    path = tmp_path / "a.jpg"
    path.write_bytes(data)
    assert torch.equal(read_image(path), full_decode(data))
    assert torch.equal(read_image(str(path)), full_decode(data))
    assert pickle.loads(pickle.dumps(read_image)) is read_image  # a loader workers can take


def test_read_image_errors_name_the_file(tmp_path):
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got int"):
        read_image(3)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        read_image(tmp_path / "missing.jpg")
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"the file '.*empty\.jpg' is empty \(0 bytes\)"):
        read_image(empty)
    cut = tmp_path / "cut.jpg"
    cut.write_bytes(JPEGS["4:2:0"]()[:1500])
    with pytest.raises(
        RuntimeError, match=r"cannot decode '.*cut\.jpg': .*(Premature end|truncated)"
    ):
        read_image(cut)
