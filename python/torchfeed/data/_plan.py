"""Epoch plans: which samples every consumer (rank x worker) reads in an epoch, in which order,
and how a plan resumes after a checkpoint, on the same or on another number of consumers.

An epoch's items (samples, or shards of known length) are shuffled and dealt out to the
consumers. A plan gives each consumer a list of segments ``(item position, first sample, end
sample)``; its stream is the samples of its segments in order. A checkpoint records how many
samples of its stream each consumer had consumed. Resuming on the same consumers skips them, so
the run continues exactly as if never stopped. Resuming on other consumers (elastic) deals the
samples not yet consumed, in order, into shares of EQUAL length, so that every rank yields the
same number of batches (under DDP a rank with one batch more waits forever in its all-reduce):
with ``uneven="pad"`` the shortfall is made up by repeating the first samples of the rest (as
torch's DistributedSampler pads), with ``"drop"`` the last ``rest % consumers`` samples of the
rest are left out of the resumed epoch. Every other sample is read exactly once. The next epoch
is a fresh plan again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torchfeed.data._seeding import derive_seed

__all__ = ["EpochPlan", "Segment", "epoch_order", "split_for_consumer"]

Segment = tuple[int, int, int]  # (position in the epoch's order, first sample, end sample)


def split_for_consumer(
    items: Sequence[int],
    consumer: int,
    consumers: int,
    uneven: Literal["drop", "pad"] = "drop",
) -> list[int]:
    """Consumer ``consumer`` of ``consumers``: every ``consumers``-th item, all consumers getting
    the same count: ``"drop"`` leaves out the last ``len % consumers`` items, ``"pad"`` repeats
    items from the start so that nothing is left out."""
    if uneven not in ("drop", "pad"):
        raise ValueError(f"uneven must be 'drop' or 'pad', got {uneven!r}")
    n = len(items)
    per = n // consumers if uneven == "drop" else -(-n // consumers)
    if uneven == "pad" and n == 0:
        per = 0
    return [items[(consumer + k * consumers) % n] for k in range(per)]


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The items' order in an epoch: a permutation drawn from (seed, epoch), or 0..n-1."""
    order = list(range(n))
    if shuffle:
        random.Random(derive_seed(seed, epoch)).shuffle(order)
    return order


@dataclass
class EpochPlan:
    """Each consumer's segments for one epoch; ``lengths[p]`` is the sample count of the item at
    order position p (1 for samples)."""

    lengths: list[int]
    shares: list[list[Segment]]
    uneven: Literal["drop", "pad"] = "drop"

    @classmethod
    def fresh(
        cls, lengths: Sequence[int], consumers: int, uneven: Literal["drop", "pad"]
    ) -> EpochPlan:
        """Items dealt out whole, ``consumers`` ways (the plan of an uninterrupted epoch)."""
        positions = list(range(len(lengths)))
        shares = [
            [(p, 0, lengths[p]) for p in split_for_consumer(positions, c, consumers, uneven)]
            for c in range(consumers)
        ]
        return cls(list(lengths), shares, uneven)

    @property
    def consumers(self) -> int:
        return len(self.shares)

    def length(self, consumer: int) -> int:
        """Samples in a consumer's stream."""
        return sum(end - start for _, start, end in self.shares[consumer])

    def remaining(self, consumer: int, consumed: int) -> list[Segment]:
        """A consumer's segments after its first ``consumed`` samples."""
        if not 0 <= consumed <= self.length(consumer):
            raise ValueError(
                f"consumer {consumer} cannot have consumed {consumed} samples of a stream of "
                f"{self.length(consumer)}"
            )
        out: list[Segment] = []
        for position, start, end in self.shares[consumer]:
            take = min(consumed, end - start)
            consumed -= take
            if start + take < end:
                out.append((position, start + take, end))
        return out

    def resumed(self, consumed: Sequence[int], consumers: int) -> EpochPlan:
        """The plan of the rest of the epoch on ``consumers`` consumers, after each of this
        plan's consumed ``consumed[c]`` samples: everything not consumed, in order, in shares of
        equal length (``uneven``: the rest padded by repeating its first samples, or cut)."""
        if len(consumed) != self.consumers:
            raise ValueError(
                f"consumed has {len(consumed)} entries for a plan of {self.consumers} consumers"
            )
        rest = [s for c in range(self.consumers) for s in self.remaining(c, consumed[c])]
        total = sum(end - start for _, start, end in rest)
        share = -(-total // consumers) if self.uneven == "pad" else total // consumers
        if total and share * consumers > total:  # pad: the first samples of the rest, again
            rest = rest + _first_samples(rest, share * consumers - total)
        shares: list[list[Segment]] = [[] for _ in range(consumers)]
        cursor = 0
        for c in range(consumers):
            want = share
            while want > 0:
                position, start, end = rest[cursor]
                take = min(want, end - start)
                shares[c].append((position, start, start + take))
                want -= take
                if start + take == end:
                    cursor += 1
                else:
                    rest[cursor] = (position, start + take, end)
        return EpochPlan(self.lengths, shares, self.uneven)


def _first_samples(segments: list[Segment], count: int) -> list[Segment]:
    """The first ``count`` samples of ``segments``, as segments (repeated from the start when
    ``segments`` hold fewer)."""
    out: list[Segment] = []
    while count > 0:
        for position, start, end in segments:
            take = min(count, end - start)
            if take > 0:
                out.append((position, start, start + take))
                count -= take
            if count == 0:
                break
    return out
