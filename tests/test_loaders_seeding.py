"""Randomness that follows the sample: through torchfeed.loader a map-style dataset's draws
(torch, numpy, random, a torchfeed transform with the global generator) are a function of (seed,
epoch, index), so an uninterrupted run, a resumed one on the same world, one resumed on another
world size and one with another worker count draw the same augmentation for the same sample;
the zero-copy loader draws what the ordinary one draws; the main process's own generators are
left as they were."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import torchfeed
from torchfeed.data import DistributedSampler, SeedPerSample, WorkerSeeder

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

N = 37
CROP = torchfeed.RandomResizedCropFlipNormalize(8, mean=[0.5], std=[0.5], return_params=True)


class Augmented(Dataset):
    """Every draw an augmentation makes: torch, numpy, random, and a torchfeed transform."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        image = torch.full((1, 20 + i % 5, 30), i, dtype=torch.uint8)
        _, params = CROP(image)
        return i, (torch.rand(()).item(), float(np.random.rand()), random.random(),
                   tuple(params["boxes"][0].tolist()), bool(params["flips"][0]))  # fmt: skip


def collate(batch):
    return batch


def run(world, workers, epoch=3, steps=None, state=None, **kw):
    """Every rank's (index -> draws), simulated rank by rank (ranks advance in lockstep)."""
    torch.manual_seed(0)  # as a run starts
    loaders = []
    for rank in range(world):
        sampler = DistributedSampler(N, world, rank, seed=11)
        sampler.set_epoch(epoch)
        loader = torchfeed.loader(Augmented(), batch_size=4, sampler=sampler, num_workers=workers,
                                  worker_init_fn=WorkerSeeder(rank=rank), collate_fn=collate, **kw)  # fmt: skip
        if state is not None:
            loader.load_state_dict(state)
        loaders.append(loader)
    draws, its = {}, [iter(dl) for dl in loaders]
    step = 0
    while steps is None or step < steps:
        batches = [next(it, None) for it in its]
        if all(b is None for b in batches):
            break
        for b in batches:
            for i, d in b or []:
                draws.setdefault(i, d)
        step += 1
    return draws, loaders


def test_the_same_sample_draws_the_same_on_any_world_and_worker_count():
    full, _ = run(2, 2)
    assert len(full) == N and len({d for d in full.values()}) == N  # distinct per sample
    for world, workers in [(1, 0), (3, 2), (2, 1)]:
        other, _ = run(world, workers)
        assert other == full, (world, workers)


@pytest.mark.parametrize(("after", "workers"), [(2, 2), (3, 2), (2, 0)])
def test_a_resumed_run_draws_what_the_uninterrupted_one_drew(after, workers):
    full, _ = run(2, 2)
    head, loaders = run(2, 2, steps=3)
    state = loaders[0].state_dict()
    tail, _ = run(after, workers, state=state)
    for i, d in {**head, **tail}.items():
        assert full[i] == d, i


def test_the_next_epoch_draws_afresh_and_reproducibly():
    a, _ = run(2, 2, epoch=3)
    b, _ = run(2, 2, epoch=4)
    assert all(a[i] != b[i] for i in range(N))
    assert run(2, 2, epoch=4)[0] == b


def test_seed_samples_false_leaves_the_worker_streams():
    a, _ = run(1, 2, seed_samples=False)
    b, _ = run(1, 1, seed_samples=False)
    assert a != b  # the workers' own streams: another worker count draws otherwise
    loader = torchfeed.loader(Augmented(), seed_samples=False)
    assert isinstance(loader.dataset, Augmented)
    with pytest.raises(TypeError, match="seed_samples must be a bool or an int seed"):
        torchfeed.loader(Augmented(), seed_samples="yes")


def test_the_main_process_generators_are_left_as_they_were():
    """With num_workers=0 the samples are seeded in this process: afterwards its generators are
    where a DataLoader over a dataset that draws nothing leaves them (a DataLoader itself draws
    one base seed per epoch)."""
    loader = torchfeed.loader(Augmented(), batch_size=5, collate_fn=collate)
    assert isinstance(loader.dataset, SeedPerSample) and len(loader.dataset) == N

    def after(iterate):
        torch.manual_seed(5)
        np.random.seed(5)
        random.seed(5)
        iterate()
        return torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)]

    want = after(lambda: list(torch.utils.data.DataLoader(range(N), batch_size=5)))
    got = after(lambda: list(loader))
    assert torch.equal(want[0], got[0]) and np.array_equal(want[1], got[1]) and want[2] == got[2]


class Noisy(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"x": torch.rand(4), "i": i}


@pytest.mark.parametrize("seed_samples", [True, False])
def test_zero_copy_draws_what_the_ordinary_path_draws(seed_samples):
    """Sizing the ring collates a first batch in this process: that must not move the random
    state the shuffle and the workers' seeds come from."""
    out = {}
    for zero_copy in (False, True):
        torch.manual_seed(3)
        loader = torchfeed.loader(Noisy(), zero_copy=zero_copy, batch_size=4, shuffle=True,
                                  num_workers=2, seed_samples=seed_samples,
                                  collate_fn=torchfeed.PadCollate(["x"]))  # fmt: skip
        out[zero_copy] = [(b["i"].tolist(), b["x"].clone()) for b in loader]
    for (ia, xa), (ib, xb) in zip(out[False], out[True], strict=True):
        assert ia == ib and torch.equal(xa, xb)


@pytest.mark.parametrize("workers", [0, 2])
def test_each_sample_is_seeded_from_seed_epoch_and_index(workers, monkeypatch):
    """SeedPerSample mixes (seed, epoch) once per epoch: every sample's seed is still
    derive_seed(seed, epoch, index, 0), epoch after epoch, in the workers too (persistent ones
    read the epoch from shared memory)."""
    from torchfeed.data._seeding import derive_seed

    class Seeds(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return int(torch.default_generator.initial_seed())

    ds = SeedPerSample(Seeds(), seed=2**40 + 7)
    dl = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=collate,
                                     persistent_workers=workers > 0)  # fmt: skip
    for epoch in (0, 1, 5, 1):
        ds.set_epoch(epoch)
        got = [s for batch in dl for s in batch]  # 64-bit seeds: kept as ints
        assert got == [derive_seed(2**40 + 7, epoch, i, 0) for i in range(10)]
