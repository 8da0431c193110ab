"""The generator torchfeed's random transforms draw from when given none: torch's global one,
except in a DevicePrefetcher's thread, where the prefetcher sets one seeded for each batch
(:func:`drawing_from`). A transform there would otherwise share the global generator with the
training loop's thread, each run interleaving their draws in another order."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["drawing_from", "resolve"]

_local = threading.local()


def resolve(generator: torch.Generator | None) -> torch.Generator | None:
    """``generator``, else the one this thread draws from (None: torch's global generator)."""
    if generator is not None or torch.compiler.is_compiling():
        return generator
    return getattr(_local, "generator", None)


@contextmanager
def drawing_from(generator: torch.Generator) -> Iterator[None]:
    """Within it, this thread's transforms given no generator draw from ``generator``."""
    before = getattr(_local, "generator", None)
    _local.generator = generator
    try:
        yield
    finally:
        _local.generator = before
