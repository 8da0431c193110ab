"""The generator torchfeed's random transforms draw from when given none: torch's global one,
except in a DevicePrefetcher's thread, where the prefetcher sets one seeded for each batch
(:func:`drawing_from`). A transform there would otherwise share the global generator with the
training loop's thread, each run interleaving their draws in another order. Where the
prefetcher knows the batch's samples (a map-style dataset through torchfeed.loader), a
transform of the whole batch draws image j's parameters from uniforms seeded for sample j
(:func:`draws_for`): the same augmentation whichever batch, rank or world size the sample
comes in."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

__all__ = ["drawing_from", "draws_for", "resolve"]

_local = threading.local()
_NONE: tuple[None, None] = (None, None)


def resolve(generator: torch.Generator | None) -> torch.Generator | None:
    """``generator``, else the one this thread draws from (None: torch's global generator)."""
    if generator is not None or torch.compiler.is_compiling():
        return generator
    return getattr(_local, "current", _NONE)[0]


class _Samples:
    """The keys (dataset indices) of a batch's samples and the base their seeds mix them
    into; each draw for the whole batch takes the next stream (two views of a batch differ)."""

    def __init__(self, keys: Sequence[int], base: int) -> None:
        self.keys = torch.tensor(keys, dtype=torch.int64)
        self.base, self.draws = base, 0

    def uniforms(self, count: int, width: int) -> torch.Tensor | None:
        if count != self.keys.shape[0] or count == 0:
            return None
        u = torch.ops.torchfeed.sample_uniforms(self.keys, self.base, self.draws, width)
        self.draws += 1
        return u


def draws_for(
    generator: torch.Generator | None, count: int, width: int
) -> tuple[torch.Generator | None, torch.Tensor | None]:
    """What a transform drawing ``width`` uniforms for each of ``count`` images draws from:
    ``(None, [count, width] uniforms)``, row j drawn for sample j, when it was given no
    generator and this thread prepares a batch of ``count`` known samples; else
    ``(generator, None)`` with the generator :func:`resolve` gives (one lookup for both)."""
    if generator is not None or torch.compiler.is_compiling():
        return generator, None
    current, samples = getattr(_local, "current", _NONE)
    u = None if samples is None or not width else samples.uniforms(count, width)
    return (current, None) if u is None else (None, u)


@contextmanager
def drawing_from(
    generator: torch.Generator, keys: Sequence[int] | None = None, base: int = 0
) -> Iterator[None]:
    """Within it, this thread's transforms given no generator draw from ``generator``, or,
    drawing for the whole batch of samples ``keys``, image j from (``base``, ``keys[j]``)."""
    before = getattr(_local, "current", _NONE)
    _local.current = generator, None if keys is None else _Samples(keys, base)
    try:
        yield
    finally:
        _local.current = before
