"""Mid-epoch checkpoints (issue 13): epoch plans, the distributed sampler, the sharded dataset,
torchfeed.loader (ordinary and zero-copy) and torchdata's StatefulDataLoader. Deterministic
resume reproduces the uninterrupted run bit for bit; elastic resume reads every sample not yet
consumed exactly once. (The torchrun runs over real ranks are in test_resume_torchrun.py.)"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfeed
from torchfeed.data import (
    DistributedSampler,
    SerializedList,
    ShardedIterableDataset,
    SkipCorrupt,
    WorkerSeeder,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create"),
    # torchdata 0.11 calls an API torch deprecates
    pytest.mark.filterwarnings("ignore:.set_vital. is deprecated"),
]


class Noisy(Dataset):
    """A sample and an augmentation drawn from torch's generator (reseeded per sample)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        torchfeed.data.seed_sample(self.seed, self.epoch, i, 0)
        return i, torch.rand(1).item()


def collate(batch):
    return batch


def map_loaders(world, n=61, batch_size=4, workers=1, epoch=1):
    out = []
    for rank in range(world):
        sampler = DistributedSampler(n, world, rank, seed=7)
        sampler.set_epoch(epoch)
        out.append(
            torchfeed.loader(
                Noisy(n),
                batch_size=batch_size,
                sampler=sampler,
                num_workers=workers,
                collate_fn=collate,
            )
        )
    return out


def lockstep(loaders, steps=None):
    its = [iter(dl) for dl in loaders]
    seen = [[] for _ in loaders]
    step = 0
    while steps is None or step < steps:
        try:
            batches = [next(it) for it in its]
        except StopIteration:
            break
        for r, b in enumerate(batches):
            seen[r].extend(b)
        step += 1
    return seen, its


@pytest.mark.parametrize("workers", [0, 2])
def test_map_style_resume_on_the_same_world_is_the_uninterrupted_run(workers):
    full, _ = lockstep(map_loaders(2, workers=workers))
    loaders = map_loaders(2, workers=workers)
    head, its = lockstep(loaders, steps=3)
    state = loaders[0].state_dict()
    del its
    resumed = map_loaders(2, workers=workers)
    for dl in resumed:
        dl.load_state_dict(state)
    tail, _ = lockstep(resumed)
    assert [h + t for h, t in zip(head, tail, strict=True)] == full


@pytest.mark.parametrize(("before", "after"), [(2, 3), (3, 2), (2, 1)])
def test_map_style_elastic_resume_reads_the_rest_in_lockstep(before, after):
    loaders = map_loaders(before)
    head, its = lockstep(loaders, steps=4)
    state = loaders[1].state_dict()  # any rank's checkpoint describes every rank
    del its
    resumed = map_loaders(after)
    for dl in resumed:
        dl.load_state_dict(state)
    assert len({len(dl) for dl in resumed}) == 1  # every rank the same number of batches
    tail, _ = lockstep(resumed)
    read = [i for part in head + tail for i, _ in part]
    full, _ = lockstep(map_loaders(before))
    # drop_last=False: every sample read; torch's padding of the fresh epoch and the resumed
    # one's (the rest's first samples again) are the only repeats
    assert set(read) == {i for part in full for i, _ in part}
    assert len(read) - len(set(read)) < before + after
    augment = {i: a for part in full for i, a in part}
    assert all(augment[i] == a for part in tail for i, a in part)  # the sample's own draw
    # the next epoch is a fresh, balanced plan on the new world
    nxt = map_loaders(after, epoch=2)
    assert len({len(dl) for dl in nxt}) == 1


def shard(k: int):
    for j in range(3):  # lazily: each sample is made after it is seeded
        yield (k, j, torch.rand(1).item())


def iterable(mode, workers, world=1, rank=0, epoch=3, **kw):
    items = list(range(40))
    lengths = [3] * len(items) if mode == "shard" else None
    ds = ShardedIterableDataset(
        items,
        shard if mode == "shard" else (lambda k: (k, 0, torch.rand(1).item())),
        mode=mode,
        seed=11,
        seed_samples=True,
        item_lengths=lengths,
        **kw,
    )
    ds.set_epoch(epoch)
    return ds, torchfeed.loader(ds, batch_size=3, num_workers=workers, collate_fn=collate)


def run_ranks(world, workers, mode, steps=None, state=None, monkeypatch=None, **kw):
    """Lockstep over `world` simulated ranks (each loader's workers see their own RANK)."""
    loaders, its = [], []
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world))
        _, dl = iterable(mode, workers, **kw)
        if state is not None:
            dl.load_state_dict(state)
        loaders.append(dl)
        its.append(iter(dl))  # the workers start now, with this rank's environment
    seen = [[] for _ in range(world)]
    step = 0
    done = [False] * world
    while (steps is None or step < steps) and not all(done):
        for r, it in enumerate(its):
            b = None if done[r] else next(it, None)
            if b is None:
                done[r] = True
            else:
                seen[r].extend(b)
        # a fresh epoch is balanced: the ranks end together (a resumed elastic one may differ)
        assert state is not None or all(done) or not any(done), "ranks out of step"
        step += 1
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    return seen, loaders, its


@pytest.mark.parametrize("mode", ["sample", "shard"])
@pytest.mark.parametrize("workers", [0, 2])
def test_iterable_resume_on_the_same_world_is_the_uninterrupted_run(mode, workers, monkeypatch):
    full, _, _ = run_ranks(2, workers, mode, monkeypatch=monkeypatch)
    for steps in (1, 4, 5):
        head, loaders, its = run_ranks(2, workers, mode, steps=steps, monkeypatch=monkeypatch)
        state = loaders[0].state_dict()
        del its
        tail, _, _ = run_ranks(2, workers, mode, state=state, monkeypatch=monkeypatch)
        assert [h + t for h, t in zip(head, tail, strict=True)] == full, steps


@pytest.mark.parametrize("mode", ["sample", "shard"])
@pytest.mark.parametrize(
    ("before", "after"), [((2, 2), (3, 2)), ((3, 2), (2, 2)), ((2, 2), (2, 1))]
)
def test_iterable_elastic_resume_reads_the_rest_in_lockstep(mode, before, after, monkeypatch):
    full, _, _ = run_ranks(before[0], before[1], mode, monkeypatch=monkeypatch)
    head, loaders, its = run_ranks(before[0], before[1], mode, steps=3, monkeypatch=monkeypatch)
    state = loaders[-1].state_dict()
    del its
    tail, _, _ = run_ranks(after[0], after[1], mode, state=state, monkeypatch=monkeypatch)
    key = lambda s: s[:2]  # noqa: E731  (item, sample within it)
    read = [key(s) for part in head + tail for s in part]
    # uneven="drop": nothing twice, and of the rest at most one sample per consumer left out
    assert len(read) == len(set(read))
    planned = {key(s) for part in full for s in part}
    assert set(read) <= planned and len(planned) - len(read) < after[0] * after[1]
    augment = {key(s): s[2] for part in full for s in part}
    assert all(augment[key(s)] == s[2] for part in tail for s in part)
    counts = [len(p) for p in tail]
    assert len(set(counts)) == 1  # every rank the same number of samples (and batches)


def test_a_checkpoint_needs_streams_of_known_length():
    ds = ShardedIterableDataset(list(range(4)), lambda k: [k] * 3, mode="shard", seed=1)
    dl = torchfeed.loader(ds, batch_size=2, collate_fn=collate)
    it = iter(dl)
    next(it)
    with pytest.raises(ValueError, match="give item_lengths .* or samples_per_epoch"):
        dl.state_dict()


def test_samples_per_epoch_resumes_on_the_same_world_only(monkeypatch):
    def make(workers):
        ds = ShardedIterableDataset(
            list(range(6)),
            lambda k: [(k, j) for j in range(k + 1)],
            mode="shard",
            seed=1,
            samples_per_epoch=7,
        )
        return torchfeed.loader(ds, batch_size=2, num_workers=workers, collate_fn=collate)

    full = list(make(2))
    dl = make(2)
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = dl.state_dict()
    del it
    again = make(2)
    again.load_state_dict(state)
    assert head + list(again) == full
    other = make(1)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="resuming on another number of consumers"):
        list(other)


class Tokens(Dataset):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        if i in (5, 17):
            raise OSError(f"corrupt {i}")
        return {"ids": torch.arange(i % 7 + 1), "label": i}


def zero_copy_loader():
    sampler = DistributedSampler(40, 1, 0, seed=3)
    return torchfeed.loader(
        SkipCorrupt(Tokens()),
        zero_copy=True,
        batch_size=4,
        sampler=sampler,
        num_workers=2,
        collate_fn=torchfeed.PadCollate(["ids"]),
        worker_init_fn=WorkerSeeder(rank=0),
    )


def labels(batches):
    return [int(x) for b in batches for x in b["label"]]


def test_the_zero_copy_loader_resumes_and_keeps_the_skipped_set():
    full = labels(zero_copy_loader())
    dl = zero_copy_loader()
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = dl.state_dict()
    skipped = dl.dataset.skipped_indices
    del it
    again = zero_copy_loader()
    again.load_state_dict(state)
    assert again.dataset.skipped_indices == skipped  # restored with the position
    assert labels(head) + labels(again) == full


def test_worker_seeder_state_is_its_rank():
    s = WorkerSeeder(rank=3)
    assert s.state_dict() == {"rank": 3}
    t = WorkerSeeder(rank=0)
    t.load_state_dict(s.state_dict())
    assert t.rank == 3


def test_bad_checkpoints_are_refused():
    dl = torchfeed.loader(list(range(10)), batch_size=2)
    with pytest.raises(ValueError, match="not a torchfeed.loader checkpoint"):
        dl.load_state_dict({"kind": "something"})
    state = dl.state_dict()
    other = torchfeed.loader(list(range(10)), batch_size=3)
    with pytest.raises(ValueError, match="batch_size 2 differs from this loader's 3"):
        other.load_state_dict(state)


def test_a_generic_sampler_is_fast_forwarded_with_the_same_order():
    def make():
        return torchfeed.loader(list(range(30)), batch_size=4, shuffle=True)

    torch.manual_seed(5)
    full = [b.tolist() for b in make()]
    torch.manual_seed(5)
    dl = make()
    it = iter(dl)
    head = [next(it).tolist() for _ in range(3)]
    state = dl.state_dict()
    del it
    torch.manual_seed(99)  # another global state: the checkpoint's is restored
    again = make()
    again.load_state_dict(state)
    assert head + [b.tolist() for b in again] == full


stateful = pytest.importorskip("torchdata.stateful_dataloader")


@pytest.mark.parametrize("workers", [0, 2])
def test_inside_torchdatas_stateful_dataloader(workers):
    def make_iterable():
        ds, _ = iterable("sample", workers)
        return stateful.StatefulDataLoader(
            ds, batch_size=3, num_workers=workers, collate_fn=collate
        )

    def make_map():
        sampler = DistributedSampler(61, 1, 0, seed=7)
        sampler.set_epoch(1)
        return stateful.StatefulDataLoader(
            Noisy(61), batch_size=4, sampler=sampler, num_workers=workers, collate_fn=collate
        )

    for make in (make_iterable, make_map):
        full = list(make())
        dl = make()
        it = iter(dl)
        head = [next(it) for _ in range(5)]
        state = dl.state_dict()
        del it
        again = make()
        again.load_state_dict(state)
        assert head + list(again) == full, make.__name__


# The failure cases peers' trackers report (LitData #694 and #24, Mosaic streaming #869).


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("after_stop", [False, True])
def test_a_checkpoint_at_the_end_of_an_epoch_resumes_with_nothing_of_it_left(workers, after_stop):
    """Taken after the epoch's last batch (before or after the iterator ended): the resumed
    epoch is empty, the next one is whole, nothing twice."""
    loaders = map_loaders(2, workers=workers)
    seen, its = lockstep(loaders)
    if after_stop:
        for it in its:
            assert next(it, None) is None  # the iterator has ended (the epoch is done)
    state = loaders[0].state_dict()
    resumed = map_loaders(2, workers=workers)
    for dl in resumed:
        dl.load_state_dict(state)
    tail, _ = lockstep(resumed)
    assert tail == [[], []]  # nothing of that epoch is read again
    for dl in resumed:
        dl.sampler.set_epoch(2)
    nxt, _ = lockstep(resumed)
    whole = [i for part in nxt for i, _ in part]
    assert set(whole) == {i for part in seen for i, _ in part} and len(whole) == 62  # torch pads 61
    assert [len(p) for p in nxt] == [31, 31]


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2)])
@pytest.mark.parametrize("mode", ["sample", "shard"])
def test_resuming_to_or_from_no_workers(before, after, mode, monkeypatch):
    full, _, _ = run_ranks(1, before, mode, monkeypatch=monkeypatch)
    head, loaders, its = run_ranks(1, before, mode, steps=3, monkeypatch=monkeypatch)
    state = loaders[0].state_dict()
    del its
    tail, _, _ = run_ranks(1, after, mode, state=state, monkeypatch=monkeypatch)
    read = [s[:2] for part in head + tail for s in part]
    planned = {s[:2] for part in full for s in part}
    assert len(read) == len(set(read)) and set(read) <= planned  # nothing twice
    assert len(planned) - len(read) < max(1, after)  # uneven="drop": at most the remainder
    augment = {s[:2]: s[2] for part in full for s in part}
    assert all(augment[s[:2]] == s[2] for part in tail for s in part)


def test_a_checkpoint_of_a_dataset_whose_length_changed_is_refused():
    (loader,) = map_loaders(1, n=61)
    next(iter(loader))
    state = loader.state_dict()
    (grown,) = map_loaders(1, n=62)
    with pytest.raises(ValueError, match="not a checkpoint of a DistributedSampler over 62"):
        grown.load_state_dict(state)
    _, dl = iterable("sample", 0)
    next(iter(dl))
    state = dl.state_dict()
    ds = ShardedIterableDataset(list(range(41)), mode="sample", seed=11)
    with pytest.raises(ValueError, match="not a checkpoint of a ShardedIterableDataset of 41"):
        torchfeed.loader(ds, batch_size=3, collate_fn=collate).load_state_dict(state)


@pytest.fixture
def forking_rank(monkeypatch):
    """A process where torch.distributed is initialized, on a Python with gh-112275."""
    from torchfeed import _forking

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(_forking, "_FORK_DEADLOCK", True)
    monkeypatch.setattr(_forking, "_fork_warned", False)
    return _forking


def test_forking_workers_in_a_distributed_process_warns_once_with_the_remedy(forking_rank):
    loader = torchfeed.loader(list(range(8)), batch_size=4, num_workers=2)
    # the workers are not started: torch's iterator would ask the (pretended) process group
    loader._make_iterator = lambda: iter(())
    with pytest.warns(RuntimeWarning, match=r"gh-112275.*multiprocessing_context='spawn'") as w:
        list(loader)
    assert w[0].filename == __file__  # points at the user's loop
    list(loader)  # once per process (a second warning would be an error here)


@pytest.mark.parametrize(
    "case", ["no workers", "spawn", "not distributed", "Python 3.12+", "start method set"]
)
def test_no_fork_warning_where_nothing_forks_or_nothing_can_hang(forking_rank, monkeypatch, case):
    kw = {"num_workers": 0 if case == "no workers" else 2}
    if case == "spawn":
        kw["multiprocessing_context"] = "spawn"
    if case == "not distributed":
        monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    if case == "Python 3.12+":
        monkeypatch.setattr(forking_rank, "_FORK_DEADLOCK", False)
    if case == "start method set":
        monkeypatch.setattr(
            forking_rank.multiprocessing, "get_start_method", lambda allow_none: "forkserver"
        )
    loader = torchfeed.loader(list(range(8)), batch_size=4, **kw)
    forking_rank._warn_fork_in_distributed(loader)  # (warnings are errors in tests/)
    assert not forking_rank._fork_warned


class Folder(torch.utils.data.Dataset):
    """An ImageFolder's metadata: (path, label) tuples in a list (and the same list again)."""

    def __init__(self, n, serialized=False):
        samples = [(f"train/c{i % 7}/{i}.jpg", i % 7) for i in range(n)]
        self.samples = SerializedList(samples) if serialized else samples
        self.imgs = self.samples
        self.targets = [label for _, label in samples]  # numbers: no page of their own written

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i][1]


@pytest.fixture
def copy_warning(monkeypatch):
    from torchfeed import _forking

    monkeypatch.setattr(_forking, "_COPIED_OBJECTS", 500)
    monkeypatch.setattr(_forking, "_copy_warned", False)
    monkeypatch.setattr(_forking, "_start_method", lambda loader: "fork")
    return _forking


def test_forking_workers_over_millions_of_python_objects_warns_once_with_the_remedy(
    copy_warning,
):
    loader = torchfeed.loader(Folder(600), batch_size=4, num_workers=2, shuffle=True)
    loader._make_iterator = lambda: iter(())  # (no workers started)
    with pytest.warns(RuntimeWarning, match=r"Folder.samples holds 600 Python objects\. Each of "
                      r"the 2 forked workers.*dataset.samples = torchfeed.data.SerializedList") as w:  # fmt: skip
        list(loader)
    assert len(w) == 1 and w[0].filename == __file__ and "imgs" not in str(w[0].message)
    list(loader)  # once per process


def test_an_array_of_objects_is_found_and_one_of_numbers_is_not(copy_warning):
    data = Folder(10)
    data.paths = np.array([f"{i}.jpg" for i in range(600)], dtype=object)
    data.sizes = np.arange(600)
    assert copy_warning._copied_containers(data) == [("Folder.paths", 600)]


@pytest.mark.parametrize("case", ["serialized", "no workers", "spawn", "fewer", "subset"])
def test_no_copy_warning_where_no_worker_copies_objects(copy_warning, case):
    data = Folder(400 if case == "fewer" else 600, serialized=case == "serialized")
    kw = {"num_workers": 0 if case == "no workers" else 2}
    if case == "spawn":
        copy_warning._start_method = lambda loader: "spawn"
    if case == "subset":  # (found through a wrapper: warns)
        data = torch.utils.data.Subset(data, range(10))
    loader = torchfeed.loader(data, batch_size=4, **kw)
    if case == "subset":
        assert copy_warning._copied_containers(loader.dataset) == [("Folder.samples", 600)]
        return
    copy_warning._warn_copied_metadata(loader)  # (warnings are errors in tests/)
    assert not copy_warning._copy_warned


def test_the_copy_check_never_fails_a_loader(copy_warning):
    """A dataset whose attribute lookups raise, or whose `datasets` is not a list of them."""

    class Odd(Folder):
        datasets = 5

        def __getattr__(self, name):
            if name == "dataset":
                raise RuntimeError("a lookup that fails otherwise than AttributeError")
            raise AttributeError(name)

    data = Odd(10)
    assert copy_warning._copied_containers(data) == []
    loader = torchfeed.loader(data, batch_size=5, num_workers=2)
    assert [b.tolist() for b in loader] == [[0, 1, 2, 3, 4], [5, 6, 0, 1, 2]]


@pytest.mark.parametrize("zero_copy", [False, True])
def test_dataloaders_positional_arguments_are_taken_as_dataloader_takes_them(zero_copy):
    """DataLoader(dataset, 4, True, ...) is a common spelling: torchfeed.loader took the dataset
    alone by position, so swapping it in failed with Python's 'takes 1 positional argument'."""
    torch.manual_seed(3)
    named = list(torchfeed.loader(Noisy(10), zero_copy=zero_copy, batch_size=4, shuffle=True,
                                  num_workers=1, collate_fn=torchfeed.DefaultCollate()))  # fmt: skip
    torch.manual_seed(3)
    ours = torchfeed.loader(Noisy(10), 4, True, None, None, 1, torchfeed.DefaultCollate(),
                            zero_copy=zero_copy)  # fmt: skip
    assert (ours.batch_size, ours.num_workers) == (4, 1)
    got = list(ours)
    assert [b[0].tolist() for b in got] == [b[0].tolist() for b in named]
    assert all(torch.equal(a[1], b[1]) for a, b in zip(got, named, strict=True))


def test_too_many_or_twice_given_dataloader_arguments_are_refused():
    too_many = (4,) * 13
    with pytest.raises(TypeError, match=r"at most 12 positional arguments after the dataset "
                                        r"\(batch_size, shuffle, .*generator\), got 13"):  # fmt: skip
        torchfeed.loader(Noisy(4), *too_many)
    for zero_copy in (False, True):
        with pytest.raises(TypeError, match="multiple values for argument 'batch_size'"):
            torchfeed.loader(Noisy(4), 4, batch_size=2, zero_copy=zero_copy)
    with pytest.raises(TypeError, match="multiple values for argument 'shuffle'"):
        torchfeed.ResumableLoader(Noisy(4), 4, True, shuffle=False)


needs_in_order = pytest.mark.skipif(
    "in_order" not in inspect.signature(DataLoader).parameters,
    reason="DataLoader(in_order=) is new in torch 2.6",
)


@needs_in_order
def test_a_mid_epoch_checkpoint_of_batches_out_of_order_is_refused():
    """in_order=False hands batches on as workers finish them: after 3 batches the counted
    checkpoint resumed past a batch never consumed and read a consumed one again."""

    def make():
        return torchfeed.loader(Noisy(40), batch_size=4, num_workers=2, in_order=False,
                                collate_fn=collate)  # fmt: skip

    loader = make()
    it = iter(loader)
    for _ in range(3):
        next(it)
    with pytest.raises(RuntimeError, match=r"in_order=False, so its 2 workers' batches arrive "
                                           r".* after 3 of them .* in_order=True"):  # fmt: skip
        loader.state_dict()
    rest = list(it)
    state = loader.state_dict()  # after the epoch's end: the next epoch, whole
    resumed = make()
    resumed.load_state_dict(state)
    assert sorted(i for b in resumed for i, _ in b) == list(range(40))
    assert len(rest) == 7


@needs_in_order
def test_one_worker_out_of_order_is_in_order_and_resumes():
    def make():
        return torchfeed.loader(Noisy(40), batch_size=4, num_workers=1, in_order=False,
                                collate_fn=collate)  # fmt: skip

    whole = list(make())
    loader = make()
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert first + list(resumed) == whole
