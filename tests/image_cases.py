"""Shared by the image tests: normalization constants, random images, crop cases, and the
torchvision reference on the float path."""

from __future__ import annotations

import torch

from torchfeed import reference

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
MODES = [("bilinear", True), ("bilinear", False), ("nearest", False)]


def images_of(sizes, channels=3, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (channels, h, w), generator=g, dtype=torch.uint8).to(device)
        for h, w in sizes
    ]


def boxes_cases():
    """(sizes, boxes, out size): down- and upscaling, every border, 1x1 and 1xN crops, odd
    sizes, the whole image."""
    sizes = [(57, 83), (40, 31), (9, 7), (64, 64), (33, 100), (5, 120)]
    boxes = [
        (0, 0, 57, 83),  # whole image, downscale
        (39, 30, 1, 1),  # 1x1 crop in the bottom-right corner, upscale
        (0, 2, 9, 5),  # touches top and bottom
        (10, 0, 54, 64),  # touches left, bottom, right
        (32, 1, 1, 99),  # a 1xN crop at the bottom border
        (0, 100, 5, 20),  # touches top, right, bottom
    ]
    return sizes, boxes


def tv_float(images, boxes, flips, size, interpolation, antialias):
    return reference.crop_flip_normalize_torchvision(
        images, boxes, flips, size, MEAN, STD, interpolation, antialias
    )
