"""The generator torchfeed's random transforms draw from when given none: torch's global one,
except in a DevicePrefetcher's thread, where the prefetcher sets one seeded for each batch
(:func:`drawing_from`). A transform there would otherwise share the global generator with the
training loop's thread, each run interleaving their draws in another order. Where the
prefetcher knows the batch's samples (a map-style dataset through torchfeed.loader), a
transform of the whole batch draws image j's parameters from uniforms seeded for sample j
(:func:`per_sample`): the same augmentation whichever batch, rank or world size the sample
comes in."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

__all__ = ["drawing_from", "per_sample", "resolve"]

_local = threading.local()


def resolve(generator: torch.Generator | None) -> torch.Generator | None:
    """``generator``, else the one this thread draws from (None: torch's global generator)."""
    if generator is not None or torch.compiler.is_compiling():
        return generator
    return getattr(_local, "generator", None)


class _Samples:
    """The keys (dataset indices) of a batch's samples and the base their seeds mix them
    into; each draw for the whole batch takes the next stream (two views of a batch differ)."""

    def __init__(self, keys: Sequence[int], base: int) -> None:
        self.keys = torch.tensor(list(keys), dtype=torch.int64)
        self.base, self.draws = base, 0

    def uniforms(self, count: int, width: int) -> torch.Tensor | None:
        if count != self.keys.shape[0] or count == 0:
            return None
        u = torch.ops.torchfeed.sample_uniforms(self.keys, self.base, self.draws, width)
        self.draws += 1
        return u


def per_sample(generator: torch.Generator | None, count: int, width: int) -> torch.Tensor | None:
    """``[count, width]`` uniforms, row j drawn for sample j of the batch this thread prepares,
    for a transform given no generator that draws for all ``count`` images of it; None
    otherwise (samples unknown, a batch of another size or a part of it: :func:`resolve`)."""
    if generator is not None or torch.compiler.is_compiling():
        return None
    samples = getattr(_local, "samples", None)
    return None if samples is None else samples.uniforms(count, width)


@contextmanager
def drawing_from(
    generator: torch.Generator, keys: Sequence[int] | None = None, base: int = 0
) -> Iterator[None]:
    """Within it, this thread's transforms given no generator draw from ``generator``, or,
    drawing for the whole batch of samples ``keys``, image j from (``base``, ``keys[j]``)."""
    before = getattr(_local, "generator", None), getattr(_local, "samples", None)
    _local.generator = generator
    _local.samples = None if keys is None else _Samples(keys, base)
    try:
        yield
    finally:
        _local.generator, _local.samples = before
