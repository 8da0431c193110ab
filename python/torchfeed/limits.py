"""Bounds on what untrusted input may make torchfeed allocate.

``max_image_pixels`` (default 89,478,485, Pillow's ``MAX_IMAGE_PIXELS``: a quarter GiB of RGB)
bounds the images torchfeed decodes, checked from the file's header before anything is
allocated, and the output size of the image transforms. A JPEG of a few kilobytes can declare
65,500 x 65,500 pixels; without the bound, decoding even a small window of it can take
gigabytes. Change it with :func:`set_max_image_pixels` or the environment variable
``TORCHFEED_MAX_IMAGE_PIXELS`` (read at import; ``none`` disables the bound). The setting is per
process: set it in each DataLoader worker (``worker_init_fn``) or through the environment,
which workers inherit.
"""

from __future__ import annotations

import os

import PIL.Image

__all__ = [
    "DEFAULT_MAX_IMAGE_PIXELS",
    "ImageTooLargeError",
    "check_image_pixels",
    "max_image_pixels",
    "set_max_image_pixels",
]

DEFAULT_MAX_IMAGE_PIXELS = 89_478_485


class ImageTooLargeError(ValueError):
    """An image (or an output) has more pixels than ``max_image_pixels`` allows."""


def _parse(value: object, name: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        n = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}") from None
    if isinstance(value, bool) or n < 1 or (isinstance(value, float) and value != n):
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return n


def _relax_pillow(limit: int | None) -> None:
    # torchfeed decodes through Pillow where the window decoder does not: a bound raised here
    # raises Pillow's decompression-bomb bound to it too (never lowers it), else Pillow would
    # refuse what torchfeed was told to allow.
    current = PIL.Image.MAX_IMAGE_PIXELS
    if current is not None and (limit is None or limit > current):
        PIL.Image.MAX_IMAGE_PIXELS = limit


_limit: int | None = _parse(
    os.environ.get("TORCHFEED_MAX_IMAGE_PIXELS", DEFAULT_MAX_IMAGE_PIXELS),
    "TORCHFEED_MAX_IMAGE_PIXELS",
)
_relax_pillow(_limit)


def max_image_pixels() -> int | None:
    """The bound now in force (None: no bound)."""
    return _limit


def set_max_image_pixels(pixels: int | None) -> None:
    """Sets the bound (a positive int, or None for no bound) for this process (Pillow's own
    bound is raised to it, where lower)."""
    global _limit
    _limit = _parse(pixels, "max_image_pixels")
    _relax_pillow(_limit)


def check_image_pixels(height: int, width: int, what: str) -> None:
    """Raises :class:`ImageTooLargeError`, naming ``what`` and the numbers, if height x width is
    over the bound."""
    if _limit is not None and height * width > _limit:
        raise ImageTooLargeError(
            f"{what} is {height} x {width} = {height * width} pixels, more than the limit of "
            f"{_limit} (torchfeed.limits.set_max_image_pixels(), or the environment variable "
            "TORCHFEED_MAX_IMAGE_PIXELS, changes it)"
        )
