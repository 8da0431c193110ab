"""A torchfeed loader checkpointed under a DevicePrefetcher: the checkpoint records the batches
the training loop has, not the ones the prefetcher read ahead, so a resumed run reads every
sample exactly once (before 2026-12-07 the read-ahead batches, depth + 1 of them, were lost)."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import IterableDataset

import torchfeed
from torchfeed.data import ShardedIterableDataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

N, BATCH, STEPS = 100, 4, 5
LENGTHS = [30, 1, 24, 45]


class Stream(IterableDataset):
    """A plain stream of 0..N-1."""

    def __iter__(self):
        yield from range(N)


class OwnPosition(Stream):
    """A stream that keeps its own position, as a Hugging Face streaming dataset does."""

    def __init__(self) -> None:
        self.position = 0

    def __iter__(self):
        while self.position < N:
            self.position += 1
            yield self.position - 1

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def shard(i: int):
    return [sum(LENGTHS[:i]) + k for k in range(LENGTHS[i])]


def make(kind: str, workers: int):
    torch.manual_seed(0)
    if kind == "zero copy":  # batches written into the shared ring (default_collate's tensors)
        return torchfeed.loader(list(range(N)), zero_copy=True, batch_size=BATCH, shuffle=True,
                                num_workers=workers)  # fmt: skip
    data = {
        "map": lambda: list(range(N)),
        "sharded": lambda: ShardedIterableDataset(list(range(4)), shard, item_lengths=LENGTHS),
        "stream": Stream,
        "own position": OwnPosition,
    }[kind]()
    return torchfeed.loader(data, batch_size=BATCH, shuffle=kind == "map", num_workers=workers,
                            collate_fn=list)  # fmt: skip


def listed(batch) -> list[int]:
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


CASES = [("map", 0), ("map", 2), ("sharded", 0), ("sharded", 2), ("stream", 0),
         ("own position", 0), ("zero copy", 2)]  # fmt: skip


@pytest.mark.parametrize(("kind", "workers"), CASES)
def test_a_checkpoint_under_the_prefetcher_records_what_the_loop_has(kind, workers):
    full = [s for b in torchfeed.DevicePrefetcher(make(kind, workers), "cpu") for s in listed(b)]
    assert sorted(full) == list(range(N))
    loader = make(kind, workers)
    it = iter(torchfeed.DevicePrefetcher(loader, "cpu", depth=3))
    head = [s for _ in range(STEPS) for s in listed(next(it))]
    end = time.time() + 10
    while loader._batches < STEPS + 3 and time.time() < end:  # the prefetcher reads ahead
        time.sleep(0.01)
    assert loader._batches > STEPS
    state = loader.state_dict()
    assert state["batches"] == STEPS
    it.close()
    again = make(kind, workers)
    again.load_state_dict(state)
    tail = [s for b in torchfeed.DevicePrefetcher(again, "cpu") for s in listed(b)]
    assert head + tail == full


def test_without_a_prefetcher_a_checkpoint_counts_the_batches_yielded():
    """The loader iterated again by itself forgets an earlier prefetcher's count."""
    loader = make("map", 0)
    it = iter(torchfeed.DevicePrefetcher(loader, "cpu"))
    next(it)
    it.close()
    plain = iter(loader)
    for _ in range(3):
        next(plain)
    assert loader.state_dict()["batches"] == 3


def test_a_stream_whose_position_was_not_noted_is_read_again_and_its_batches_dropped():
    loader = make("own position", 0)
    it = iter(torchfeed.DevicePrefetcher(loader, "cpu"))
    head = [s for _ in range(STEPS) for s in next(it)]
    loader._pulled.clear()  # (cannot happen: every batch read is noted)
    state = loader.state_dict()
    assert "dataset" not in state and state["batches"] == STEPS
    it.close()
    again = make("own position", 0)
    again.load_state_dict(state)
    assert head + [s for b in again for s in b] == list(range(N))
