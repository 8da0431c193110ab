"""Samples of a stream seeded as :func:`~torchfeed.data.seed_sample` seeds them, at a fifth of its
cost while they draw from torch alone: torch's generator seeded before every sample (1 us),
numpy's and ``random``'s (6 us together) once a group, their states compared after it."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from typing import Any

import torch

from torchfeed.data._seeding import (
    _host_fingerprint,
    _mix,
    _seed_host_generators,
    kept_generators,
)

__all__ = ["GROUP", "in_fetches", "read_group", "read_groups", "read_past", "settle"]

_END = object()

# Samples read between two comparisons of numpy's and random's states (their seeding and the
# comparison take about 15 us: 0.2 us a sample)
GROUP = 64


def read_past(it: Iterator[Any], n: int) -> int:
    """Reads ``n`` samples of ``it`` and drops them; how many there were."""
    for k in range(n):
        try:
            next(it)
        except StopIteration:
            return k
    return n


def read_group(
    it: Iterator[Any], prefix: int, k: int, stop: int, first_alone: bool
) -> tuple[list[Any], list[int], list[torch.Tensor], Exception | None] | None:
    """Samples ``k`` .. ``stop - 1`` of ``it`` (fewer at its end, or where a read raises: the
    error comes last) as seeding each from ``_mix(prefix, j)`` makes them, with their seeds and
    torch's state after each: torch's generator seeded before every sample, numpy's and
    ``random``'s as for sample ``k``. None when a read drew from numpy or ``random`` (compared
    after the group, and after its first sample too if ``first_alone``: a dataset that draws is
    then found reading one sample)."""
    generator = torch.default_generator
    _seed_host_generators(_mix(prefix, k))
    before = _host_fingerprint()
    samples: list[Any] = []
    seeds = [_mix(prefix, j) for j in range(k, stop)]
    states: list[torch.Tensor] = []
    error = None
    for seed in seeds:
        generator.manual_seed(seed)
        try:
            samples.append(next(it))
        except StopIteration:
            break
        except Exception as e:  # raised after the samples before it, as a read one by one does
            error = e
            break
        states.append(generator.get_state())
        if first_alone:
            if _host_fingerprint() != before:
                return None
            first_alone = False
    if _host_fingerprint() != before:
        return None
    return samples, seeds[: len(samples)], states, error


def read_groups(
    it: Iterator[Any], prefix: int, k: int, end: int | None, notes: dict[str, Any]
) -> Generator[Any, None, int | None]:
    """Samples ``k`` .. of ``it`` (up to ``end``), ``GROUP`` at a time by :func:`read_group`.
    ``notes`` (a dataset's ``__dict__``) gets each sample's seed and torch's state after it as
    the sample is yielded (``"_last"``, for :func:`settle`), how many samples of the group
    are left to yield after it (``"_buffered"``: the next ones come without a read), and
    ``"_host_checked"`` once a first sample was read alone. Returns None at the end (of ``it``
    or at ``end``); where a read drew from numpy or ``random``, the first sample not yielded, to
    be read again."""
    while end is None or k < end:
        stop = k + GROUP if end is None else min(k + GROUP, end)
        got = read_group(it, prefix, k, stop, not notes.get("_host_checked"))
        if got is None:
            return k
        notes["_host_checked"] = True
        samples, seeds, states, error = got
        for j, sample in enumerate(samples):
            notes["_last"] = (seeds[j], states[j])
            notes["_buffered"] = len(samples) - 1 - j
            yield sample
        if error is not None:
            raise error
        k += len(samples)
        if k < stop:
            return None
    return None


def settle(notes: dict[str, Any]) -> None:
    """The generators as seeding for the sample :func:`read_groups` last yielded, then its
    read, leave them (if ``notes["_last"]`` holds one; it is then cleared)."""
    last = notes.get("_last")
    notes["_last"] = None
    if last is not None:
        torch.default_generator.set_state(last[1])
        _seed_host_generators(last[0])  # (its read drew from neither)


def in_fetches(
    source: Iterable[Any], fetch: int | None, notes: dict[str, Any], restore: bool
) -> Iterator[Any]:
    """``source``'s samples (each read seeding the generators), with the generators set for what
    runs after them:

    - ``fetch`` known (a DataLoader fetch collates that many samples from the stream's start):
      before a fetch's last sample and at the end, as seeding every sample leaves them
      (:func:`settle`), so that a random collate draws what it would;
    - ``restore`` (the main process reading for a consumer whose fetches are not known: a plain
      DataLoader with ``num_workers=0``, or the dataset iterated directly): back, after every
      read, to what they were before it, so that the loop's own draws are not disturbed (about
      90 us a read, numpy's state the most: once per group of a shard read by
      :func:`read_groups`, whose other samples come without a read). ``torchfeed.loader`` knows
      its fetches and sets them back around each batch itself."""
    n = 0
    it = iter(source)
    while True:
        if restore and not notes.get("_buffered"):
            with kept_generators():
                sample = next(it, _END)
        else:  # (a worker's read: 1 us a sample less than through the context manager)
            sample = next(it, _END)
        if sample is _END:
            break
        n += 1
        if fetch is not None and n % fetch == 0:
            settle(notes)
        yield sample
    if fetch is not None and n % fetch:
        settle(notes)
