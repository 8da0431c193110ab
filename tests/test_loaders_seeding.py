"""Randomness that follows the sample: through torchfeed.loader a map-style dataset's draws
(torch, numpy, random, a torchfeed transform with the global generator) are a function of (seed,
epoch, index), so an uninterrupted run, a resumed one on the same world, one resumed on another
world size and one with another worker count draw the same augmentation for the same sample;
the zero-copy loader draws what the ordinary one draws; the main process's own generators are
left as they were."""

from __future__ import annotations

import itertools
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


# A dataset with a batched read of its own (__getitems__, as a Hugging Face dataset has): read
# with it when the read draws nothing, else sample by sample, seeded.

DRAWS = {
    "nothing": lambda: 0.0,
    "torch": lambda: torch.rand(()).item(),
    "numpy": lambda: float(np.random.rand()),
    "numpy gaussian": lambda: float(np.random.randn()),
    "random": random.random,
    "random shuffle": lambda: float(random.sample(range(100), 1)[0]),
}


class Batched(Dataset):
    """Sample i is (i, a draw); ``__getitems__`` reads several at once and marks them."""

    def __init__(self, draw="nothing", n=N):
        self.draw, self.n, self.batched_reads = draw, n, []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, DRAWS[self.draw](), "one"

    def __getitems__(self, indices):
        self.batched_reads.append(list(indices))
        return [(i, DRAWS[self.draw](), "batched") for i in indices]


def generator_states():
    return (torch.get_rng_state(), np.random.get_state()[1].copy(), np.random.get_state()[2:],
            random.getstate())  # fmt: skip


def same_states(a, b):
    return torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2:] == b[2:]


def test_a_batched_read_that_draws_nothing_is_the_read():
    ds = SeedPerSample(Batched(), seed=5)
    np.random.randn()  # a cached gaussian in the main process's numpy, kept as it is
    before = generator_states()
    for start in (0, 8, 16):
        batch = ds.__getitems__(list(range(start, start + 8)))
        assert batch == [(i, 0.0, "batched") for i in range(start, start + 8)]
    # the first batch read its first sample alone (a dataset that draws reads one sample twice)
    assert ds.dataset.batched_reads == [
        [0],
        list(range(1, 8)),
        list(range(8, 16)),
        list(range(16, 24)),
    ]
    assert same_states(before, generator_states())


@pytest.mark.parametrize("draw", [d for d in DRAWS if d != "nothing"])
def test_a_batched_read_that_draws_is_read_again_sample_by_sample(draw):
    ds = SeedPerSample(Batched(draw), seed=5)
    before = generator_states()
    first = ds.__getitems__([3, 9, 4])
    later = ds.__getitems__([10, 11])
    # the draws seed_sample gives each sample, whoever reads it
    assert first == [ds[i] for i in (3, 9, 4)] and later == [ds[10], ds[11]]
    assert [s[2] for s in first + later] == ["one"] * 5
    assert len({s[1] for s in first + later}) == 5
    assert ds.dataset.batched_reads == [[3]]  # one sample read twice, then never tried again
    assert same_states(before, generator_states())


@pytest.mark.parametrize("draw", ["nothing", "torch"])
def test_a_subset_which_passes_batches_on_draws_what_reads_by_index_draw(draw):
    # torch's Subset has __getitems__ whatever it wraps: a random_split of a dataset read by
    # index is read through it
    subset = torch.utils.data.Subset(ReadByIndex(draw), [5, 2, 9, 30, 7])
    ds = SeedPerSample(subset, seed=5)
    by_index = [ds[i] for i in range(5)]
    assert ds.__getitems__([0, 1, 2]) + ds.__getitems__([3, 4]) == by_index


@pytest.mark.parametrize("nested", [False, True])
def test_a_subset_of_a_dataset_read_by_index_is_read_by_index(nested):
    """A random_split of a dataset that augments with torch: each sample read once (a Subset's
    batched read would be found drawing, its first sample read twice and every later sample
    seeded all three ways); a Subset of a dataset with a batched read of its own keeps it."""
    inner = Logged(numpy_from=N, torch=True)
    subset = torch.utils.data.Subset(inner, [5, 2, 9, 30, 7, 1, 0])
    if nested:
        subset = torch.utils.data.Subset(subset, [6, 5, 4, 3, 2, 1, 0])
    order = [subset[i][0] for i in range(7)]
    inner.reads.clear()
    ds = SeedPerSample(subset, seed=5)
    got = ds.__getitems__([0, 1, 2]) + ds.__getitems__([3, 4, 5, 6])
    assert inner.reads == order  # each once, in order
    assert not ds.__dict__.get("_drew")
    assert got == [ds[i] for i in range(7)]
    batched = Batched()
    ds = SeedPerSample(torch.utils.data.Subset(batched, [4, 1, 3]), seed=5)
    assert [s[2] for s in ds.__getitems__([0, 1, 2])] == ["batched"] * 3
    assert batched.batched_reads == [[4], [1, 3]]


def test_a_batched_read_that_returns_no_list_is_read_by_index():
    class Columns(Batched):
        def __getitems__(self, indices):  # a batch of columns, not the list of samples
            return {"index": list(indices)}

    ds = SeedPerSample(Columns(), seed=5)
    assert ds.__getitems__([1, 2]) == [(1, 0.0, "one"), (2, 0.0, "one")]


def test_a_falsy_batched_read_is_not_called():
    data = Batched()
    data.__getitems__ = None  # the DataLoader's own test: hasattr and truthiness
    ds = SeedPerSample(data, seed=5)
    assert ds.__getitems__([1, 2]) == [(1, 0.0, "one"), (2, 0.0, "one")]


@pytest.mark.parametrize("layout", ["the key first", "another", "numpy before 1.25"])
def test_draws_are_found_with_numpys_state_read_either_way(monkeypatch, layout):
    from torchfeed.data import _seeding

    if layout == "another":  # the bytes at the state address are not the key: the whole state
        monkeypatch.setattr(_seeding.ctypes, "string_at", lambda address, size: bytes(size))
    if layout == "numpy before 1.25":  # no get_bit_generator: the whole state
        monkeypatch.delattr(_seeding.mtrand, "get_bit_generator")
    _seeding._numpy_key_reader.cache_clear()  # made afresh under this layout, and after it
    saved = _seeding._generator_states()
    try:
        reader = _seeding._numpy_key_reader()
        assert reader.__name__ == ("fast" if layout == "the key first" else "slow")
        for seed, draw in enumerate(("torch", "numpy", "numpy gaussian", "random")):

            def read(indices, draw=draw):
                DRAWS[draw]()
                return list(indices)

            assert _seeding._read_drawing_nothing(list, [1, 2], seed) == [1, 2]
            assert _seeding._read_drawing_nothing(read, [1, 2], seed) is None, draw
        assert _seeding._numpy_key_reader() is reader
    finally:
        _seeding._set_generator_states(saved)
        _seeding._numpy_key_reader.cache_clear()


def test_a_batched_read_is_seeded_as_its_first_sample_is():
    # a read that draws nothing but derives a generator of its own from torch.initial_seed()
    # is not seen to draw: it gets its first sample's seed, one per batch, never one for all
    class InitialSeed(Batched):
        def __getitem__(self, i):
            return i, torch.initial_seed()

        def __getitems__(self, indices):
            return [(i, torch.initial_seed()) for i in indices]

    ds = SeedPerSample(InitialSeed(), seed=5)
    first, second = ds.__getitems__([0, 1, 2]), ds.__getitems__([3, 4, 5])
    assert first[0] == ds[0] and second[0] == ds[3]
    assert {s for _, s in first[1:]} == {ds[1][1]} and {s for _, s in second} == {ds[3][1]}


@pytest.mark.parametrize("draw", ["nothing", "torch", "numpy"])
def test_through_the_loader_a_batched_dataset_draws_what_one_read_by_index_draws(draw):
    def read(data, workers):
        fork = {"multiprocessing_context": "fork"} if workers else {}
        dl = torchfeed.loader(data, batch_size=6, num_workers=workers, collate_fn=collate,
                              seed_samples=3, **fork)  # fmt: skip
        return [s for b in dl for s in b]

    by_index = read(ReadByIndex(draw), 0)
    assert {s[2] for s in by_index} == {"one"}
    for workers in (0, 2):
        got = read(Batched(draw), workers)
        assert [s[:2] for s in got] == [s[:2] for s in by_index]
        assert {s[2] for s in got} == ({"batched"} if draw == "nothing" else {"one"})


class ReadByIndex(Batched):
    __getitems__ = None  # type: ignore[assignment]


def drawing_collate(batch):
    # a random transform in the worker, after the read: draws from the worker's generator
    return batch, torch.rand(()).item()


class OneByOne(Dataset):
    """A SeedPerSample read only through its __getitem__ (every generator seeded before every
    sample), by a plain DataLoader: the reference the batched reads are held to."""

    def __init__(self, data, seed):
        self.seeded = SeedPerSample(data, seed)

    def __len__(self):
        return len(self.seeded)

    def __getitem__(self, i):
        return self.seeded[i]


def read_drawn(loader):
    return [(tuple(s[:2] for s in b), d) for b, d in loader]


@pytest.mark.parametrize("workers", [2, 0])
@pytest.mark.parametrize("draw", ["nothing", "torch", "numpy", "random"])
def test_a_collate_drawing_after_a_batched_read_draws_what_it_drew_after_reads_by_index(
    draw, workers
):
    """In a worker and, through torchfeed.loader, in the main process (num_workers=0)."""
    options = dict(batch_size=6, collate_fn=drawing_collate)
    want = read_drawn(torch.utils.data.DataLoader(OneByOne(ReadByIndex(draw), 3), num_workers=2,
                                                  multiprocessing_context="fork", **options))  # fmt: skip
    extra = {"multiprocessing_context": "fork"} if workers else {}
    for data in (ReadByIndex(draw), Batched(draw)):
        got = read_drawn(torchfeed.loader(data, seed_samples=3, num_workers=workers, **options,
                                          **extra))  # fmt: skip
        assert got == want
    assert len({d for _, d in want}) == len(want)  # a draw of its own for every batch


@pytest.mark.parametrize("draw", ["torch", "numpy"])
@pytest.mark.parametrize("data", ["by index", "batched"])
def test_in_the_main_process_the_loop_draws_its_own_between_batches(draw, data):
    """torchfeed.loader with num_workers=0: the collate draws as in a worker (above), and the
    loop between batches what it draws over an unseeded dataset that draws nothing; a
    ``dataset[i]`` of the user's own, between batches, leaves the loop's draws alone too."""

    def run(dataset, seed_samples):
        torch.manual_seed(5)
        np.random.seed(5)
        random.seed(5)
        np.random.randn()  # a gaussian cached in numpy's state
        loader = torchfeed.loader(dataset, seed_samples=seed_samples, batch_size=6,
                                  collate_fn=drawing_collate if seed_samples else collate)  # fmt: skip
        loop = []
        for _ in loader:
            loader.dataset[0]
            loop.append((torch.rand(()).item(), float(np.random.randn()), random.random()))
        return loop

    make = Batched if data == "batched" else ReadByIndex
    got = run(make(draw), 3)
    assert got == run(make("nothing"), False) and len(set(got)) == len(got) > 2


class Logged(ReadByIndex):
    """Read by index, each read logged; draws from numpy only for samples from ``numpy_from``
    on (from torch for the others, when ``torch``)."""

    def __init__(self, numpy_from=0, torch=False):
        super().__init__()
        self.numpy_from, self.torch, self.reads = numpy_from, torch, []

    def __getitem__(self, i):
        self.reads.append(i)
        draws = (np.random.rand() if i >= self.numpy_from else 0.0,
                 globals()["torch"].rand(()).item() if self.torch else 0.0,
                 globals()["torch"].initial_seed())  # fmt: skip
        return i, draws


@pytest.mark.parametrize("torch_draws", [False, True])
def test_a_dataset_read_by_index_is_seeded_for_each_sample_once(torch_draws):
    """torch's generator is seeded before every sample (its draws and torch.initial_seed()
    follow the sample); numpy's and random's once a batch, while the reads leave them be."""
    ds = SeedPerSample(Logged(numpy_from=N, torch=torch_draws), seed=5)
    want = [ds[i] for i in range(12)]
    ds.dataset.reads.clear()
    before = generator_states()
    got = ds.__getitems__([0, 1, 2, 3, 4, 5]) + ds.__getitems__([6, 7, 8, 9, 10, 11])
    assert got == want and len({s[1] for s in got}) == 12
    assert ds.dataset.reads == list(range(12))  # each sample read once
    assert same_states(before, generator_states())  # the main process's own, once a batch


def test_a_dataset_read_by_index_that_draws_from_numpy_is_seeded_for_each_sample():
    ds = SeedPerSample(Logged(numpy_from=0), seed=5)
    want = [ds[i] for i in (3, 9, 4, 10, 11)]
    ds.dataset.reads.clear()
    assert ds.__getitems__([3, 9, 4]) + ds.__getitems__([10, 11]) == want
    assert ds.dataset.reads == [3, 3, 9, 4, 10, 11]  # the first sample read twice, no other

    # a dataset that starts to draw in a later batch: that batch is read again, then no other
    ds = SeedPerSample(Logged(numpy_from=8), seed=5)
    want = [ds[i] for i in range(16)]
    ds.dataset.reads.clear()
    got = [s for start in (0, 4, 8, 12) for s in ds.__getitems__(list(range(start, start + 4)))]
    assert got == want
    assert ds.dataset.reads == [*range(8), *range(8, 12), *range(8, 16)]


@pytest.mark.parametrize("draw", ["nothing", "torch", "numpy"])
def test_a_worker_is_left_as_reads_by_index_seeded_for_each_sample_leave_it(draw, monkeypatch):
    """In a worker, after a batch, every generator is where seeding the batch's last sample and
    reading it left it: what the worker draws next (its collate) does not depend on how the
    batch was read."""
    from torchfeed.data import _seeding

    monkeypatch.setattr(_seeding, "get_worker_info", lambda: object())
    after, batches = [], []
    for read in ("one by one", "by index", "batched"):
        ds = SeedPerSample(Batched(draw) if read == "batched" else ReadByIndex(draw), seed=5)
        got = []
        for indices in (list(range(5)), list(range(5, 10))):
            got += [ds[i] for i in indices] if read == "one by one" else ds.__getitems__(indices)
        after.append(generator_states())
        batches.append([s[:2] for s in got])
    assert batches[1] == batches[0] and batches[2] == batches[0]
    assert same_states(after[1], after[0]) and same_states(after[2], after[0])


@pytest.mark.parametrize("kind", ["list", "tuple", "numpy", "tensor", "generator"])
@pytest.mark.parametrize("data", ["by index", "batched"])
def test_a_batch_sampler_may_yield_any_iterable_of_indices(kind, data):
    """What a batch sampler yields reaches __getitems__ as it is: numpy arrays and tensors (whose
    truth value raises) are read as the plain DataLoader reads them."""
    make = {"list": list, "tuple": tuple, "numpy": np.array, "tensor": torch.tensor,
            "generator": lambda b: (i for i in b)}[kind]  # fmt: skip
    batches = [[3, 1, 2], [0], [4, 5]]
    dataset = Batched() if data == "batched" else ReadByIndex()
    loader = torchfeed.loader(dataset, batch_sampler=[make(b) for b in batches],
                              collate_fn=collate)  # fmt: skip
    assert [[int(s[0]) for s in b] for b in loader] == batches


@pytest.mark.parametrize("workers", [0, 2])
def test_a_random_collate_draws_the_same_after_a_resume(workers):
    def run(steps=None, state=None):
        torch.manual_seed(0)
        loader = torchfeed.loader(ReadByIndex("torch"), seed_samples=3, batch_size=4,
                                  shuffle=True, num_workers=workers, collate_fn=drawing_collate)  # fmt: skip
        if state is not None:
            loader.load_state_dict(state)
        out = []
        for b, d in loader:
            out.append((tuple(s[:2] for s in b), d))
            if len(out) == steps:
                return out, loader.state_dict()
        return out, None

    full, _ = run()
    assert len({d for _, d in full}) == len(full)
    for steps in (1, 4):
        head, state = run(steps)
        tail, _ = run(state=state)
        assert head + tail == full, steps


def drawn_with_generator(global_seed: int, generator_seed: int, workers: int):
    torch.manual_seed(global_seed)  # (a run's model seed, say, that the data should not follow)
    g = torch.Generator().manual_seed(generator_seed)
    loader = torchfeed.loader(Augmented(), batch_size=4, shuffle=True, num_workers=workers,
                              generator=g, collate_fn=collate)  # fmt: skip
    return [b for b in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loaders_generator_seeds_its_samples(workers):
    """PyTorch's reproducibility recipe seeds the DataLoader's generator, which orders the
    samples and seeds the workers: the samples drew from torch.initial_seed() instead, so two
    runs of one generator seed and other global seeds got the same order and other crops."""
    first = drawn_with_generator(1, 0, workers)
    assert drawn_with_generator(2, 0, workers) == first
    other = drawn_with_generator(1, 5, workers)
    assert sorted(d for b in other for d in b) != sorted(d for b in first for d in b)


class Endless(torch.utils.data.Sampler):
    """A sampler of unknown length, as an infinite or streaming sampler is: len() raises."""

    def __iter__(self):
        return itertools.cycle(range(N))

    def __len__(self):
        raise TypeError("Endless has no length")


@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_without_a_length_is_not_asked_for_one(workers):
    """The loader found the sampler's seed with `sampler or ...`, which calls len(): a sampler
    whose len() raises (as a plain DataLoader accepts) failed at torchfeed.loader()."""

    def make():
        return torchfeed.loader(Augmented(), batch_size=4, sampler=Endless(),
                                num_workers=workers, collate_fn=collate)  # fmt: skip

    loader = make()
    it = iter(loader)
    assert [[i for i, _ in next(it)] for _ in range(10)][-1] == [36, 0, 1, 2]
    state, after = loader.state_dict(), [next(it) for _ in range(2)]
    resumed = make()
    resumed.load_state_dict(state)
    assert list(itertools.islice(resumed, 2)) == after


class Seeded(torch.utils.data.Sampler):
    """A sampler with a seed of its own, as DistributedSampler has."""

    def __init__(self, indices, seed):
        self.indices, self.seed = indices, seed

    def __iter__(self):
        return iter(self.indices)

    def __len__(self):
        return len(self.indices)


@pytest.mark.parametrize("given", ["by name", "by position", "empty"])
def test_the_samples_seed_is_the_samplers_however_it_is_given(given):
    """DataLoader(dataset, batch_size, shuffle, sampler, ...): a sampler given by position, and
    an empty one (which `sampler or ...` passed over), seed the samples too."""
    indices = [] if given == "empty" else [3, 4]
    if given == "by position":
        loader = torchfeed.loader(Augmented(), 2, None, Seeded(indices, 5), collate_fn=collate)
    else:
        loader = torchfeed.loader(Augmented(), batch_size=2, sampler=Seeded(indices, 5),
                                  collate_fn=collate)  # fmt: skip
    assert loader.dataset.seed == 5
    if indices:
        other = torchfeed.loader(Augmented(), batch_size=2, sampler=Seeded(indices, 6),
                                 collate_fn=collate)  # fmt: skip
        assert list(loader) != list(other)
