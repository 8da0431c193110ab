"""The decode_jpeg_window op: the RGB pixels of one window of a JPEG, decoding only what the
window needs (``csrc/io/jpeg.cpp``, libjpeg-turbo). This module is its Python face: the typed
wrapper and its fake kernel; what the header says, the box check and the fallback for files the
window decoder does not take are in :mod:`torchfeed.ops._jpeg`, and the feature that picks
between them is :mod:`torchfeed.decode`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from torchfeed.limits import max_image_pixels
from torchfeed.ops._dispatch import read_kernels
from torchfeed.ops._jpeg import Box, window_decoder

__all__ = ["decode_jpeg_window"]


def decode_jpeg_window(data: Tensor, box: Box, reduce: int = 1) -> Tensor:
    """``torch.ops.torchfeed.decode_jpeg_window`` on a box already checked against the header:
    uint8 ``[3, height, width]`` in HWC memory order; with ``reduce`` 2, 4 or 8, the JPEG is
    decoded at that fraction of its size (libjpeg-turbo's scaled IDCT) and ``box`` is in the
    scaled image. The op refuses a JPEG that declares more than
    :func:`torchfeed.limits.max_image_pixels` pixels, and corrupt data in the rows it decodes."""
    limit = max_image_pixels()
    return torch.ops.torchfeed.decode_jpeg_window(
        data, *box, -1 if limit is None else limit, reduce
    )


if window_decoder():

    @torch.library.register_fake("torchfeed::decode_jpeg_window")
    def _decode_jpeg_window_fake(
        data, top, left, height, width, max_pixels=89478485, scale_denom=1
    ):
        return data.new_empty((height, width, 3)).permute(2, 0, 1)


read_kernels("decode_jpeg_window")
