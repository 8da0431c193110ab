"""Validators of the options the features take (transforms, decoders), run once, where the
options enter."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["check_bool", "check_generator", "check_p_flip", "check_range"]


def check_range(name: str, value: Sequence[float], positive: bool) -> tuple[float, float]:
    """``(min, max)`` of two finite numbers, min <= max, both > 0 (``positive``) or >= 0."""
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be two numbers (min, max), got {value!r}") from None
    bound = "> 0" if positive else ">= 0"
    if not (math.isfinite(lo) and math.isfinite(hi)) or not (lo > 0 if positive else lo >= 0):
        raise ValueError(f"{name} values must be {bound} (and finite), got {tuple(value)}")
    if lo > hi:
        raise ValueError(f"{name} must be (min, max) with min <= max, got {tuple(value)}")
    return lo, hi


def check_bool(name: str, value: Any) -> bool:
    """``value``, which must be a bool (a flag option: 1 or "yes" are refused, not read)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_p_flip(p: float) -> float:
    if isinstance(p, bool) or not isinstance(p, int | float):
        raise TypeError(f"p_flip must be a number in [0, 1], got {type(p).__name__}")
    if not 0.0 <= p <= 1.0:  # also refuses nan
        raise ValueError(f"p_flip must be in [0, 1], got {p}")
    return float(p)


def check_generator(generator: Any) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator
