"""Random parameters of the batch transforms, drawn per image exactly as torchvision draws them.

:func:`sample_resized_crop_params` is ``RandomResizedCrop.get_params`` vectorized over a batch;
:func:`resized_crop_box` draws the same numbers for one image in plain Python (for workers, a
few microseconds); :func:`sample_flips` is ``RandomHorizontalFlip``'s coin per image. All draw
from a ``torch.Generator`` (the global one by default) on the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchfeed._options import check_p_flip, check_range

__all__ = ["resized_crop_box", "sample_flips", "sample_resized_crop_params"]


def _sizes_list(sizes: Any) -> list[tuple[int, int]]:
    if isinstance(sizes, Tensor):
        sizes = sizes.tolist()
    out = []
    for i, s in enumerate(sizes):
        h, w = (int(v) for v in s)
        if h <= 0 or w <= 0:
            raise ValueError(f"sizes[{i}] must be positive (H, W), got {tuple(s)}")
        out.append((h, w))
    return out


def sample_resized_crop_params(
    sizes: Sequence[tuple[int, int]] | Tensor,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    generator: torch.Generator | None = None,
) -> Tensor:
    """Per image, torchvision's ``RandomResizedCrop.get_params``: up to 10 attempts at an area
    fraction uniform in ``scale`` and an aspect ratio log-uniform in ``ratio``, the first that
    fits placed uniformly, else the central crop of the nearest allowed ratio. Vectorized over
    the batch; draws from ``generator`` (the global generator if None). Returns int64
    ``[B, 4]`` boxes (top, left, height, width)."""
    hw = torch.tensor(_sizes_list(sizes), dtype=torch.float64).reshape(-1, 2)
    scale = check_range("scale", scale, positive=False)
    ratio = check_range("ratio", ratio, positive=True)
    # 22 uniforms per image, in one draw: 10 attempts (area, aspect), then the placement; image
    # b's are the ones resized_crop_box draws for it alone
    draws = torch.rand(hw.shape[0], 22, dtype=torch.float64, generator=generator)
    return _crops_from_uniforms(hw, draws, scale, ratio)


def _crops_from_uniforms(
    hw: Tensor, draws: Tensor, scale: tuple[float, float], ratio: tuple[float, float]
) -> Tensor:
    """The boxes of images of ``hw`` ``[B, 2]`` (float64) from ``draws`` ``[B, >= 22]``."""
    (s0, s1), (r0, r1) = scale, ratio
    batch = hw.shape[0]
    height, width = hw[:, 0:1], hw[:, 1:2]
    area = height * width
    u = draws[:, :20].reshape(batch, 10, 2)
    target_area = area * (s0 + (s1 - s0) * u[..., 0])
    log_ratio = math.log(r0) + (math.log(r1) - math.log(r0)) * u[..., 1]
    aspect = torch.exp(log_ratio)
    # round() is Python's half-to-even, as torch.round is
    w = torch.round(torch.sqrt(target_area * aspect))
    h = torch.round(torch.sqrt(target_area / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    found = fits.any(dim=1)
    first = fits.to(torch.int8).argmax(dim=1, keepdim=True)
    w = w.gather(1, first).squeeze(1)
    h = h.gather(1, first).squeeze(1)
    place = draws[:, 20:22]
    height, width = height.squeeze(1), width.squeeze(1)
    top = torch.floor(place[:, 0] * (height - h + 1))
    left = torch.floor(place[:, 1] * (width - w + 1))
    if not bool(found.all()):
        # torchvision's fallback: the central crop, at the nearest allowed aspect ratio
        in_ratio = width / height
        fw = torch.where(
            in_ratio < r0, width, torch.where(in_ratio > r1, torch.round(height * r1), width)
        )
        fh = torch.where(in_ratio < r0, torch.round(width / r0), height)
        ft = torch.div(height - fh, 2, rounding_mode="floor")
        fl = torch.div(width - fw, 2, rounding_mode="floor")
        w, h = torch.where(found, w, fw), torch.where(found, h, fh)
        top, left = torch.where(found, top, ft), torch.where(found, left, fl)
    return torch.stack([top, left, h, w], dim=1).to(torch.int64)


def resized_crop_box(
    height: int,
    width: int,
    scale: Sequence[float] = (0.08, 1.0),
    ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
    generator: torch.Generator | None = None,
) -> tuple[int, int, int, int]:
    """:func:`sample_resized_crop_params` for ONE image of ``height`` x ``width``, in plain Python
    (a few microseconds instead of ~100: for drawing per sample in a worker). It draws the same
    numbers in the same order, so the same generator state gives the same box. Returns
    ``(top, left, height, width)``."""
    if height < 1 or width < 1:
        raise ValueError(f"the image must be at least 1 x 1, got {height} x {width}")
    s0, s1 = check_range("scale", scale, positive=False)
    r0, r1 = check_range("ratio", ratio, positive=True)
    u = torch.rand(22, dtype=torch.float64, generator=generator).tolist()
    area = float(height * width)
    log_r0, log_r1 = math.log(r0), math.log(r1)
    for i in range(10):
        target_area = area * (s0 + (s1 - s0) * u[2 * i])
        aspect = math.exp(log_r0 + (log_r1 - log_r0) * u[2 * i + 1])
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = math.floor(u[20] * (height - h + 1))
            left = math.floor(u[21] * (width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < r0:
        w, h = width, round(width / r0)
    elif in_ratio > r1:
        w, h = round(height * r1), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def sample_flips(batch: int, p: float = 0.5, generator: torch.Generator | None = None) -> Tensor:
    """Per image, flip with probability ``p`` (torchvision: ``torch.rand(1) < p``)."""
    p = check_p_flip(p)
    return torch.rand(batch, generator=generator) < p
