"""ShardedIterableDataset's per-sample seeding, read in groups: every sample draws what
seed_sample(seed, epoch, item, k) gives it (the reference: all three generators seeded before each
sample), whether it draws nothing, from torch, from numpy or from random, from its first sample or
a later one; a shard is opened again only where a read drew from numpy or random; no read goes
past a consumer's part of a shard; a random collate after the samples draws the same in a resumed
run as in the uninterrupted one."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchfeed
from torchfeed.data import ShardedIterableDataset, seed_sample

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SEED, EPOCH = 5, 2
LENGTHS = [150, 64, 1, 97, 130, 70]  # whole groups of 64, partial ones, a one-sample shard


def draws(kind: str, k: int) -> tuple:
    """What sample k draws, for each kind of dataset."""
    out: list = []
    if kind in ("torch", "all"):
        out.append(torch.rand(()).item())
    if kind in ("numpy", "all") or (kind == "numpy late" and k >= 70):
        out.append(float(np.random.rand()))
    if kind in ("random", "all") or (kind == "random late" and k >= 100):
        out.append(random.random())
    return tuple(out)


class Shards:
    """open_item: shard i's samples (i, j, draws), j its place in the shard (shuffled when
    opened, with ``random``, if ``shuffling``), each made lazily; logs every open and read."""

    def __init__(self, kind: str, shuffling: bool = False) -> None:
        self.kind, self.shuffling = kind, shuffling
        self.opened: Counter = Counter()
        self.made: Counter = Counter()

    def __call__(self, i: int):
        self.opened[i] += 1
        order = list(range(LENGTHS[i]))
        if self.shuffling:
            random.shuffle(order)  # as the shard is opened, not lazily
        return self.make(i, order)

    def make(self, i: int, order: list[int]):
        for k, j in enumerate(order):
            self.made[i, k] += 1
            yield i, j, draws(self.kind, k)


def reference(kind: str, shuffling: bool = False, epoch: int = EPOCH) -> dict:
    """Every sample as made with all three generators seeded before it (and, for a shuffle
    when a shard is opened, before that)."""
    ref = {}
    for i, n in enumerate(LENGTHS):
        order = list(range(n))
        if shuffling:
            seed_sample(SEED, epoch, i, -1)
            random.shuffle(order)
        for k in range(n):
            seed_sample(SEED, epoch, i, k)
            ref[i, order[k]] = draws(kind, k)
    return ref


def dataset(kind: str, shuffling: bool = False, **kw) -> tuple[ShardedIterableDataset, Shards]:
    shards = Shards(kind, shuffling)
    ds = ShardedIterableDataset(
        list(range(len(LENGTHS))), shards, seed=SEED, item_lengths=LENGTHS, **kw
    )
    ds.set_epoch(EPOCH)
    return ds, shards


def samples(loader) -> dict:
    got = {}
    for batch in loader:
        for i, k, d in batch:
            assert (i, k) not in got
            got[i, k] = d
    return got


KINDS = ["nothing", "torch", "numpy", "random", "all", "numpy late", "random late"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_each_sample_draws_what_seed_sample_gives_it(kind, workers):
    ds, _ = dataset(kind)
    loader = torchfeed.loader(ds, batch_size=7, num_workers=workers, collate_fn=list)
    got = samples(loader)
    assert got == reference(kind)
    drawn = [d for d in got.values() if d]
    assert len(set(drawn)) == len(drawn) and (kind == "nothing" or drawn)  # distinct per sample


def test_persistent_workers_draw_each_epochs_own_augmentation():
    """Workers that outlive an epoch (and keep the batch size they started with) draw each
    epoch's samples as seed_sample seeds them for that epoch."""
    ds, _ = dataset("torch", shuffling=True)
    loader = torchfeed.loader(
        ds, batch_size=7, num_workers=2, persistent_workers=True, collate_fn=list
    )
    for epoch in (EPOCH, EPOCH + 1):
        ds.set_epoch(epoch)
        assert samples(loader) == reference("torch", shuffling=True, epoch=epoch)


@pytest.mark.parametrize("kind", ["nothing", "torch"])
def test_a_shard_whose_reads_leave_numpy_and_random_alone_is_read_once(kind):
    ds, shards = dataset(kind)
    samples(torchfeed.loader(ds, batch_size=7, collate_fn=list))
    assert set(shards.opened.values()) == {1} and len(shards.opened) == len(LENGTHS)
    assert set(shards.made.values()) == {1} and len(shards.made) == sum(LENGTHS)


@pytest.mark.parametrize(
    ("kind", "draws_from", "twice"),
    [
        ("numpy", 0, 1),  # the process's first sample is read alone: found at once
        ("numpy late", 70, 128),  # found after the group of samples 64-127
        ("random late", 100, 128),
    ],
)
def test_a_shard_whose_read_draws_from_numpy_or_random_is_opened_again_once(
    kind, draws_from, twice
):
    """Found once in a process, at the end of a group: that shard is opened again and read
    past to the group's first sample (the samples before it made twice, unseeded, and
    dropped), the group read again, and everything after it seeded for every sample."""
    ds, shards = dataset(kind, shuffle=False)
    assert samples(torchfeed.loader(ds, batch_size=7, collate_fn=list)) == reference(kind)
    first = next(i for i, n in enumerate(LENGTHS) if n > draws_from)  # the first shard drawing
    assert shards.opened == Counter({i: 2 if i == first else 1 for i in range(len(LENGTHS))})
    made_twice = {key for key, n in shards.made.items() if n == 2}
    assert made_twice == {(first, k) for k in range(twice)}
    assert set(shards.made.values()) <= {1, 2}


@pytest.mark.parametrize("kind", ["torch", "numpy late"])
@pytest.mark.parametrize("workers", [0, 2])
def test_what_opening_a_shard_draws_is_seeded_for_the_shard(kind, workers):
    """A shard shuffled as it is opened is shuffled alike whenever it is opened: read again
    after a draw from numpy, or resumed (below)."""
    ds, _ = dataset(kind, shuffling=True)
    got = samples(torchfeed.loader(ds, batch_size=7, num_workers=workers, collate_fn=list))
    assert got == reference(kind, shuffling=True)


def test_items_that_cannot_be_opened_again_are_seeded_for_every_sample():
    """Items that are their own iterators (no open_item): nothing to read again, so every
    sample is seeded as seed_sample seeds it."""
    kind = "numpy late"

    def shard(i):
        for k in range(LENGTHS[i]):
            yield i, k, draws(kind, k)

    ds = ShardedIterableDataset([shard(i) for i in range(len(LENGTHS))], seed=SEED, shuffle=False)
    ds.set_epoch(EPOCH)
    assert samples(torchfeed.loader(ds, batch_size=7, collate_fn=list)) == reference(kind)


def test_no_sample_past_a_ranks_part_of_a_shard_is_made(monkeypatch):
    """An elastic resume (2 ranks -> 3) cuts shards between ranks: a rank opens a shard, reads
    past its part's start and reads its part [a, b), never sample b or any after it."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    ds, _ = dataset("torch")
    loader = torchfeed.loader(ds, batch_size=7, collate_fn=list)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    del it
    monkeypatch.setenv("WORLD_SIZE", "3")
    cut = False
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        ds, shards = dataset("torch")
        loader = torchfeed.loader(ds, batch_size=7, collate_fn=list)
        loader.load_state_dict(state)
        plan, order = ds.plan(3), ds._order(EPOCH)
        assert plan is not None
        parts = [(order[p], a, b) for p, a, b in plan.shares[rank] if a < b]
        cut = cut or any(b < LENGTHS[i] for i, _, b in parts)
        got = samples(loader)
        assert sum(b - a for _, a, b in parts) == len(got)
        assert sum(shards.made.values()) == sum(b for _, _, b in parts)
        assert all(got[key] == value for key, value in reference("torch").items() if key in got)
    assert cut


def drawing_collate(batch):
    """A random collate (masking, mixing): draws from all three after the samples."""
    return [s[:2] for s in batch], (torch.rand(()).item(), float(np.random.rand()), random.random())


@pytest.mark.parametrize("shuffling", [False, True])
@pytest.mark.parametrize("kind", ["nothing", "torch"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_random_collate_draws_the_same_after_a_resume(kind, workers, shuffling):
    def run(steps=None, state=None):
        ds, _ = dataset(kind, shuffling)
        loader = torchfeed.loader(ds, batch_size=5, num_workers=workers, collate_fn=drawing_collate)
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append(batch)
            if len(out) == steps:
                return out, loader.state_dict()
        return out, None

    full, _ = run()
    assert len({b[1] for b in full}) == len(full)  # the collate's draws differ batch to batch
    for steps in (3, 14, 25):  # resumed inside a group, as batches of 5 never align with 64
        head, state = run(steps)
        tail, _ = run(state=state)
        assert head + tail == full, steps


@pytest.mark.parametrize("workers", [0, 2])
def test_another_loader_over_the_same_dataset_reads_it_as_its_own(workers):
    """torchfeed.loader tells the dataset its batch size for its own iterator only: a plain
    DataLoader over the same dataset afterwards (another batch size) seeds every sample, its
    random collate drawing what it draws over a fresh dataset."""
    ds, _ = dataset("torch")
    samples(torchfeed.loader(ds, batch_size=7, num_workers=workers, collate_fn=list))
    fresh, _ = dataset("torch")
    runs = []
    for d in (ds, fresh):
        seed_globals(11)  # (with num_workers=0 the collate draws from the loop's own streams)
        runs.append(
            list(DataLoader(d, batch_size=5, num_workers=workers, collate_fn=drawing_collate))
        )
    assert runs[0] == runs[1] and len(runs[0]) > 1


def seed_globals(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def loop_draws() -> tuple:
    """What a training loop draws between batches (numpy's gaussians come in pairs: the second
    one is cached in its state), and the seed it sees."""
    return torch.rand(()).item(), float(np.random.randn()), random.random(), torch.initial_seed()


def main_process_loaders():
    return {
        "torchfeed.loader": lambda ds, c: torchfeed.loader(ds, batch_size=5, collate_fn=c),
        "torchfeed.loader, batch_size=1": lambda ds, c: torchfeed.loader(ds, collate_fn=c),
        "DataLoader": lambda ds, c: DataLoader(ds, batch_size=5, collate_fn=c),
        "iterated directly": lambda ds, c: ([s] for s in ds),
    }


def mixed_reference() -> dict:
    ref = {}
    for i, n in enumerate(LENGTHS):
        for k in range(n):
            seed_sample(SEED, EPOCH, i, k)
            ref[i, k] = draws("torch", k) if i % 2 else ()
    return ref


@pytest.mark.parametrize("how", list(main_process_loaders()))
@pytest.mark.parametrize("kind", ["torch", "numpy late", "all", "mixed items"])
def test_the_loops_own_draws_are_not_disturbed_in_the_main_process(how, kind):
    """Read with num_workers=0 (or iterated directly), the stream seeds the main process's
    generators for every sample (in groups of a shard, one by one after a read drew from numpy,
    or for a shard that cannot be opened again); the training loop between batches draws what
    it would over an unseeded stream that draws nothing, as over a SeedPerSample. The samples
    still draw what seed_sample gives them."""
    make = main_process_loaders()[how]

    def run(seed_samples: bool):
        if kind == "mixed items" and seed_samples:
            ds = ShardedIterableDataset(mixed_items(), seed=SEED, shuffle=False)
            ds.set_epoch(EPOCH)
        else:
            ds, _ = dataset(
                kind if seed_samples else "nothing", seed_samples, seed_samples=seed_samples
            )
        seed_globals(3)
        np.random.randn()  # a gaussian cached in numpy's state
        got, loop = {}, []
        for batch in make(ds, list):
            for i, k, d in batch:
                got[i, k] = d
            loop.append(loop_draws())
        loop.append(loop_draws())  # after the epoch's end
        return got, loop

    got, loop = run(True)
    _, unseeded = run(False)
    assert got == (mixed_reference() if kind == "mixed items" else reference(kind, True))
    assert loop == unseeded and len(set(loop)) == len(loop) > 2


@pytest.mark.parametrize("kind", ["torch", "numpy late"])
def test_a_random_collate_in_the_main_process(kind):
    """torchfeed.loader (knowing its batches) hands the collate the generators as seeding every
    sample leaves them, as in a worker, so that its draws are the same in a resumed run; a plain
    DataLoader's collate draws from the loop's own streams, as over a SeedPerSample."""
    ds, _ = dataset(kind)
    seed_globals(3)
    ours = list(torchfeed.loader(ds, batch_size=5, collate_fn=drawing_collate))
    expected = []
    for i, n in enumerate(LENGTHS):  # ranks x workers = 1 consumer, unshuffled dataset order
        expected += [(i, k) for k in range(n)]
    order = ds._order(EPOCH)
    stream = [(i, k) for i in order for k in range(LENGTHS[i])]
    for b, batch in enumerate(ours):
        i, k = stream[b * 5 + len(batch[0]) - 1]
        seed_sample(SEED, EPOCH, i, k)
        draws(kind, k)
        assert batch[1] == (torch.rand(()).item(), float(np.random.rand()), random.random())
    plain, unseeded = [], []
    for out, seeding in ((plain, True), (unseeded, False)):
        d, _ = dataset(kind if seeding else "nothing", seed_samples=seeding)
        seed_globals(3)
        out += [b[1] for b in DataLoader(d, batch_size=5, collate_fn=drawing_collate)]
    assert plain == unseeded and len(set(plain)) == len(plain)


class Broken(Shards):
    """Shard 0's sample 30 raises as it is made."""

    def make(self, i: int, order: list[int]):
        for sample in super().make(i, order):
            if i == 0 and sample[1] == 30:
                raise ValueError("corrupt sample")
            yield sample


def test_a_read_that_raises_comes_after_the_samples_before_it():
    """Shards read in groups: the samples read before a failing one are still yielded first,
    as a plain DataLoader (reading one by one) yields them."""

    def run(make_loader):
        ds = ShardedIterableDataset(
            list(range(len(LENGTHS))), Broken("torch"), seed=SEED, shuffle=False
        )
        ds.set_epoch(EPOCH)
        got = []
        with pytest.raises(ValueError, match="corrupt sample"):
            for batch in make_loader(ds):
                got.append(batch)
        return got

    ours = run(lambda ds: torchfeed.loader(ds, batch_size=7, collate_fn=list))
    theirs = run(lambda ds: DataLoader(ds, batch_size=7, collate_fn=list))
    assert ours == theirs and len(ours) == 30 // 7


def mixed_items():
    """Shards that can be opened again (lists, read in groups) between ones that cannot
    (generators, seeded per sample), each sample drawing from torch."""

    def once(i):
        for k in range(LENGTHS[i]):
            yield i, k, draws("torch", k)

    return [
        [(i, k, ()) for k in range(LENGTHS[i])] if i % 2 == 0 else once(i)
        for i in range(len(LENGTHS))
    ]


@pytest.mark.parametrize("case", ["mixed items", "numpy late"])
def test_a_random_collate_after_samples_seeded_one_by_one_draws_what_it_would(case):
    """Samples seeded one by one after grouped ones (an item that cannot be opened again, or
    everything after a read that drew from numpy) leave nothing for the batch's end to set
    back: the collate draws as under a plain DataLoader's worker, which seeds every sample."""

    def make():
        if case == "mixed items":
            ds = ShardedIterableDataset(mixed_items(), seed=SEED, shuffle=False)
            ds.set_epoch(EPOCH)
            return ds
        return dataset(case, shuffle=False)[0]

    ours = list(torchfeed.loader(make(), batch_size=5, collate_fn=drawing_collate))
    # (in one worker: with num_workers=0 a plain DataLoader's collate draws the loop's streams)
    theirs = list(DataLoader(make(), batch_size=5, num_workers=1, collate_fn=drawing_collate))
    assert ours == theirs and len(ours) > 1
