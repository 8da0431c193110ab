"""A sample read more than once in an epoch draws anew at each read. torchfeed.loader seeds a
sample's draws from (seed, epoch, index): under a sampler that yields an index again
(WeightedRandomSampler with replacement, the common answer to class imbalance; repeated
augmentation) every read of an oversampled sample got the same augmentation, where a DataLoader
gives each its own. A read is now seeded from (seed, epoch, index, part), part 0 for a first read
(so every other sampler draws as before), else count * world + rank: reproducible, the same after
a resume."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, Sampler, WeightedRandomSampler

import torchfeed
from torchfeed.data import DistributedSampler, seed_sample

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

SEED = 5
WEIGHTS = [12.0] + [1.0] * 9  # sample 0 oversampled


class Seeds(Dataset):
    """Each read: the index as the dataset got it, and the seed its draws come from."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return type(i) is int, i, torch.default_generator.initial_seed()


def collate(batch):
    return batch


def expected_seed(index: int, part: int, epoch: int = 0) -> int:
    seed_sample(SEED, epoch, index, part)  # the public rule, computed independently
    return torch.default_generator.initial_seed()


def read(loader):
    return [row for batch in loader for row in (batch if isinstance(batch, list) else [batch])]


def parts_of(indices, rank=0, world=1):
    seen, parts = {}, []
    for i in indices:
        parts.append(seen.get(i, 0) * world + rank)
        seen[i] = seen.get(i, 0) + 1
    return parts


def weighted_loader(workers, batch_size=4, **kw):
    sampler = WeightedRandomSampler(WEIGHTS, num_samples=30, replacement=True)
    return torchfeed.loader(Seeds(), batch_size=batch_size, sampler=sampler, num_workers=workers,
                            generator=torch.Generator().manual_seed(SEED), collate_fn=collate,
                            **kw)  # fmt: skip


@pytest.mark.parametrize("batch_size", [4, None])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_read_of_an_oversampled_sample_draws_anew(workers, batch_size):
    torch.manual_seed(0)
    rows = read(weighted_loader(workers, batch_size))
    indices = [i for _, i, _ in rows]
    assert indices.count(0) > 5  # oversampled
    parts = parts_of(indices)
    assert [s for _, _, s in rows] == [
        expected_seed(i, p) for i, p in zip(indices, parts, strict=True)
    ]
    assert len({s for _, i, s in rows if i == 0}) == indices.count(0)  # was 1 for all its reads
    assert all(plain for plain, _, _ in rows)  # the dataset reads plain int indices


@pytest.mark.parametrize("kind", ["sequential", "shuffle", "torchfeed", "torch"])
def test_samplers_that_read_each_index_once_draw_as_before(kind):
    """A first read is part 0: derive_seed(seed, epoch, index, 0), as before this change."""
    torch.manual_seed(0)
    kw = {"shuffle": kind == "shuffle", "generator": torch.Generator().manual_seed(SEED)}
    if kind == "torchfeed":
        kw = {"sampler": DistributedSampler(10, 1, 0, seed=SEED)}
    elif kind == "torch":
        kw["sampler"] = torch.utils.data.DistributedSampler(range(10), 1, 0, seed=SEED)
        del kw["shuffle"]
    rows = read(torchfeed.loader(Seeds(), batch_size=3, collate_fn=collate, **kw))
    assert sorted(i for _, i, _ in rows) == list(range(10))
    assert [s for _, _, s in rows] == [expected_seed(i, 0) for _, i, _ in rows]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_epoch_draws_what_the_uninterrupted_one_drew(workers):
    """The reads consumed before the checkpoint count: the resumed reads are the same parts."""
    torch.manual_seed(0)
    whole = read(weighted_loader(workers))
    torch.manual_seed(0)
    loader = weighted_loader(workers)
    it = iter(loader)
    head = [row for _ in range(3) for row in next(it)]
    state = loader.state_dict()
    del it
    torch.manual_seed(1)  # (the checkpoint holds the epoch's random state)
    resumed = weighted_loader(workers)
    resumed.load_state_dict(state)
    assert head + read(resumed) == whole


class Everything(Sampler):
    """Every index on every rank (a sampler of the user's own: the ranks' reads overlap)."""

    def __iter__(self):
        return iter(range(10))

    def __len__(self):
        return 10


def test_ranks_that_read_the_same_index_draw_apart(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    seeds = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        loader = torchfeed.loader(Seeds(), batch_size=4, sampler=Everything(), collate_fn=collate,
                                  generator=torch.Generator().manual_seed(SEED))  # fmt: skip
        rows = read(loader)
        seeds[rank] = [s for _, _, s in rows]
        assert seeds[rank] == [expected_seed(i, rank) for i in range(10)]
    assert not set(seeds[0]) & set(seeds[1])


def test_without_per_sample_seeds_the_dataset_gets_plain_indices():
    torch.manual_seed(0)
    rows = read(weighted_loader(2, seed_samples=False))
    assert all(plain for plain, _, _ in rows)


def test_the_prefetchers_per_image_draws_differ_between_reads_of_a_sample():
    """A DevicePrefetcher's transform draws image j from its sample (the loader's keys): each
    read of an oversampled sample its own crop, the first read's the one it always had."""
    crop = torchfeed.RandomResizedCropFlipNormalize(8, mean=[0.5], std=[0.5], return_params=True)

    class Images(Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            return i, torch.full((1, 40, 50), i, dtype=torch.uint8)

    def boxes(batch):
        indices, images = zip(*batch, strict=True)
        _, params = crop(list(images))
        return [(i, tuple(params["boxes"][k].tolist())) for k, i in enumerate(indices)]

    def drawn(sampler):
        torch.manual_seed(0)
        loader = torchfeed.loader(Images(), batch_size=4, sampler=sampler, collate_fn=list,
                                  generator=torch.Generator().manual_seed(SEED))  # fmt: skip
        return [d for b in torchfeed.DevicePrefetcher(loader, "cpu", transform=boxes) for d in b]

    torch.manual_seed(0)
    reads = drawn(WeightedRandomSampler(WEIGHTS, num_samples=30, replacement=True))
    zero = [box for i, box in reads if i == 0]
    assert len(zero) > 5 and len(set(zero)) == len(zero)
    once = dict(drawn(torch.utils.data.SequentialSampler(range(10))))
    first = {}
    for i, box in reads:
        first.setdefault(i, box)
    assert all(once[i] == box for i, box in first.items())


@pytest.mark.parametrize("world, rank", [(1, 0), (3, 2)])
def test_reads_are_counted_as_a_plain_count_would_count_them(world, rank):
    """The counts (vectorized over a batch, repeats within one batch included) against a dict
    counted read by read; indices outside the dataset and keys that are not indices too."""
    from torchfeed._loader_iterators import _Occurrences
    from torchfeed.data._seeding import Occurrence

    counter = _Occurrences(rank, world, True, 30)
    seen: dict = {}
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 30, (int(n),), generator=g).tolist()
               for n in torch.randint(1, 20, (40,), generator=g)]  # fmt: skip
    batches += [[5, -1, 100, 5, -1], ["a", 5, "a"], [7]]
    for batch in batches:
        got = counter(batch)
        for index, out in zip(batch, got, strict=True):
            if isinstance(index, str):
                assert out == index
                continue
            part = seen.get(index, 0) * world + rank
            seen[index] = seen.get(index, 0) + 1
            assert out == index and type(out) is (Occurrence if part else int)
            assert getattr(out, "part", 0) == part
    one = _Occurrences(rank, world, True, 30)  # batch_size=None: one index at a time
    assert [getattr(one(3), "part", 0) for _ in range(3)] == [rank, world + rank, 2 * world + rank]
