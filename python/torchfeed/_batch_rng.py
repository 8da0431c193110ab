"""The generator torchfeed's random transforms draw from when given none: torch's global one,
except in a DevicePrefetcher's thread, where the prefetcher sets one seeded for each batch
(:func:`drawing_from`). A transform there would otherwise share the global generator with the
training loop's thread, each run interleaving their draws in another order. Where the
prefetcher knows the batch's samples (a map-style dataset through torchfeed.loader), a
transform of the whole batch draws image j's parameters from uniforms seeded for sample j
(:func:`draws_for`): the same augmentation whichever batch, rank or world size the sample
comes in.

Any other code that the prefetcher's thread runs within :func:`drawing_from` (a torchvision
transform, a MixUp of the user's) calls torch's random functions without a generator; a
``TorchFunctionMode`` pushed in that thread alone (torch keeps the mode stack per thread) hands
them the batch's generator, or one of the same seed on the device they draw on. Python's
``random`` and numpy's global generator have no such hook."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from torchfeed.data._seeding import derive_seed

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


def _random_functions() -> frozenset[Callable[..., Any]]:
    """torch's functions and Tensor methods that draw, and take a ``generator`` keyword."""
    names = ("rand", "randn", "randint", "randperm", "bernoulli", "multinomial", "normal",
             "poisson", "binomial", "_standard_gamma", "_sample_dirichlet")  # fmt: skip
    methods = ("uniform_", "normal_", "random_", "bernoulli_", "bernoulli", "exponential_",
               "geometric_", "cauchy_", "log_normal_", "multinomial")  # fmt: skip
    found: set[Callable[..., Any]] = {getattr(torch, n) for n in names if hasattr(torch, n)}
    found.update(getattr(torch.Tensor, n) for n in methods if hasattr(torch.Tensor, n))
    for name in ("rand_like", "randn_like", "randint_like"):  # a generator= in newer torch only
        like: Callable[..., Any] = getattr(torch, name)
        try:
            args = (torch.zeros(1), 2) if name == "randint_like" else (torch.zeros(1),)
            like(*args, generator=torch.Generator())
        except TypeError:
            continue
        found.add(like)
    return frozenset(found)


_RANDOM: frozenset[Callable[..., Any]] | None = None


class _BatchDraws(TorchFunctionMode):
    """Hands ``generator`` (CPU), or a generator of its seed on the device drawn on, to every
    call of a random function made without one, in the thread that entered it."""

    def __init__(self, generator: torch.Generator) -> None:
        super().__init__()
        self.generator = generator
        self.others: dict[torch.device, torch.Generator | None] = {}

    def on(self, device: torch.device) -> torch.Generator | None:
        if device.type == "cpu":
            return self.generator
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device not in self.others:
            try:  # (a device without generators, meta say: its draws are left as they are)
                g = torch.Generator(device)
                # (two GPUs' generators of one seed would draw alike)
                g.manual_seed(derive_seed(self.generator.initial_seed(), 1 + (device.index or 0)))
            except (RuntimeError, TypeError):
                g = None
            self.others[device] = g
        return self.others[device]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        assert _RANDOM is not None
        try:
            draws = func in _RANDOM and kwargs.get("generator") is None
        except TypeError:  # (an unhashable callable: not one of torch's random functions)
            draws = False
        if draws:
            device = kwargs.get("device")
            if device is None:
                tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
                device = tensors[0].device if tensors else torch.get_default_device()
            g = self.on(torch.device(device))
            if g is not None:
                kwargs = {**kwargs, "generator": g}
        return func(*args, **kwargs)


@contextmanager
def drawing_from(
    generator: torch.Generator, keys: Sequence[int] | None = None, base: int = 0
) -> Iterator[None]:
    """Within it, this thread's transforms given no generator draw from ``generator``, or,
    drawing for the whole batch of samples ``keys``, image j from (``base``, ``keys[j]``); and
    torch's random functions called in this thread without a generator draw from it too
    (another device's from a generator of its seed)."""
    global _RANDOM
    if _RANDOM is None:
        _RANDOM = _random_functions()
    before = getattr(_local, "current", _NONE)
    _local.current = generator, None if keys is None else _Samples(keys, base)
    try:
        with _BatchDraws(generator):
            yield
    finally:
        _local.current = before
