"""The decode_jpeg_window op itself: opcheck, its own argument checks, torch.compile."""

from __future__ import annotations

import pytest
import torch

from jpeg_cases import JPEGS, encode, full_decode, needs_window_decoder, picture


@needs_window_decoder
def test_opcheck():
    data = torch.frombuffer(bytearray(JPEGS["4:2:0"]()), dtype=torch.uint8)
    for box in [(0, 0, 123, 157), (40, 17, 33, 61), (122, 156, 1, 1)]:
        torch.library.opcheck(torch.ops.torchfeed.decode_jpeg_window.default, (data, *box))
    # at 1/4 the 123 x 157 image is 31 x 40
    for box in [(0, 0, 31, 40), (5, 7, 11, 13), (30, 39, 1, 1)]:
        torch.library.opcheck(
            torch.ops.torchfeed.decode_jpeg_window.default, (data, *box, 89478485, 4)
        )


@needs_window_decoder
def test_raw_op_errors():
    op = torch.ops.torchfeed.decode_jpeg_window
    data = torch.frombuffer(bytearray(JPEGS["4:2:0"]()), dtype=torch.uint8)
    with pytest.raises(TypeError, match="data must be uint8"):
        op(data.float(), 0, 0, 1, 1)
    with pytest.raises(ValueError, match="data must be a contiguous 1-D tensor"):
        op(data.reshape(1, -1), 0, 0, 1, 1)
    with pytest.raises(ValueError, match="data must be a contiguous 1-D tensor"):
        op(data[::2], 0, 0, 1, 1)
    with pytest.raises(ValueError, match="data is empty"):
        op(data[:0], 0, 0, 1, 1)
    with pytest.raises(ValueError, match=r"height and width must be >= 1, got 0 x 1"):
        op(data, 0, 0, 0, 1)
    with pytest.raises(ValueError, match=r"must lie inside the 123 x 157 image"):
        op(data, 0, 1, 1, 157)
    for denom in (0, 3, 16, -2):
        with pytest.raises(ValueError, match=f"scale_denom must be 1, 2, 4 or 8.*got {denom}"):
            op(data, 0, 0, 1, 1, 89478485, denom)
    # the box is checked against the scaled image: 123 x 157 at 1/8 is 16 x 20
    with pytest.raises(
        ValueError, match=r"inside the 16 x 20 image \(the JPEG at 1/8 of its size\)"
    ):
        op(data, 0, 0, 17, 1, 89478485, 8)
    cmyk = torch.frombuffer(bytearray(encode(picture(8, 8, "CMYK"))), dtype=torch.uint8)
    with pytest.raises(ValueError, match="CMYK/YCCK"):
        op(cmyk, 0, 0, 1, 1)
    with pytest.raises(RuntimeError, match="not a readable JPEG"):
        op(torch.frombuffer(bytearray(b"\xff\xd8\xffjunk"), dtype=torch.uint8), 0, 0, 1, 1)


@needs_window_decoder
def test_op_under_torch_compile():
    data = torch.frombuffer(bytearray(JPEGS["4:2:2"]()), dtype=torch.uint8)

    @torch.compile(fullgraph=True, backend="eager")
    def fn(d):
        return torch.ops.torchfeed.decode_jpeg_window(d, 10, 20, 30, 40).float().mean(0)

    assert torch.equal(fn(data), full_decode(JPEGS["4:2:2"]())[:, 10:40, 20:60].float().mean(0))
