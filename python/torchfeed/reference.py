"""Pure-PyTorch references of torchfeed's ops.

Each function here states an op's semantics in the plainest code: it is the test oracle, the
baseline in ``bench/``, and the fallback for devices that have no compiled kernel (MPS, ...).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "crop_flip_normalize_float64",
    "crop_flip_normalize_torchvision",
    "pad_packed",
    "pad_sequences",
    "pad_window",
    "resample_matrix",
]


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
        x = TF.resized_crop(
            x,
            int(top),
            int(left),
            int(height),
            int(width),
            list(size),
            interpolation=mode,
            antialias=antialias,
        )
        if flip:
            x = TF.horizontal_flip(x)
        x = x / 255.0 if float_path else TF.to_dtype(x, torch.float32, scale=True)
        out.append(TF.normalize(x, list(mean), list(std)))
    return torch.stack(out)


def resample_matrix(
    size: int,
    start: float,
    extent: float,
    out_size: int,
    interpolation: str = "bilinear",
    antialias: bool = True,
    crop_first: bool = True,
    out_offset: int = 0,
    out_virtual: int | None = None,
) -> Tensor:
    """The ``[out_size, size]`` float64 matrix that resamples one image axis, written from the
    definitions rather than PyTorch's code: output i samples the source at center
    ``start + extent / out_virtual * (out_offset + i + 0.5)`` (pixel k spans [k, k + 1)).

    - bilinear: the two pixels around the center, clamped at the edges;
    - antialiased bilinear: a triangle filter widened by the scale when downscaling, normalized;
    - nearest: the pixel containing ``start + scale * (out_offset + i)`` (PyTorch's "nearest").

    ``crop_first``: taps are confined to the crop's pixels (resized_crop), else to the image
    (resize, then crop).
    """
    import math

    out_virtual = out_size if out_virtual is None else out_virtual
    scale = extent / out_virtual
    lo = math.floor(start) if crop_first else 0
    hi = min(math.ceil(start + extent), size) if crop_first else size
    m = torch.zeros(out_size, size, dtype=torch.float64)
    for i in range(out_size):
        o = out_offset + i
        if interpolation == "nearest":
            k = math.floor(start + scale * o)
            m[i, min(max(k, lo), hi - 1)] = 1.0
        elif not antialias:
            center = start - lo + max(scale * (o + 0.5) - 0.5, 0.0)  # PyTorch clamps at 0
            k0 = min(math.floor(center), hi - lo - 1)
            frac = min(max(center - k0, 0.0), 1.0)
            k1 = min(k0 + 1, hi - lo - 1)
            m[i, lo + k0] += 1.0 - frac
            m[i, lo + k1] += frac
        else:
            center = start - lo + scale * (o + 0.5)
            support = max(scale, 1.0)
            first = max(int(center - support + 0.5), 0)
            last = min(int(center + support + 0.5), hi - lo)
            w = torch.tensor(
                [max(0.0, 1.0 - abs((k + 0.5 - center) / support)) for k in range(first, last)],
                dtype=torch.float64,
            )
            m[i, lo + first : lo + last] = w / w.sum()
    return m


def crop_flip_normalize_float64(
    image: Tensor,
    box: Sequence[float],
    flip: bool,
    size: Sequence[int],
    mean: Sequence[float],
    std: Sequence[float],
    interpolation: str = "bilinear",
    antialias: bool = True,
) -> Tensor:
    """One uint8 image ``[C, H, W]`` through crop (float box) -> resize -> flip -> [0, 1] ->
    normalize, as matrix products in float64."""
    top, left, height, width = (float(v) for v in box)
    _, h, w = image.shape
    my = resample_matrix(h, top, height, size[0], interpolation, antialias)
    mx = resample_matrix(w, left, width, size[1], interpolation, antialias)
    out = my @ image.double() @ mx.T
    if flip:
        out = out.flip(-1)
    m = torch.tensor(mean, dtype=torch.float64).view(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(-1, 1, 1)
    return (out / 255.0 - m) / s
