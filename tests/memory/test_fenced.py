"""Ring memory carries its own fence: a region (or block) is reused only after every copy queued
from it has finished, whatever loop or wrapper queued the copy: the plain
``.to(device, non_blocking=True)`` loop, a wrapped loader, DevicePrefetcher, a consumer that keeps
its batches. Without a GPU the logic is checked with the extension's manual fences (held until
the test completes them) and the meta device standing for the GPU; the CUDA tests at the end
queue a slow kernel before each copy, let the worker write the next batch, and compare what
the device received with what was written (they run on a GPU machine only)."""

from __future__ import annotations

import copy
import itertools
import pickle
import threading
import time

import pytest
import torch
from torch.utils.data import Dataset

import torchfeed
from torchfeed import PadCollate, PinnedRing
from torchfeed.memory import SharedRing, _fenced
from torchfeed.memory._fenced import RingTensor

C = torchfeed._C
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


class FakeStream:
    cuda_stream = 0
    device = torch.device("cuda", 0)


@pytest.fixture
def fences(monkeypatch, ring_views):
    """The meta device stands for a GPU; every fence is held until complete(); every tensor of
    these small batches a view of its region (ring_views), which the fences concern."""
    monkeypatch.setattr(_fenced, "FENCED_DEVICE_TYPES", {"meta"})
    monkeypatch.setattr(_fenced, "fences_unpinned", True)
    monkeypatch.setattr(_fenced, "_stream_for", lambda device: FakeStream())
    C._testing.manual_fences(True)
    try:
        yield C._testing
    finally:
        C._testing.complete_fences()
        C._testing.manual_fences(False)


def packed(ring, n=3):
    return ring.unpack(ring.pack({"x": torch.arange(n * 10).reshape(n, 10), "y": torch.ones(n)}))


def test_a_region_is_held_until_the_copy_from_it_finished(fences):
    ring = SharedRing(1 << 16)
    batch = packed(ring)
    assert isinstance(batch["x"], RingTensor) and isinstance(batch["y"], RingTensor)
    on_device = batch["x"].to("meta", non_blocking=True)  # what every tutorial's loop does
    assert type(on_device) is torch.Tensor and on_device.device.type == "meta"
    assert fences.pending_fences() == 1
    del batch  # the last host reference goes while the copy may still be reading
    assert ring.stats()["regions_in_consumer"] == 1  # not free: a worker cannot write it yet
    assert fences.complete_fences() == 1  # the copy has run
    assert ring.stats()["bytes_in_use"] == 0


def test_a_region_nothing_copied_from_is_free_when_dropped(fences):
    ring = SharedRing(1 << 16)
    batch = packed(ring)
    total = batch["x"].sum() + batch["y"].sum()  # host work: no fence
    assert type(total) is torch.Tensor and fences.pending_fences() == 0
    del batch
    assert ring.stats()["bytes_in_use"] == 0


def test_views_carry_the_fence_and_new_tensors_do_not(fences):
    ring = SharedRing(1 << 16)
    batch = packed(ring)
    row = batch["x"][1]
    assert isinstance(row, RingTensor)  # a view of the ring
    assert type(batch["x"] + 1) is torch.Tensor  # new memory
    assert type(batch["x"].clone()) is torch.Tensor
    del batch
    row.to("meta")
    assert fences.pending_fences() == 1
    del row
    assert ring.stats()["regions_in_consumer"] == 1
    fences.complete_fences()
    assert ring.stats()["bytes_in_use"] == 0


def test_a_copy_into_a_device_tensor_is_fenced_too(fences):
    ring = SharedRing(1 << 16)
    batch = packed(ring)
    target = torch.empty(3, 10, dtype=torch.int64, device="meta")
    target.copy_(batch["x"], non_blocking=True)
    assert fences.pending_fences() == 1


def test_pickled_or_copied_it_is_the_tensor_it_holds(fences):
    ring = SharedRing(1 << 16)
    batch = packed(ring)
    for other in (pickle.loads(pickle.dumps(batch["x"])), copy.deepcopy(batch["x"])):
        assert type(other) is torch.Tensor and torch.equal(
            other, batch["x"].as_subclass(torch.Tensor)
        )


class Rows(Dataset):
    def __len__(self):
        return 12

    def __getitem__(self, i):
        return {"x": torch.full((64,), i)}


@pytest.mark.parametrize("wrap", ["plain", "islice", "generator"])
def test_any_loop_over_a_zero_copy_loader_fences_what_it_copies(fences, wrap):
    loader = torchfeed.loader(Rows(), zero_copy=True, batch_size=2, num_workers=2, collate_fn=PadCollate([]),
                              ring_capacity=1 << 16)  # fmt: skip
    batches = {
        "plain": lambda: iter(loader),
        "islice": lambda: itertools.islice(loader, 4),
        "generator": lambda: (b for b in loader),  # a framework's wrapper, say
    }[wrap]()
    copies = []
    for b in batches:
        copies.append(b["x"].to("meta", non_blocking=True))
        del b
    ring = loader.shared_ring
    assert fences.pending_fences() == len(copies)
    assert ring.stats()["regions_in_consumer"] == len(copies)  # none reused before its copy ran
    fences.complete_fences()
    assert ring.stats()["regions_in_consumer"] == 0


def test_a_consumer_that_keeps_its_batches_keeps_their_regions(fences):
    loader = torchfeed.loader(Rows(), zero_copy=True, batch_size=3, num_workers=1, collate_fn=PadCollate([]),
                              ring_capacity=1 << 16)  # fmt: skip
    kept = list(loader)
    fences.complete_fences()
    assert loader.shared_ring.stats()["regions_in_consumer"] == len(kept) == 4
    assert [int(b["x"][0, 0]) for b in kept] == [0, 3, 6, 9]  # never overwritten
    del kept
    assert loader.shared_ring.stats()["regions_in_consumer"] == 0


def test_pinned_ring_blocks_carry_the_fence(fences):
    ring = PinnedRing(1 << 16, pinned=False)
    staged = ring.stage({"a": torch.arange(100), "b": torch.ones(3, 4)})
    assert isinstance(staged["a"], RingTensor)
    staged["a"].to("meta", non_blocking=True)
    del staged
    assert ring.stats()["blocks_in_flight"] == 1  # waits for the copy
    fences.complete_fences()
    assert ring.stats()["blocks_in_flight"] == 0


def test_without_page_locked_memory_the_tensors_are_plain():
    ring = SharedRing(1 << 16, pinned=False)  # as on a machine without a GPU
    assert not ring.pinned and type(packed(ring)["x"]) is torch.Tensor  # nothing to fence


# On a GPU: a slow kernel queued before each copy, then the worker's next batch, then the device
# copy compared with what was written.


class Big(Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": torch.full((1 << 20,), i, dtype=torch.uint8)}


def slow_copies(batches, keep_host: bool = False):
    out, host = [], []
    for b in batches:
        torch.cuda._sleep(20_000_000)  # the copy waits behind this on the stream
        out.append(b["x"].to("cuda", non_blocking=True))
        if keep_host:
            host.append(b)
        del b  # the host batch goes at once: its region must wait for the copy
    torch.cuda.synchronize()
    return [int(t.float().mean().item()) for t in out]


def tight_loader(batches: int = 3):
    # room for three batches of 1 MiB: the one the consumer holds, the one a worker has sent and
    # the one the other writes, so a freed region is rewritten almost at once. One batch queued
    # per worker: with two, a worker can fill the ring with batches sent after the one the
    # consumer waits for, whose worker then waits for room that never comes.
    return torchfeed.loader(Big(), zero_copy=True, batch_size=1, num_workers=2, prefetch_factor=1,
                            collate_fn=PadCollate([]), ring_capacity=batches << 20)  # fmt: skip


@pytest.mark.cuda
@pytest.mark.parametrize("wrap", ["plain", "islice", "generator"])
def test_no_batch_is_overwritten_while_its_copy_is_queued(wrap):
    loader = tight_loader()
    # one iterator only: a dict of all three made three, and each new one reclaims the regions
    # of the one before (the 2026-12-04 H200 runs' stale handle)
    batches = {"plain": lambda: iter(loader), "islice": lambda: itertools.islice(loader, 16),
               "generator": lambda: (b for b in loader)}[wrap]()  # fmt: skip
    assert slow_copies(batches) == list(range(16))


@pytest.mark.cuda
def test_the_prefetcher_over_a_wrapped_loader_and_a_consumer_that_keeps_batches():
    loader = tight_loader()
    got = [
        int(b["x"].float().mean()) for b in torchfeed.DevicePrefetcher((b for b in loader), "cuda")
    ]
    assert got == list(range(16))
    # a consumer keeping every host batch needs room for all of them
    assert slow_copies(iter(tight_loader(16 + 2)), keep_host=True) == list(range(16))


@pytest.mark.cuda
def test_prefetched_batches_freed_early_late_or_from_another_thread():
    """SPDL's race: a batch freed on another thread while kernels reading it are queued on the
    consumer stream; its memory must not be reused under them."""
    results, threads = [], []

    def read_later(batch, i):
        time.sleep(0.01)
        torch.cuda._sleep(5_000_000)
        results.append((i, int(batch["x"].float().mean())))
        del batch

    for i, batch in enumerate(torchfeed.DevicePrefetcher(tight_loader(), "cuda")):
        if i % 3 == 0:
            del batch  # dropped at once
            results.append((i, i))
            continue
        t = threading.Thread(target=read_later, args=(batch, i))
        t.start()
        threads.append(t)
        del batch
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert sorted(results) == [(i, i) for i in range(16)]
