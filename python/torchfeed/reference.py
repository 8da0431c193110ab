"""Pure-PyTorch references of torchfeed's ops.

Each function here states an op's semantics in the plainest code: it is the test oracle, the
baseline in ``bench/``, and the fallback for devices that have no compiled kernel (MPS, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_window(
    n: int, length: int, max_length: int | None, left_pad: bool, truncate_left: bool
) -> tuple[int, int, int]:
    """(kept, out_start, src_skip) of a sequence of ``n`` elements in a row of ``length``.

    The same rule as ``csrc/ops/pad.h``, written independently.
    """
    kept = n if max_length is None else min(n, max_length)
    kept = min(kept, length)
    out_start = length - kept if left_pad else 0
    src_skip = n - kept if truncate_left else 0
    return kept, out_start, src_skip


def pad_sequences(
    sequences: Sequence[Tensor],
    length: int,
    pad_value: float | int | bool = 0,
    left_pad: bool = False,
    max_length: int | None = None,
    truncate_left: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Pads ``sequences`` (each ``[n_i, *feat]``) to ``[B, length, *feat]`` with a Python loop.

    Returns ``(padded, mask, lengths)``: mask ``[B, length]`` bool from the lengths, lengths
    ``[B]`` int64 after truncation.
    """
    first = sequences[0]
    batch = len(sequences)
    padded = torch.full(
        (batch, length, *first.shape[1:]), pad_value, dtype=first.dtype, device=first.device
    )
    mask = torch.zeros(batch, length, dtype=torch.bool, device=first.device)
    lengths = torch.empty(batch, dtype=torch.int64, device=first.device)
    for b, seq in enumerate(sequences):
        kept, out_start, src_skip = pad_window(
            seq.shape[0], length, max_length, left_pad, truncate_left
        )
        padded[b, out_start : out_start + kept] = seq[src_skip : src_skip + kept]
        mask[b, out_start : out_start + kept] = True
        lengths[b] = kept
    return padded, mask, lengths


def pad_packed(
    values: Tensor,
    offsets: Sequence[int],
    length: int,
    pad_value: float | int | bool = 0,
    left_pad: bool = False,
    max_length: int | None = None,
    truncate_left: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`pad_sequences` for packed ``values`` ``[N, *feat]`` split at host ``offsets``."""
    offsets = list(offsets)
    if len(offsets) == 1:
        empty = values.new_empty((0, length, *values.shape[1:]))
        return (
            empty,
            torch.zeros(0, length, dtype=torch.bool, device=values.device),
            torch.zeros(0, dtype=torch.int64, device=values.device),
        )
    seqs = [values[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    return pad_sequences(seqs, length, pad_value, left_pad, max_length, truncate_left)


def crop_flip_normalize_torchvision(
    images: Sequence[Tensor],
    boxes: Sequence[Sequence[int]],
    flips: Sequence[bool],
    size: Sequence[int],
    mean: Sequence[float],
    std: Sequence[float],
    interpolation: str = "bilinear",
    antialias: bool = True,
    float_path: bool = True,
) -> Tensor:
    """torchvision v2 image by image: ``resized_crop -> horizontal_flip -> to float in [0, 1] ->
    normalize``, stacked. ``float_path`` converts each uint8 image to float first (no rounding
    after the resize, torchfeed's semantics); otherwise torchvision resizes the uint8 image and
    rounds, as its usual pipeline does."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as TF

    mode = InterpolationMode.NEAREST if interpolation == "nearest" else InterpolationMode.BILINEAR
    out = []
    for image, (top, left, height, width), flip in zip(images, boxes, flips, strict=True):
        x = image.float() if float_path else image
        x = TF.resized_crop(x, int(top), int(left), int(height), int(width), list(size),
                            interpolation=mode, antialias=antialias)  # fmt: skip
        if flip:
            x = TF.horizontal_flip(x)
        x = x / 255.0 if float_path else TF.to_dtype(x, torch.float32, scale=True)
        out.append(TF.normalize(x, list(mean), list(std)))
    return torch.stack(out)
