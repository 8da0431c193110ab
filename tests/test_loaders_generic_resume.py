"""torchfeed.loader's checkpoints of generic sources, fast-forwarded: an IterableDataset of the
user's own (its stream read again and the consumed batches dropped, or resumed where it keeps its
own position), and a checkpoint taken in a resumed epoch (it counts the batches before the resume
too). A change of world size or, for a stream, of num_workers is an error, not another order.
The epochs after a resumed one are whole (persistent workers too), and the training loop's own
draws from torch's global generator go on as they did uninterrupted."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import IterableDataset, get_worker_info

import torchfeed
from torchfeed.data import DistributedSampler

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


class Stream(IterableDataset):
    """Samples 0..n-1 dealt over the workers, each with a draw from torch (the worker's seed)."""

    def __init__(self, n: int = 100) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        w, k = (info.id, info.num_workers) if info else (0, 1)
        for i in range(w, self.n, k):
            yield i, torch.rand(()).item()


class Positioned(Stream):
    """A stream that keeps its own position (as a Hugging Face IterableDataset does), in the
    process that reads it."""

    def __init__(self, n: int = 100) -> None:
        super().__init__(n)
        self.read = 0

    def __iter__(self):
        for k, sample in enumerate(super().__iter__()):
            if k >= self.read:
                self.read = k + 1
                yield sample

    def state_dict(self):
        return {"read": self.read}

    def load_state_dict(self, state):
        self.read = state["read"]


def collate(batch):
    return batch


def run(make, cuts):
    """The batches of an epoch read in pieces: after each cut a checkpoint, and a new loader
    (another global random state) resumed from it."""
    torch.manual_seed(3)
    dl, state, out = make(), None, []
    for cut in [*cuts, None]:
        if state is not None:
            torch.manual_seed(99)
            dl = make()
            dl.load_state_dict(state)
        it = iter(dl)
        for batch in it:
            out.append(batch)
            if len(out) == cut:
                state = dl.state_dict()
                break
        del it
    return out


@pytest.mark.parametrize("dataset", [Stream, Positioned])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("cuts", [(3,), (3, 5), (1, 2, 8)])
def test_an_iterable_dataset_resumes_where_it_stood(dataset, workers, cuts):
    def make():
        return torchfeed.loader(dataset(), batch_size=7, num_workers=workers, collate_fn=collate)

    full = run(make, ())
    assert len(full) == (15 if workers == 0 else 16)  # (2 workers: 50 samples, 8 batches each)
    assert run(make, cuts) == full


@pytest.mark.parametrize("cuts", [(3, 5), (1, 2, 6)])
def test_a_checkpoint_of_a_resumed_epoch_counts_the_batches_before_the_resume(cuts):
    def make():
        return torchfeed.loader(list(range(61)), batch_size=7, shuffle=True)

    full = [b.tolist() for b in run(make, ())]
    assert [b.tolist() for b in run(make, cuts)] == full


def test_a_stream_resumed_with_other_workers_is_an_error():
    dl = torchfeed.loader(Stream(), batch_size=7, num_workers=2, collate_fn=collate)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    other = torchfeed.loader(Stream(), batch_size=7, num_workers=1, collate_fn=collate)
    with pytest.raises(ValueError, match="num_workers 2 differs from this loader's 1"):
        other.load_state_dict(state)


@pytest.mark.parametrize("kind", ["stream", "sampler"])
def test_a_generic_source_resumed_on_another_world_size_is_an_error(kind, monkeypatch):
    def make():
        if kind == "stream":
            return torchfeed.loader(Stream(), batch_size=7, collate_fn=collate)
        return torchfeed.loader(list(range(61)), batch_size=7, shuffle=True)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    dl = make()
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match="world size of 2, this run has 3"):
        make().load_state_dict(state)


def flat(batches):
    return [x.tolist() if torch.is_tensor(x) else x for b in batches for x in b]


@pytest.mark.parametrize("kind", ["sampler", "stream"])
@pytest.mark.parametrize("persistent", [True, False])
def test_the_epochs_after_a_resumed_one_are_whole(kind, persistent):
    """Persistent workers keep the DataLoader's iterator, and its sampler, for every later
    epoch: a resumed shuffled loader dropped the batches its resume skipped from every epoch
    after it (36 of 48 samples an epoch, here). A resumed epoch left early is not resumed
    again by the next iter() either."""

    def make():
        torch.manual_seed(5)
        data = list(range(48)) if kind == "sampler" else Stream(48)
        return torchfeed.loader(data, batch_size=4, shuffle=kind == "sampler", num_workers=2,
                                persistent_workers=persistent, collate_fn=collate)  # fmt: skip

    def epoch(loader, stop=None):
        return flat(b for _, b in zip(range(stop or 10**6), loader, strict=False))

    dl = make()
    uninterrupted = [epoch(dl) for _ in range(3)]
    dl = make()
    it = iter(dl)
    head = flat([next(it) for _ in range(3)])
    state = dl.state_dict()
    del it
    dl = make()
    dl.load_state_dict(state)
    assert head + epoch(dl) == uninterrupted[0]
    assert [epoch(dl), epoch(dl)] == uninterrupted[1:]

    dl = make()  # resumed, left after one batch: the next epoch is a whole one
    dl.load_state_dict(state)
    assert len(epoch(dl, stop=1)) == 4
    ids = [x[0] if isinstance(x, tuple) else x for x in epoch(dl)]  # (a stream's draws: the
    assert sorted(ids) == list(range(48))  # workers' own streams, which went on meanwhile)


@pytest.mark.parametrize("sampler", ["shuffle", "distributed"])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("restores", ["before", "after", "never"])
def test_a_resumed_run_draws_on_as_the_uninterrupted_one(workers, restores, sampler):
    """The training loop's own draws from torch's global generator, and the next epoch's
    shuffle, after a resume: the loader set the state its epoch started from and left it so,
    over the state a loop had restored for itself before iter() (as the Hugging Face Trainer
    does): the loop then drew what it drew at the epoch's start again."""

    def make():
        if sampler == "distributed":
            kw = {"sampler": DistributedSampler(32, num_replicas=1, rank=0, seed=4)}
        else:
            kw = {"shuffle": True}
        return torchfeed.loader(list(range(32)), batch_size=4, num_workers=workers, **kw)

    def epoch(loader):
        return [(b.tolist(), torch.rand(()).item()) for b in loader]

    torch.manual_seed(0)
    dl, head = make(), []
    for batch in dl:
        head.append((batch.tolist(), torch.rand(()).item()))
        if len(head) == 3:
            state, mine = dl.state_dict(), torch.get_rng_state()
    uninterrupted = [head, epoch(dl)]

    torch.manual_seed(123)  # another run's start
    dl = make()
    if restores == "before":
        torch.set_rng_state(mine)
    dl.load_state_dict(state)
    it = iter(dl)
    if restores == "after":
        torch.set_rng_state(mine)
    rest = [(b.tolist(), torch.rand(()).item()) for b in it]
    assert head[:3] + rest == uninterrupted[0]
    assert epoch(dl) == uninterrupted[1]


def test_another_ranks_checkpoint_leaves_this_ranks_own_random_state(monkeypatch):
    """One rank's checkpoint describes every rank; the random state it recorded is that rank's
    loop's, which another rank (seeded per rank, say) does not take."""
    monkeypatch.setenv("WORLD_SIZE", "2")

    def make():
        return torchfeed.loader(list(range(32)), batch_size=4, shuffle=True)

    monkeypatch.setenv("RANK", "0")
    torch.manual_seed(0)
    dl = make()
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    del it
    for rank in (1, 0):
        own, after = resumed_on(monkeypatch, rank, make, state)
        assert torch.equal(after, own if rank == 1 else state["rng_at_checkpoint"])


def resumed_on(monkeypatch, rank, make, state):
    """torch's random state on ``rank`` (its own: seeded 100 + rank), and that state once a
    loader resumed from ``state`` has made its iterator there."""
    monkeypatch.setenv("RANK", str(rank))
    torch.manual_seed(100 + rank)
    own = torch.get_rng_state()
    dl = make()
    dl.load_state_dict(state)
    iter(dl)
    return own, torch.get_rng_state()


@pytest.mark.parametrize("kind", ["shuffle", "distributed", "stream", "positioned"])
def test_a_checkpoint_taken_again_before_a_resumed_epochs_first_batch_is_the_one_loaded(kind):
    """A job preempted again before its first step after a resume (or a trainer that saves as
    it starts) saves the loader's state again: for a shuffled loader that state said the
    epoch's start, and the next resume read the 3 consumed batches again."""

    def make():
        if kind == "shuffle":
            return torchfeed.loader(list(range(61)), batch_size=7, shuffle=True,
                                    num_workers=2, collate_fn=collate)  # fmt: skip
        if kind == "distributed":
            sampler = DistributedSampler(61, 1, 0, seed=5)
            sampler.set_epoch(1)
            return torchfeed.loader(list(range(61)), batch_size=7, sampler=sampler,
                                    collate_fn=collate)  # fmt: skip
        data = Stream(61) if kind == "stream" else Positioned(61)
        return torchfeed.loader(data, batch_size=7, num_workers=2 if kind == "stream" else 0,
                                collate_fn=collate)  # fmt: skip

    full = run(make, ())
    torch.manual_seed(3)
    dl = make()
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    state = dl.state_dict()
    del it
    for _ in range(2):  # resumed and stopped before a batch, twice
        torch.manual_seed(99)
        dl = make()
        dl.load_state_dict(state)
        state = dl.state_dict()
    torch.manual_seed(99)
    dl = make()
    dl.load_state_dict(state)
    assert head + list(dl) == full


def epochs_of(dl, n, sampler=None, start=0):
    out = []
    for e in range(start, start + n):
        if sampler is not None:
            sampler.set_epoch(e)
        out.append(flat(dl))
    return out


@pytest.mark.parametrize("kind", ["shuffle", "stream", "prefetched"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_checkpoint_after_the_loop_ended_resumes_with_the_next_epoch_whole(kind, workers):
    """The loop most scripts run (PyTorch's ImageNet example, timm): save after the epoch's
    `for`, resume with the next epoch. A loader without epochs of its own resumed that
    checkpoint with the rest of the finished epoch, nothing: the next epoch was lost. Inside the
    `for`, at the last batch, a checkpoint still resumes with that epoch's (empty) rest."""

    def make():
        data = Stream(30) if kind == "stream" else list(range(30))
        dl = torchfeed.loader(data, batch_size=4, shuffle=kind != "stream",
                              num_workers=workers, collate_fn=collate)  # fmt: skip
        return torchfeed.DevicePrefetcher(dl, "cpu") if kind == "prefetched" else dl

    def state(dl):
        return (dl.loader if kind == "prefetched" else dl).state_dict()

    def load(dl, s):
        (dl.loader if kind == "prefetched" else dl).load_state_dict(s)

    torch.manual_seed(0)
    dl = make()
    uninterrupted = epochs_of(dl, 4)
    assert uninterrupted[2] != uninterrupted[1]

    torch.manual_seed(0)
    dl = make()
    epochs_of(dl, 2)
    after_loop = state(dl)
    torch.manual_seed(7)  # another process: its own random state
    dl = make()
    load(dl, after_loop)
    assert epochs_of(dl, 2) == uninterrupted[2:]

    torch.manual_seed(0)
    dl = make()
    epochs_of(dl, 1)
    batches = list(dl)  # the second epoch, whole: its iterator ended...
    torch.manual_seed(0)
    dl = make()
    epochs_of(dl, 1)
    it = iter(dl)
    for _ in batches:  # ...and here its last batch is handed out, the `for` still running
        next(it)
    at_last_batch = state(dl)
    del it
    torch.manual_seed(7)
    dl = make()
    load(dl, at_last_batch)
    assert flat(dl) == []
    assert sorted(flat(dl)) == sorted(uninterrupted[2])


def checkpoint_in_epoch(make, epoch, batches):
    """The first ``batches`` of ``epoch`` of a new (loader, sampler), and a checkpoint then."""
    dl, sampler = make()
    sampler.set_epoch(epoch)
    it = iter(dl)
    head = flat([next(it) for _ in range(batches)])
    return head, dl.state_dict()


def test_a_sampler_with_epochs_tells_the_rest_of_an_epoch_from_the_next():
    """torch's DistributedSampler (fast-forwarded, same world only): after a checkpoint taken
    after the loop, set_epoch(e + 1) reads epoch e + 1 whole, set_epoch(e) its (empty) rest;
    a mid-epoch checkpoint resumed under another epoch reads that epoch whole."""
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    def make():
        sampler = TorchSampler(list(range(30)), num_replicas=1, rank=0, seed=2)
        return torchfeed.loader(list(range(30)), batch_size=4, sampler=sampler,
                                collate_fn=collate), sampler  # fmt: skip

    dl, sampler = make()
    uninterrupted = epochs_of(dl, 3, sampler)
    dl, sampler = make()
    epochs_of(dl, 2, sampler)
    after_loop = dl.state_dict()
    dl, sampler = make()
    dl.load_state_dict(after_loop)
    assert epochs_of(dl, 1, sampler, start=2) == uninterrupted[2:]
    dl, sampler = make()
    dl.load_state_dict(after_loop)
    assert epochs_of(dl, 2, sampler, start=1) == [[], uninterrupted[2]]

    head, mid = checkpoint_in_epoch(make, 1, 3)
    dl, sampler = make()
    dl.load_state_dict(mid)
    assert head + epochs_of(dl, 1, sampler, start=1)[0] == uninterrupted[1]
    dl, sampler = make()
    dl.load_state_dict(mid)
    assert epochs_of(dl, 1, sampler, start=2) == uninterrupted[2:]


@pytest.mark.parametrize("generator", [False, True])
@pytest.mark.parametrize("zero_copy", [False, True])
@pytest.mark.parametrize("cut", [3, "after the loop"])
def test_a_later_epoch_of_persistent_workers_resumes_in_its_own_order(generator, zero_copy, cut):
    """Persistent workers' iterator is made once and reset for later epochs: a reset draws the
    shuffle alone, a new iterator draws its workers' base seed first. A resumed loader makes a
    new one, so its fast-forward skipped 3 batches of another order than the one consumed:
    some samples were read twice and others never (the most common fast configuration)."""

    def make():
        g = torch.Generator().manual_seed(4) if generator else None
        return torchfeed.loader([torch.full((2,), i) for i in range(30)], batch_size=4,
                                shuffle=True, num_workers=2, persistent_workers=True,
                                generator=g, zero_copy=zero_copy)  # fmt: skip

    def epoch(it):
        return [b[:, 0].tolist() for b in it]

    torch.manual_seed(0)
    dl = make()
    uninterrupted = [epoch(dl) for _ in range(4)]
    torch.manual_seed(0)
    dl = make()
    epoch(dl)
    it = iter(dl)
    head = epoch(it) if cut != 3 else [next(it)[:, 0].tolist() for _ in range(3)]
    state = dl.state_dict()
    del it
    torch.manual_seed(9)
    dl = make()
    dl.load_state_dict(state)
    rest = [epoch(dl) for _ in range(2 if cut != 3 else 3)]
    if cut == 3:
        assert head + rest[0] == uninterrupted[1]
        rest = rest[1:]
    assert rest == uninterrupted[2:]


@pytest.mark.parametrize("kind", ["shuffle", "distributed", "grow", "shrink"])
def test_len_of_a_resumed_loader_counts_the_batches_consumed_before_its_checkpoint(kind):
    """Lightning restores its count of the epoch's batches and ends the epoch at len(loader),
    which it reads once. A resumed loader's len() was what was left (7 of 10 batches), so the
    resumed epoch ended 3 batches early, and so did every epoch after it. On fewer ranks
    (shrink), the consumed batches plus this rank's share of the rest are fewer than a fresh
    epoch's: len() is the fresh epoch's, or Lightning would cut every later epoch short (under
    Lightning 2.6, 2 ranks resumed on 1: epoch 2 ended after 9 of its 10 batches)."""
    worlds = {"grow": (2, 3), "shrink": (2, 1)}.get(kind, (1, 1))

    def make(world=1, rank=0):
        if kind == "shuffle":
            return torchfeed.loader(list(range(40)), batch_size=4, shuffle=True,
                                    collate_fn=collate)  # fmt: skip
        sampler = DistributedSampler(40, world, rank, seed=1)
        sampler.set_epoch(0)
        return torchfeed.loader(list(range(40)), batch_size=2, sampler=sampler,
                                collate_fn=collate)  # fmt: skip

    before = make(worlds[0])
    full = len(before)
    it = iter(before)
    for _ in range(3):
        next(it)
    state = before.state_dict()
    del it
    for rank in range(worlds[1]):
        dl = make(worlds[1], rank)
        fresh = len(dl)
        dl.load_state_dict(state)
        expected = len(dl)  # (as Lightning reads it: after the load, before and after iter())
        it = iter(dl)
        assert len(dl) == expected
        rest = len(list(it))
        if kind == "shrink":
            assert expected == fresh == 20 and 3 + rest == 17  # the epoch ends when it is read
        else:
            assert 3 + rest == expected
        if kind in ("shuffle", "distributed"):
            assert expected == full
        assert len(dl) == len(list(dl)) == fresh  # the next epoch: whole, and its length


@pytest.mark.parametrize("workers", [0, 2])
def test_a_samplers_epoch_is_restored_with_its_position(workers):
    """Lightning loads the loader's state and makes the resumed iterator before it calls
    set_epoch: a sampler with epochs (torch's DistributedSampler, which Lightning puts in under
    DDP) was still at epoch 0 then, so the fast-forward skipped batches of epoch 0's order
    (under Lightning 2.6 with 2 ranks, 13 batches a rank instead of 15 over 3 epochs)."""
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    def make():
        sampler = TorchSampler(list(range(40)), num_replicas=1, rank=0, seed=3)
        return torchfeed.loader(list(range(40)), batch_size=4, sampler=sampler, collate_fn=collate,
                                num_workers=workers, persistent_workers=workers > 0), sampler  # fmt: skip

    dl, sampler = make()
    uninterrupted = epochs_of(dl, 2, sampler)
    head, state = checkpoint_in_epoch(make, 1, 2)
    dl, sampler = make()
    dl.load_state_dict(state)
    assert sampler.epoch == 1
    it = iter(dl)  # as Lightning does: iter() first...
    sampler.set_epoch(1)  # ...then the epoch
    assert head + flat(it) == uninterrupted[1]


def test_after_the_loop_another_ranks_checkpoint_leaves_this_ranks_own_random_state(
    monkeypatch,
):
    """The next epoch, resumed from a checkpoint taken after the loop, draws its order from the
    state the loop left on the checkpointing rank; another rank keeps its own."""
    monkeypatch.setenv("WORLD_SIZE", "2")

    def make():
        return torchfeed.loader(list(range(32)), batch_size=4, shuffle=True)

    def after_iter(state):  # torch's state once a fresh loader's iterator is made from `state`
        torch.set_rng_state(state)
        iter(make())
        return torch.get_rng_state()

    monkeypatch.setenv("RANK", "0")
    torch.manual_seed(0)
    dl = make()
    list(dl)
    state = dl.state_dict()
    assert state["ended"]
    for rank in (1, 0):
        own, after = resumed_on(monkeypatch, rank, make, state)
        assert torch.equal(after, after_iter(own if rank == 1 else state["rng_next"]))


class _Drawn(torch.utils.data.Dataset):
    """Sample i and a draw of its own (torchfeed.loader seeds it from (seed, epoch, i))."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        return torch.tensor([float(i), torch.rand(()).item()])


@pytest.mark.parametrize("sampler_kind", ["torch", "torchfeed"])
@pytest.mark.parametrize("loader", ["0 workers", "2 workers", "persistent", "zero copy"])
def test_an_epoch_set_after_iter_is_the_epoch_read(sampler_kind, loader):
    """A DataLoader with workers takes its first indices from the sampler at iter(): an epoch
    set between iter() and the first batch (as Lightning 2.5.3-2.6 does when it resumes from a
    checkpoint at an epoch's end, Lightning-AI/pytorch-lightning#21938) left that epoch with the
    earlier epoch's order and draws (under Lightning, 2 ranks resumed after epoch 1 read epoch
    0's again in epoch 2). The iterator is made again at the first batch, from the random state
    the epoch started from: the order and the draws are the set epoch's, and the loop's own
    draws are as if nothing had been made again."""
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    def make():
        kind = TorchSampler if sampler_kind == "torch" else DistributedSampler
        sampler = kind(_Drawn(), num_replicas=1, rank=0, seed=3)
        workers = 0 if loader == "0 workers" else 2
        build = torchfeed.ZeroCopyLoader if loader == "zero copy" else torchfeed.loader
        dl = build(_Drawn(), batch_size=4, sampler=sampler, num_workers=workers,
                   persistent_workers=loader == "persistent")  # fmt: skip
        return dl, sampler

    def run(set_before):
        torch.manual_seed(0)
        dl, sampler = make()
        list(dl)  # epoch 0 (a persistent loader's iterator is reset, not made, for the next)
        if set_before:
            sampler.set_epoch(2)
        it = iter(dl)
        sampler.set_epoch(2)
        mid = torch.rand(3)  # the loop's draws between iter() and the first batch
        batches = torch.cat([b.clone() for b in it])
        return batches, mid, torch.rand(3), list(dl)  # and the next epoch (2 again) alike

    expected, mid, after, again = run(True)
    got, got_mid, got_after, got_again = run(False)
    assert torch.equal(got, expected)
    assert sorted(got[:, 0].tolist()) == list(range(24))
    assert torch.equal(got_mid, mid) and torch.equal(got_after, after)
    assert all(torch.equal(a, b) for a, b in zip(got_again, again, strict=True))


@pytest.mark.parametrize("source", ["global", "own"])
@pytest.mark.parametrize("where", ["mid-epoch", "after the loop"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_sampler_drawing_from_another_generator_resumes_in_its_order(source, where, workers):
    """A fast-forward replays the epoch's order from the random state it started from. A
    sampler that draws elsewhere than the loader (a WeightedRandomSampler draws from torch's
    global generator while PyTorch's reproducibility recipe gives the loader a generator=,
    which only seeds its workers; or from a generator of its own) was resumed over another
    order: some samples were read twice and others never."""
    from torch.utils.data import WeightedRandomSampler

    def make():
        own = torch.Generator().manual_seed(9) if source == "own" else None
        sampler = WeightedRandomSampler([1.0] * 40, 40, replacement=True, generator=own)
        given = torch.Generator().manual_seed(3) if source == "global" else None
        return torchfeed.loader(list(range(40)), batch_size=4, sampler=sampler, generator=given,
                                num_workers=workers, collate_fn=collate)  # fmt: skip

    torch.manual_seed(0)
    uninterrupted = epochs_of(make(), 3)
    assert uninterrupted[1] != uninterrupted[2]
    torch.manual_seed(0)
    dl = make()
    head = flat(dl)  # epoch 0
    if where == "mid-epoch":
        it = iter(dl)
        head += [x for _ in range(3) for x in next(it)]
        del it
    state = dl.state_dict()
    torch.manual_seed(7)  # another process
    dl = make()
    dl.load_state_dict(state)
    assert head + flat(dl) + flat(dl) == [x for e in uninterrupted for x in e]


@pytest.mark.parametrize("sampler", ["shuffle", "weighted"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_draw_between_iter_and_the_first_batch_leaves_the_resumed_order(sampler, workers):
    """Without workers the DataLoader's sampler drew its order at the first batch, from
    whatever state the loop had left by then, while the checkpoint replays the state at iter():
    a loop that drew in between (Lightning's hooks and sanity check run there) resumed over
    another order, reading some samples twice and others never. The order is drawn at iter()
    now, as a DataLoader's workers take their first indices then."""
    from torch.utils.data import WeightedRandomSampler

    def make():
        kw = {"shuffle": True}
        if sampler == "weighted":
            kw = {"sampler": WeightedRandomSampler([1.0] * 40, 40, replacement=True)}
        return torchfeed.loader(list(range(40)), batch_size=4, num_workers=workers,
                                collate_fn=collate, **kw)  # fmt: skip

    def started():
        torch.manual_seed(0)
        dl = make()
        it = iter(dl)
        torch.rand(5)  # the loop's draws before its first batch
        return dl, it

    _, it = started()
    uninterrupted = flat(it)
    dl, it = started()
    head = [x for _ in range(3) for x in next(it)]
    state = dl.state_dict()
    del it
    torch.manual_seed(7)
    dl = make()
    dl.load_state_dict(state)
    assert head + flat(dl) == uninterrupted
