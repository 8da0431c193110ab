"""What a DevicePrefetcher's transform draws: torchfeed's random transforms given no generator
draw, in the prefetcher's thread, from one seeded for each batch from (seed, epoch, rank, batch).
So the same seeds give the same augmentation (they shared torch's global generator with the
training loop's thread, in an order that changed from run to run), ranks seeded alike draw
apart, the loop's own draws are its own, and a resumed run draws what the uninterrupted one
drew. Where the prefetcher knows the batch's samples (a map-style dataset through
torchfeed.loader), image j draws from (seed, epoch, its sample): the same on any batching,
rank or world size."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import torchfeed
from torchfeed.data import DistributedSampler, ShardedIterableDataset

from helpers import Drawing

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

N, BATCH = 48, 4
CROP = torchfeed.RandomResizedCropFlipNormalize(8, mean=[0.5], std=[0.5], return_params=True)


def image(i: int) -> torch.Tensor:
    return torch.full((1, 20 + i % 7, 30 + i % 5), i, dtype=torch.uint8)


def boxes(batch):
    """The transform's draws for a batch of (index, image) samples: index -> box and flip."""
    indices, images = zip(*batch, strict=True)
    _, params = CROP(list(images))
    return [(i, *params["boxes"][k].tolist(), bool(params["flips"][k]))
            for k, i in enumerate(indices)]  # fmt: skip


def run(steps: int | None = None, pause: float = 0.0, transform=boxes):
    """(the transform's draws, the loop's own torch draws) over a plain DataLoader."""
    torch.manual_seed(0)
    data = [(i, image(i)) for i in range(N)]
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, collate_fn=list)
    drawn, loop = [], []
    for out in torchfeed.DevicePrefetcher(loader, "cpu", transform=transform):
        drawn.append(out)
        time.sleep(pause)  # the prefetcher's thread runs meanwhile
        loop.append(torch.rand(()).item())
    return drawn, loop


def test_the_same_seeds_draw_the_same_and_the_loop_draws_its_own():
    first, loop = run(pause=0.002)
    for pause in (0.0, 0.005):
        assert run(pause=pause) == (first, loop)
    _, alone = run(transform=lambda batch: batch)  # a transform that draws nothing
    assert loop == alone
    assert len({d[1:] for b in first for d in b}) > N // 2  # the draws differ image to image


def test_ranks_seeded_alike_draw_apart(monkeypatch):
    """Under torchrun every rank usually runs torch.manual_seed(same): seeded from (seed,
    epoch, batch) alone, image j of batch k was cropped and flipped alike on every rank."""
    drawn = {}
    for rank in (0, 1, 1):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        got, _ = run()
        assert drawn.setdefault(rank, got) == got  # the same rank draws the same
    for b0, b1 in zip(drawn[0], drawn[1], strict=True):  # the same samples, other draws
        assert [d[1:] for d in b0] != [d[1:] for d in b1]


def test_a_transform_given_a_generator_draws_from_it():
    def seeded(batch):
        return boxes_from(batch, generator)

    def boxes_from(batch, g):
        t = torchfeed.RandomResizedCropFlipNormalize(8, mean=[0.5], std=[0.5], generator=g,
                                                     return_params=True)  # fmt: skip
        return t([img for _, img in batch])[1]["boxes"].tolist()

    generator = torch.Generator().manual_seed(3)
    drawn, _ = run(transform=seeded)
    again = torch.Generator().manual_seed(3)
    data = [(i, image(i)) for i in range(N)]
    assert drawn == [boxes_from(data[k : k + BATCH], again) for k in range(0, N, BATCH)]


def make(kind: str, workers: int):
    torch.manual_seed(0)  # as a run starts
    data = [(i, image(i)) for i in range(N)]
    if kind == "sharded":

        def shard(s):
            return data[s * 12 : (s + 1) * 12]

        ds = ShardedIterableDataset(list(range(4)), shard, item_lengths=[12] * 4)
        return torchfeed.loader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list)
    sampler = DistributedSampler(N, 1, 0, seed=3) if kind == "distributed" else None
    return torchfeed.loader(data, batch_size=BATCH, shuffle=sampler is None, sampler=sampler,
                            num_workers=workers, collate_fn=list)  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("kind", ["sampler", "distributed", "sharded"])
def test_a_resumed_run_draws_what_the_uninterrupted_one_drew(kind, workers):
    """Resumed twice in the same epoch: the second checkpoint counts the epoch's batches from
    its start (a sampler's or sharded stream's own state skips the first part)."""

    def part(state=None, steps=None):
        loader = make(kind, workers)
        if state is not None:
            loader.load_state_dict(state)
        it = iter(torchfeed.DevicePrefetcher(loader, "cpu", transform=boxes))
        got = [b for _, b in zip(range(steps or N), it, strict=False)]
        state = loader.state_dict()
        it.close()
        return got, state

    full, _ = part()
    for steps in (1, 5):
        head, state = part(steps=steps)
        assert state["batches"] == steps
        middle, state = part(state, steps=2)
        assert state["batches"] == steps + 2
        tail, _ = part(state)
        assert head + middle + tail == full, steps


def test_another_epoch_and_another_seed_draw_otherwise():
    loader = make("sampler", 0)
    prefetcher = torchfeed.DevicePrefetcher(loader, "cpu", transform=boxes)
    first, second = list(prefetcher), list(prefetcher)
    by_index = [{d[0]: d[1:] for b in epoch for d in b} for epoch in (first, second)]
    assert by_index[0] != by_index[1]
    other = torchfeed.DevicePrefetcher(make("sampler", 0), "cpu", transform=boxes, seed=7)
    assert list(other) != first


def test_a_bad_seed_is_refused():
    with pytest.raises(TypeError, match="seed must be an int or None, got str"):
        torchfeed.DevicePrefetcher([], "cpu", seed="1")
    with pytest.raises(TypeError, match="seed must be an int or None, got bool"):
        torchfeed.DevicePrefetcher([], "cpu", seed=True)


def read_with_loop_draws(prefetch: bool, pause: float = 0.0):
    """(the batches, the loop's own draws) over torchfeed.loader without workers."""
    torch.manual_seed(0)
    data = Drawing()
    loader = torchfeed.loader(data, batch_size=4, shuffle=True)
    batches, loop = [], []
    for batch in torchfeed.DevicePrefetcher(loader, "cpu") if prefetch else loader:
        batches.append(batch.tolist())
        for _ in range(20):
            loop.append(torch.rand(()).item())
        time.sleep(pause)
    return batches, loop, data.threads


def test_a_loader_without_workers_is_read_in_the_loops_thread():
    """Read in the prefetcher's thread, its per-sample seeding and the loop's draws shared
    torch's global generator in an order that changed from run to run: the samples'
    augmentation and the loop's draws differed between runs of the same seeds (even over a
    dataset that draws nothing, the loop's did)."""
    batches, loop, threads = read_with_loop_draws(prefetch=False)
    assert threads == {threading.main_thread().name}
    for pause in (0.0, 0.002):
        assert read_with_loop_draws(prefetch=True, pause=pause) == (batches, loop, threads)


def test_a_read_error_without_workers_follows_the_batches_before_it():
    data = Drawing(n=40, fail_at=21)
    loader = torchfeed.loader(data, batch_size=4)
    got = []
    with pytest.raises(ValueError, match="sample 21 is corrupt"):
        for batch in torchfeed.DevicePrefetcher(loader, "cpu", depth=3):
            got.append(batch[:, 0].tolist())
    assert got == [[float(i) for i in range(k, k + 4)] for k in range(0, 20, 4)]
    assert data.threads == {threading.main_thread().name}


def draws_by_sample(batch_size: int, world: int, workers: int, monkeypatch, transform=boxes,
                    rank_seeds: bool = False):  # fmt: skip
    """Sample index -> the transform's draws for it, over every rank of a map-style dataset
    read through torchfeed.loader and a DistributedSampler (each rank's global seed its rank's
    with ``rank_seeds``, else 0)."""
    out = {}
    monkeypatch.setenv("WORLD_SIZE", str(world))
    for rank in range(world):
        monkeypatch.setenv("RANK", str(rank))
        torch.manual_seed(rank if rank_seeds else 0)
        data = [(i, image(i)) for i in range(N)]
        sampler = DistributedSampler(N, world, rank, seed=3)
        loader = torchfeed.loader(data, batch_size=batch_size, sampler=sampler,
                                  num_workers=workers, collate_fn=list)  # fmt: skip
        for batch in torchfeed.DevicePrefetcher(loader, "cpu", transform=transform):
            out.update((d[0], d[1:]) for d in batch)
    return out


def test_a_known_samples_draws_follow_it_on_any_batching_and_world(monkeypatch):
    """DESIGN.md's promise, which per-batch draws broke under the prefetcher: an elastic run (2
    ranks -> 3, another batch size: a sample in another batch, at another position) draws the
    same augmentation for the same sample."""
    one = draws_by_sample(4, 1, 0, monkeypatch)
    assert len(one) == N and len(set(one.values())) > N // 2
    assert draws_by_sample(6, 2, 2, monkeypatch) == one
    assert draws_by_sample(4, 3, 0, monkeypatch) == one


def test_two_views_of_a_batch_differ(monkeypatch):
    """Two draws for one batch (two augmented views, as contrastive learning takes) each follow
    the sample, and differ from each other."""

    def two_views(batch):
        first, second = boxes(batch), boxes(batch)
        return [(a[0], a[1:], b[1:]) for a, b in zip(first, second, strict=True)]

    views = draws_by_sample(4, 1, 0, monkeypatch, two_views)
    assert draws_by_sample(8, 2, 0, monkeypatch, two_views) == views
    assert sum(a != b for a, b in views.values()) > N // 2


def test_ranks_seeded_apart_draw_alike_for_a_sample_of_a_seeded_sampler(monkeypatch):
    """seed=None takes the seed the loader's samples draw from (here the DistributedSampler's):
    with torch.initial_seed(), ranks seeded apart (torch.manual_seed(rank)) cropped a sample
    otherwise on each, and an elastic run gave it other crops."""
    one = draws_by_sample(4, 1, 0, monkeypatch)
    assert draws_by_sample(6, 2, 0, monkeypatch, rank_seeds=True) == one
