"""DevicePrefetcher with real DataLoaders: order, transform, errors, threads, epochs."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfeed
from torchfeed import DevicePrefetcher, PinnedRing

from helpers import wait_for_no_threads


class Numbers(Dataset):
    def __init__(self, n: int = 53, fail_at: int | None = None) -> None:
        self.n, self.fail_at = n, fail_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.fail_at:
            raise ValueError(f"corrupt sample {i}")
        return {"x": torch.full((3, 4), float(i)), "i": i}


@pytest.mark.parametrize("use_ring", [False, True])
def test_every_batch_once_in_order_with_transform(use_ring):
    loader = DataLoader(Numbers(), batch_size=5, num_workers=2)
    ring = PinnedRing(1 << 16, pinned=False) if use_ring else None
    seen = []

    def transform(batch):
        return {"x": batch["x"] * 2, "i": batch["i"]}

    prefetcher = DevicePrefetcher(loader, device="cpu", pinned_ring=ring, transform=transform)
    assert len(prefetcher) == len(loader) == 11
    for batch in prefetcher:
        assert torch.equal(batch["x"], 2 * batch["i"].view(-1, 1, 1).float().expand(-1, 3, 4))
        seen.extend(batch["i"].tolist())
    assert seen == list(range(53))
    assert wait_for_no_threads()
    if ring is not None:
        del batch
        assert ring.stats()["blocks_in_flight"] == 0 and ring.stats()["allocations"] == 11


def test_staged_batches_view_the_ring_on_cpu():
    ring = PinnedRing(1 << 16, pinned=False)
    loader = DataLoader(Numbers(10), batch_size=5)
    batches = list(DevicePrefetcher(loader, device="cpu", pinned_ring=ring))
    assert all(ring.contains(b["x"]) for b in batches)
    assert ring.stats()["blocks_in_flight"] == 2
    del batches
    assert ring.stats()["blocks_in_flight"] == 0


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_error_surfaces_in_the_loop(workers):
    loader = DataLoader(Numbers(fail_at=17), batch_size=5, num_workers=workers)
    got = []
    with pytest.raises(ValueError, match="corrupt sample 17"):
        for batch in DevicePrefetcher(loader, device="cpu"):
            got.extend(batch["i"].tolist())
    assert got == list(range(15))
    assert wait_for_no_threads()


def test_transform_error_surfaces():
    def broken(batch):
        raise KeyError("no such field")

    with pytest.raises(KeyError, match="no such field"):
        next(iter(DevicePrefetcher(DataLoader(Numbers(), batch_size=4), "cpu", transform=broken)))
    assert wait_for_no_threads()


class Unstartable:
    def __iter__(self):
        raise OSError("the loader cannot start")


def test_a_loader_that_cannot_start_fails_at_iter_and_nothing_else(monkeypatch):
    import gc
    import sys

    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(OSError, match="the loader cannot start"):
        iter(DevicePrefetcher(Unstartable(), "cpu"))
    gc.collect()  # the half-made iterator goes without an error of its own
    assert unraisable == []
    assert wait_for_no_threads()


def test_break_leaves_no_thread():
    loader = DataLoader(Numbers(200), batch_size=2, num_workers=2)
    for i, _ in enumerate(DevicePrefetcher(loader, device="cpu", depth=3)):
        if i == 2:
            break
    assert wait_for_no_threads()


def test_epochs_and_persistent_workers():
    loader = DataLoader(Numbers(20), batch_size=6, num_workers=2, persistent_workers=True)
    prefetcher = DevicePrefetcher(loader, device="cpu")
    for _ in range(3):
        assert [i for b in prefetcher for i in b["i"].tolist()] == list(range(20))
    assert wait_for_no_threads()


def test_loads_the_next_batch_while_the_step_runs():
    """The step on batch i waits until the loader has started reading batch i + 1: without the
    prefetcher's thread that never happens (the wait times out). How much time that saves is
    measured in bench/test_bench_prefetch.py."""
    started = [threading.Event() for _ in range(4)]

    class Marking(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            started[i].set()
            return i

    loader = DataLoader(Marking(), batch_size=1)
    for batch in DevicePrefetcher(loader, device="cpu"):
        i = int(batch)
        if i + 1 < len(started):
            assert started[i + 1].wait(timeout=10), f"batch {i + 1} was not read during step {i}"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(depth=0), ValueError, "depth must be an int >= 1"),
        (dict(transform=3), TypeError, "transform must be callable"),
        (dict(pinned_ring="big"), TypeError, "pinned_ring must be a PinnedRing, None or False"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        DevicePrefetcher([1, 2], device="cpu", **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_cuda_device_without_gpu():
    with pytest.raises(ValueError, match="no CUDA GPU is usable"):
        DevicePrefetcher([1], device="cuda")


@pytest.mark.cuda
def test_cuda_batches_arrive_correct_with_auto_ring():
    loader = DataLoader(Numbers(40), batch_size=8, num_workers=2)
    prefetcher = DevicePrefetcher(loader, device="cuda")
    seen = []
    for batch in prefetcher:
        assert batch["x"].is_cuda
        torch.cuda._sleep(1_000_000)  # a "step" on the consumer stream
        expect = batch["i"].to("cuda").view(-1, 1, 1).float().expand(-1, 3, 4)
        assert torch.equal(batch["x"], expect)
        seen.extend(batch["i"].tolist())
    assert seen == list(range(40))
    assert prefetcher.pinned_ring is not None and prefetcher.pinned_ring.pinned
    assert wait_for_no_threads()


@pytest.mark.cuda
def test_cuda_transform_runs_on_the_device():
    images = [torch.randint(0, 256, (3, 40 + i, 50), dtype=torch.uint8) for i in range(6)]
    loader = DataLoader(images, batch_size=3, collate_fn=torchfeed.ImageCollate())
    t = torchfeed.transforms.RandomResizedCropFlipNormalize(16, mean=[0.5] * 3, std=[0.2] * 3)
    out = list(DevicePrefetcher(loader, device="cuda", transform=t))
    assert [o.shape for o in out] == [(3, 3, 16, 16)] * 2 and out[0].is_cuda
