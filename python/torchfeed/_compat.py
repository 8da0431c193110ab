"""Keywords renamed since torchfeed 0.1, still accepted with a DeprecationWarning."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["UNSET", "renamed"]

UNSET: Any = object()  # the default of a renamed keyword: "not given"


def renamed(owner: str, old: str, new: str, old_value: Any, new_value: Any) -> Any:
    """The value of keyword ``new``, taking ``old`` (deprecated) when that was given instead."""
    if old_value is UNSET:
        return new_value
    warnings.warn(
        f"{owner}({old}=...) is deprecated: use {new}=...", DeprecationWarning, stacklevel=3
    )
    return old_value
