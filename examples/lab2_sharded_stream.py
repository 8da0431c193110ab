"""Lab 2, with torchfeed: a sharded streaming IterableDataset over workers AND ranks, no sample
read twice, every rank the same number of samples, and a checkpoint it resumes from.

The course's version split shards over workers only: under DDP every rank read the same data
(its ranks duplicated each other), and a run stopped mid-epoch started the epoch over.
``torchfeed.data.ShardedIterableDataset`` splits over rank x worker, and ``torchfeed.loader``
saves where every rank and worker stands, so a resumed run reads the rest exactly once, on the
same or on another number of ranks. (Ranks are simulated here with RANK/WORLD_SIZE.)
"""

from __future__ import annotations

import os

from _common import parse
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import torchfeed
from torchfeed.data import ShardedIterableDataset

SAMPLES_PER_SHARD = 3


class CourseStream(IterableDataset):
    """The course's version: shards split over workers, not ranks."""

    def __init__(self, shards: list[int]) -> None:
        self.shards = shards

    def __iter__(self):
        info = get_worker_info()
        mine = self.shards if info is None else self.shards[info.id :: info.num_workers]
        for s in mine:
            for k in range(SAMPLES_PER_SHARD):
                yield f"shard{s}-{k}"


def open_shard(s: int):
    for k in range(SAMPLES_PER_SHARD):
        yield f"shard{s}-{k}"


def torchfeed_stream(shards: list[int]) -> ShardedIterableDataset:
    return ShardedIterableDataset(
        shards, open_shard, mode="shard", seed=0, item_lengths=[SAMPLES_PER_SHARD] * len(shards)
    )


def read(make_loader, world: int, steps: int | None = None, state=None):
    """Every rank's samples, the ranks in lockstep (a DDP step each)."""
    loaders, its = [], []
    for rank in range(world):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
        dl = make_loader()
        if state is not None:
            dl.load_state_dict(state)
        loaders.append(dl)
        its.append(iter(dl))  # workers start with this rank's environment
    seen: list[str] = []
    step = 0
    while steps is None or step < steps:
        batches = [next(it, None) for it in its]
        if all(b is None for b in batches):
            break
        seen += [s for b in batches if b is not None for s in b]
        step += 1
    return seen, loaders


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    shards = list(range(16 if args.quick else 64))
    total = len(shards) * SAMPLES_PER_SHARD

    course, _ = read(lambda: DataLoader(CourseStream(shards), batch_size=4, num_workers=2), 2)
    print(
        f"lab 2, the course's stream on 2 ranks: {len(course)} samples read, "
        f"{len(course) - len(set(course))} of them twice"
    )

    def ours():
        return torchfeed.loader(
            torchfeed_stream(shards), batch_size=4, num_workers=2, collate_fn=list
        )

    seen, _ = read(ours, 2)
    print(f"lab 2, torchfeed on 2 ranks: {len(seen)} samples, {len(seen) - len(set(seen))} twice")
    head, loaders = read(ours, 2, steps=3)  # preempted after 3 steps
    state = loaders[0].state_dict()
    tail, _ = read(ours, 3, state=state)  # back on 3 ranks
    both = head + tail
    once = len(both) == len(set(both)) == total
    print(
        f"lab 2, stopped after 3 steps on 2 ranks, resumed on 3: {len(both)} of {total} "
        f"samples, each exactly once: {once}"
    )


if __name__ == "__main__":
    main()
