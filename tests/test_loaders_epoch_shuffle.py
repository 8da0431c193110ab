"""torchfeed.loader's ``shuffle=True``: torch's RandomSampler (the same orders as a DataLoader's
while nobody sets an epoch), plus ``set_epoch``, which PyTorch Lightning calls on a loader's
sampler each epoch. Once set, epoch e's order comes from (seed, e), as a DistributedSampler's on
one rank: a run restarted at an epoch's end, where Lightning restores neither the random state
nor the loader's checkpoint (it seeds again, makes the iterator, then sets the epoch), reads the
next epoch's order and per-sample draws instead of epoch 0's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler as TorchSampler

import torchfeed

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

N = 24


class Drawn(torch.utils.data.Dataset):
    """Sample i and a draw of its own (torchfeed.loader seeds it from (seed, epoch, i))."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item()])


def epoch(dl) -> torch.Tensor:
    return torch.cat([b.clone() for b in dl])


def make(workers=0, **kw):
    return torchfeed.loader(Drawn(), batch_size=4, shuffle=True, num_workers=workers, **kw)


@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_without_set_epoch_the_orders_are_a_dataloaders(generator, workers):
    """(Over samples that draw nothing: without workers, a DataLoader's samples draw from the
    global generator, which torchfeed.loader leaves to the loop, and so its later orders.)"""

    def orders(build):
        torch.manual_seed(5)
        g = torch.Generator().manual_seed(9) if generator else None
        dl = build(list(range(N)), batch_size=4, shuffle=True, generator=g, num_workers=workers)
        return [torch.cat(list(dl)).tolist() for _ in range(3)]

    got, expected = orders(torchfeed.loader), orders(DataLoader)
    assert got == expected
    assert got[0] != got[1]


def test_the_sampler_is_a_random_sampler_that_takes_an_epoch():
    dl = make()
    assert isinstance(dl.sampler, RandomSampler) and len(dl.sampler) == N
    for bad in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match="set_epoch: epoch must be an int"):
            dl.sampler.set_epoch(bad)
    dl.sampler.set_epoch(np.int64(2))
    assert type(dl.sampler.epoch) is int and dl.sampler.epoch == 2


@pytest.mark.parametrize(
    "seed_from", ["torch.manual_seed", "generator", "seed_samples", "seed_samples=False"]
)
def test_a_set_epoch_is_a_permutation_from_the_seed_and_epoch(seed_from):
    """Epoch e's order is torch's DistributedSampler's on one rank with the same seed, whatever
    the global random state when the epoch starts."""
    torch.manual_seed(11)
    kw = {
        "torch.manual_seed": {},
        "generator": {"generator": torch.Generator().manual_seed(12)},
        "seed_samples": {"seed_samples": 13},
        "seed_samples=False": {"seed_samples": False},
    }[seed_from]
    dl = make(**kw)
    seed = {"generator": 12, "seed_samples": 13}.get(seed_from, 11)
    reference = TorchSampler(range(N), num_replicas=1, rank=0, shuffle=True, seed=seed)
    for e in (3, 0, 3):
        dl.sampler.set_epoch(e)
        reference.set_epoch(e)
        torch.manual_seed(100 + e)  # another global state each time: no effect on the order
        assert epoch(dl)[:, 0].long().tolist() == list(reference)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restart_at_an_epochs_end_reads_the_next_epoch(workers):
    """Lightning's order on a restart from an end-of-epoch checkpoint: seed again, a new loader,
    iter(), then set_epoch. Before, the restarted run read epoch 0's order and draws again."""

    def uninterrupted():
        torch.manual_seed(0)
        dl = make(workers)
        out = []
        for e in range(3):
            it = iter(dl)
            dl.sampler.set_epoch(e)
            out.append(epoch(it))
        return out

    def restarted():
        torch.manual_seed(0)
        dl = make(workers)
        out = []
        for e in (1, 2):
            it = iter(dl)
            dl.sampler.set_epoch(e)
            out.append(epoch(it))
        return out

    full, again = uninterrupted(), restarted()
    assert not torch.equal(full[0][:, 0], full[1][:, 0])
    for got, expected in zip(again, full[1:], strict=True):
        assert torch.equal(got, expected)
        assert sorted(got[:, 0].tolist()) == list(range(N))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_mid_epoch_resume_with_the_epoch_set_after_iter(workers):
    """Lightning's order on a mid-epoch resume: load_state_dict, iter(), set_epoch. The rest of
    the epoch is the uninterrupted run's, each sample once."""
    torch.manual_seed(0)
    dl = make(workers)
    dl.sampler.set_epoch(1)
    batches = [b.clone() for b in dl]
    dl.sampler.set_epoch(1)
    it = iter(dl)
    [next(it) for _ in range(2)]
    state = dl.state_dict()

    torch.manual_seed(0)
    resumed = make(workers)
    resumed.load_state_dict(state)
    it = iter(resumed)
    resumed.sampler.set_epoch(1)
    assert torch.equal(epoch(it), torch.cat(batches[2:]))


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_on_the_sampler_alone_sets_the_per_sample_epoch(workers):
    """Hugging Face Accelerate rebuilds the loader over its dataset and sampler, and on several
    processes calls set_epoch on the sampler alone (its dataset's only when the sampler has
    none): each epoch's per-sample draws must still be that epoch's, not epoch 0's again."""
    torch.manual_seed(0)
    dl = make(workers)
    rebuilt = DataLoader(dl.dataset, batch_size=4, sampler=dl.sampler, num_workers=workers)
    draws = []
    for e in range(2):
        rebuilt.sampler.set_epoch(e)
        assert dl.dataset.epoch == e
        draws.append({int(i): d for i, d in epoch(rebuilt).tolist()})
    assert all(draws[0][i] != draws[1][i] for i in range(N))


def test_on_several_ranks_the_order_stays_drawn_from_the_generator(monkeypatch):
    """Accelerate keeps the sampler's generator in step across its processes and shards one
    order over them; a permutation from each rank's own seed would shard different orders
    (ranks seeded apart read some samples twice and others never)."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")

    def orders(set_epoch):
        dl = make(generator=torch.Generator().manual_seed(7))
        out = []
        for e in range(2):
            if set_epoch:
                dl.sampler.set_epoch(e)
            out.append(epoch(dl)[:, 0].tolist())
        return out

    assert orders(True) == orders(False)


def test_set_epoch_on_the_loader_is_the_samplers():
    """The Hugging Face Trainer calls set_epoch on a loader that has one (the one its
    get_train_dataloader returns, when that is torchfeed.loader(...) as it is)."""
    torch.manual_seed(0)
    dl = make()
    dl.set_epoch(np.int64(3))
    assert dl.sampler.epoch == 3 and dl.dataset.epoch == 3
    with pytest.raises(TypeError, match="set_epoch: epoch must be an int"):
        dl.set_epoch(1.0)
    # a sampler without set_epoch: nothing to set, the per-sample epoch stays the loader's count
    plain = torchfeed.loader(Drawn(), batch_size=4)
    plain.set_epoch(5)
    first = epoch(plain)
    assert plain.dataset.epoch == 0 and not torch.equal(first, epoch(plain))


def test_the_batch_sampler_deals_a_batch_samplers_batches_and_takes_an_epoch():
    dl = make(drop_last=True)
    batches = dl.batch_sampler
    # torch's own type: Lightning and Accelerate rebuild a loader around a batch sampler of
    # another type as a custom one
    assert type(batches) is torch.utils.data.BatchSampler and batches.sampler is dl.sampler
    assert dl.batch_size == 4 and dl.drop_last and batches.drop_last
    batches.set_epoch(2)
    assert dl.sampler.epoch == 2 and dl.dataset.epoch == 2
    expected = list(torch.utils.data.BatchSampler(dl.sampler, 4, True))
    assert list(batches) == expected and len(expected) == N // 4
    # an epoch is each index once: no per-read seeds (the loader counts no occurrences)
    from torchfeed._loader_iterators import _Occurrences

    assert _Occurrences.of(dl) is None


class SkipBatches(torch.utils.data.Sampler):
    """What Accelerate's skip_first_batches wraps a plain DataLoader's batch sampler in."""

    def __init__(self, batch_sampler, skip):
        self.batch_sampler, self.skip = batch_sampler, skip

    def __iter__(self):
        for k, batch in enumerate(self.batch_sampler):
            if k >= self.skip:
                yield batch

    def __len__(self):
        return len(self.batch_sampler) - self.skip


@pytest.mark.parametrize("workers", [0, 2])
def test_a_trainers_mid_epoch_resume_through_skipped_batches(workers):
    """The Hugging Face Trainer (transformers 5.24) resumes mid-epoch by rebuilding the loader
    its get_train_dataloader returned as a plain DataLoader over SkipBatchSampler(the loader's
    batch sampler), then calls set_epoch on ``loader.batch_sampler.batch_sampler`` and iterates
    before it restores torch's random state. The rest of the epoch must be the uninterrupted
    run's, order and per-sample draws; before, the order was a fresh draw from the global
    generator (a throwaway Trainer run read 33 of 40 samples in the resumed epoch)."""
    torch.manual_seed(0)
    dl = make(workers)
    full = []
    for e in range(2):
        dl.set_epoch(e)
        full.append(epoch(dl))

    torch.manual_seed(0)
    fresh = make(workers)
    torch.manual_seed(123)  # the state a resumed run is in: not the epoch's
    rebuilt = DataLoader(
        fresh.dataset,
        batch_sampler=SkipBatches(fresh.batch_sampler, 2),
        collate_fn=fresh.collate_fn,
        num_workers=workers,
    )
    rebuilt.batch_sampler.batch_sampler.set_epoch(1)
    assert torch.equal(epoch(rebuilt), full[1][8:])


def test_the_batch_samplers_epoch_reaches_the_samples_after_its_sampler_is_replaced():
    """Accelerate's prepare() puts its own sampler into the loader's batch sampler (its seedable
    one, which takes no per-sample epoch) and then calls set_epoch on the batch sampler: the
    per-sample draws must still be that epoch's (a throwaway Trainer run resumed mid-epoch had 7
    of 17 batches with another epoch's draws before)."""
    torch.manual_seed(0)
    dl = make()
    dl.batch_sampler.sampler = RandomSampler(dl.dataset)
    dl.batch_sampler.set_epoch(4)
    assert dl.dataset.epoch == 4
