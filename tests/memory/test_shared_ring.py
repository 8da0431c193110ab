"""Zero-copy batches through SharedRing: identical to the ordinary path with fork and spawn and
any worker count, regions released and reused, dead workers reclaimed, timeouts, oversize
fallback, and nothing left in /dev/shm."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import torchfeed
from torchfeed import ImageCollate, PadCollate, RaggedBatch, loader
from torchfeed._tree import tensors_of
from torchfeed.memory import SharedRing

from helpers import written

# the regions themselves, on small batches: every tensor a view of its region, however small
pytestmark = pytest.mark.usefixtures("ring_views")

many_workers = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


class Images(Dataset):
    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        h, w = (int(v) for v in torch.randint(8, 40, (2,), generator=g))
        return torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8), i


class Texts(Dataset):
    def __len__(self):
        return 29

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        n = int(torch.randint(1, 30, (), generator=g))
        return {
            "ids": torch.randint(0, 100, (n,), generator=g),
            "label": i,
            "w": i / 2,
            "name": f"s{i}",
            "feat": torch.ones(3) * i,
        }


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, torchfeed.RaggedImages):
        return a.shapes == b.shapes and a.layout == b.layout and torch.equal(a.data, b.data)
    if isinstance(a, RaggedBatch):
        return a.host_lengths == b.host_lengths and torch.equal(a.values, b.values)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def batches(ds, collate, zero_copy, epochs=1, **kw):
    dl = loader(ds, zero_copy=zero_copy, collate_fn=collate, **kw)
    out = [list(dl) for _ in range(epochs)]
    return out, dl


@many_workers
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_image_batches_identical(context, workers):
    kw = dict(batch_size=5, num_workers=workers, multiprocessing_context=context)
    ours, dl = batches(Images(), ImageCollate(0, layout="HWC"), True, **kw)
    plain, _ = batches(Images(), ImageCollate(0, layout="HWC"), False, **kw)
    assert same(ours, plain)
    assert dl.shared_ring.contains(ours[0][0][0].data)  # really from the ring
    assert dl.shared_ring.stats()["allocations"] == 8


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_text_batches_identical_over_epochs_with_persistent_workers(packed, context):
    def collate():
        return PadCollate({"ids": 0}, packed=packed) if packed else PadCollate({"ids": -1})

    kw = dict(batch_size=6, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    ours, dl = batches(Texts(), collate(), True, epochs=3, **kw)
    plain, _ = batches(Texts(), collate(), False, epochs=3, **kw)
    assert same(ours, plain)
    ring = dl.shared_ring
    del ours
    stats = ring.stats()
    assert stats["bytes_in_use"] == 0 and stats["regions_in_consumer"] == 0
    assert stats["regions_in_workers"] == 0 and stats["allocations"] == 15


class Nested(Dataset):
    """What a DataLoader user's dataset returns, collated by default_collate: dicts of tensors,
    numbers, strings, numpy arrays, nested dicts and tuples."""

    def __len__(self):
        return 23

    def __getitem__(self, i):
        return {
            "pixel_values": torch.full((3, 8, 8), float(i)),
            "labels": i,
            "weight": i / 4,
            "name": f"s{i}",
            "extra": {"box": np.arange(4, dtype=np.float32) + i, "pair": (i, torch.ones(2) * i)},
        }


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_without_a_collate_fn_the_batches_are_default_collates(context):
    # a DataLoader user's habit: no collate_fn. The batches are default_collate's, from the ring
    kw = dict(batch_size=5, num_workers=2, multiprocessing_context=context)
    ours, dl = batches(Nested(), None, True, epochs=2, **kw)
    plain, _ = batches(Nested(), None, False, epochs=2, **kw)
    assert same(ours, plain) and len(ours[0]) == 5
    assert ours[0][0]["name"] == ["s0", "s1", "s2", "s3", "s4"]
    assert dl.shared_ring.contains(ours[0][0]["pixel_values"])  # really from the ring
    assert dl.shared_ring.stats()["allocations"] == 10
    assert repr(dl.collate_fn) == "DefaultCollate()"


def test_lazy_collate_once_written_is_default_collate():
    from torch.utils.data import default_collate

    from torchfeed._tree import Lazy
    from torchfeed.collate._fields import lazy_collate

    samples = [Nested()[i] for i in range(3)]
    lazy = lazy_collate(samples)
    # every stacked tensor waits for its region, the nested ones too
    assert isinstance(lazy["pixel_values"], Lazy) and isinstance(lazy["extra"]["pair"][1], Lazy)
    assert same(written(lazy), default_collate(samples))
    numbers = [(1, 2.5, True), (3, 4.5, False)]
    assert same(lazy_collate(numbers), default_collate(numbers))


def test_regions_are_released_and_reused():
    dl = loader(
        Images(200),
        zero_copy=True,
        collate_fn=ImageCollate(0, layout="HWC"),
        batch_size=4,
        num_workers=2,
        ring_capacity=64 * 1024,
    )
    for batch in dl:  # each batch dropped before the next: 50 batches through a small ring
        assert batch[0].data.numel() > 0
    del batch
    stats = dl.shared_ring.stats()
    assert stats["allocations"] == 50 and stats["bytes_in_use"] == 0
    assert stats["high_water"] <= 64 * 1024


def test_a_stale_handle_says_what_its_slot_holds_now():
    ring = SharedRing(1 << 16, pinned=False)
    handle = ring.pack({"x": torch.arange(4)})
    batch = ring.unpack(handle)
    stale = r"slot 0 \(generation 1, 64 bytes\) is stale \(its region was reclaimed or released\)"
    with pytest.raises(
        RuntimeError, match=stale + r": the slot is now with the consumer at generation 1"
    ):
        ring.unpack(handle)  # viewed twice
    del batch
    with pytest.raises(
        RuntimeError, match=stale + r": the slot is now free .* 0 region\(s\) reclaimed"
    ):
        ring.unpack(handle)  # released


def test_num_workers_zero_is_an_ordinary_loader():
    dl = loader(Images(), zero_copy=True, collate_fn=ImageCollate(0, layout="HWC"), batch_size=5)
    plain = list(loader(Images(), collate_fn=ImageCollate(0, layout="HWC"), batch_size=5))
    assert same(list(dl), plain) and dl.shared_ring is None


def test_dead_worker_regions_are_reclaimed():
    ring = SharedRing(1 << 16, timeout=5)
    ready = mp.get_context("fork").Event()

    def hold():
        ring._ring.acquire(1000, 5.0)
        ready.set()
        signal.pause()

    proc = mp.get_context("fork").Process(target=hold)
    proc.start()
    assert ready.wait(10)
    assert ring.stats()["regions_in_workers"] == 1
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    assert ring.reclaim_dead() == 1
    stats = ring.stats()
    assert (
        stats["regions_in_workers"] == 0 and stats["bytes_in_use"] == 0 and stats["reclaimed"] == 1
    )


class Killer(Dataset):
    """Kills its worker once, mid-epoch, right after the collate of an earlier batch."""

    def __init__(self, flag):
        self.flag = flag

    def __len__(self):
        return 30

    def __getitem__(self, i):
        if i == 17 and self.flag[0] == 0:
            self.flag[0] = 1
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((2, 2, 3), i, dtype=torch.uint8), i


def test_worker_killed_mid_epoch_does_not_leak():
    flag = torch.zeros(1, dtype=torch.int64).share_memory_()
    dl = loader(
        Killer(flag),
        zero_copy=True,
        collate_fn=ImageCollate(0, layout="HWC"),
        batch_size=3,
        num_workers=2,
    )
    with pytest.raises(
        RuntimeError, match="DataLoader worker .* exited unexpectedly|killed by signal"
    ):
        for batch in dl:
            del batch
    ring = dl.shared_ring
    again = [i for b in dl for i in b[1].tolist()]  # a new epoch: the lost regions come back
    assert again == list(range(30))
    assert ring.stats()["bytes_in_use"] == 0 and ring.stats()["regions_in_workers"] == 0


def test_timeout_when_the_consumer_never_releases():
    dl = loader(
        Images(64),
        zero_copy=True,
        collate_fn=ImageCollate(0, layout="HWC"),
        batch_size=4,
        num_workers=1,
        ring_capacity=32 * 1024,
        ring_timeout=1.0,
    )
    held = []
    with pytest.raises(
        TimeoutError, match="SharedRing.acquire: timed out after 1.0+ s waiting for space"
    ):
        for batch in dl:
            held.append(batch)  # never released
    assert held


@pytest.mark.filterwarnings("ignore:SharedRing")
def test_oversize_batches_fall_back():
    ours, dl = batches(
        Images(20),
        ImageCollate(0, layout="HWC"),
        True,
        batch_size=10,
        num_workers=2,
        ring_capacity=512,
    )
    plain, _ = batches(Images(20), ImageCollate(0, layout="HWC"), False, batch_size=10)
    assert same(ours, plain)
    assert dl.shared_ring.stats()["allocations"] == 0  # every batch took the ordinary path


def test_no_shared_memory_files_left(tmp_path):
    before = set(os.listdir("/dev/shm"))
    dl = loader(
        Images(),
        zero_copy=True,
        collate_fn=ImageCollate(0, layout="HWC"),
        batch_size=5,
        num_workers=2,
    )
    for _ in dl:
        break
    with pytest.raises(ZeroDivisionError):
        for _ in dl:
            raise ZeroDivisionError("the training step failed")
    del dl, _
    gc.collect()
    # A name torch's file-descriptor sharing creates and unlinks at once (a worker of this loader
    # or of an earlier test, still shutting down) can be caught in between: only what stays is
    # left behind (CI saw one such name once, gone moments later). Not multiprocessing's named
    # semaphores (sem.mp-*): under fork (this loader's) they are unlinked as they are made;
    # under spawn they live as long as their locks, in a test another xdist worker runs
    # meanwhile (CI saw 28 of them once, while the other worker ran the rest of the suite).

    def files() -> set[str]:
        return {name for name in os.listdir("/dev/shm") if not name.startswith("sem.")}

    before = {name for name in before if not name.startswith("sem.")}
    end = time.monotonic() + 5
    while (left := files() - before) and time.monotonic() < end:
        time.sleep(0.05)
    assert left == set()


def test_bad_arguments():
    with pytest.raises(TypeError, match="zero_copy needs a ring-aware collate_fn"):
        loader(Images(), zero_copy=True, collate_fn=lambda b: b, num_workers=2)
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        SharedRing(0)
    with pytest.raises(ValueError, match="timeout must be > 0"):
        SharedRing(1024, timeout=0)


@pytest.mark.cuda
def test_cuda_registered_memory_is_pinned_and_copies():
    dl = loader(
        Images(),
        zero_copy=True,
        collate_fn=ImageCollate(0, layout="HWC"),
        batch_size=5,
        num_workers=2,
    )
    plain = list(loader(Images(), collate_fn=ImageCollate(0, layout="HWC"), batch_size=5))
    got = []
    for batch in torchfeed.DevicePrefetcher(dl, "cuda"):
        assert batch[0].data.is_cuda
        got.append(batch[0].data.cpu())
    assert dl.shared_ring.pinned
    assert all(torch.equal(a, b[0].data) for a, b in zip(got, plain, strict=True))
    first = next(iter(dl))
    assert first[0].data.is_pinned()


@pytest.mark.parametrize("channels_last", [False, True])
def test_transform_in_workers_writes_into_the_ring(channels_last):
    from torchfeed.transforms import ResizeCenterCropNormalize

    t = ResizeCenterCropNormalize(
        24, 16, mean=[0.5] * 3, std=[0.25] * 3, image_layout="HWC", channels_last=channels_last
    )
    kw = dict(batch_size=5, num_workers=2)
    ours, dl = batches(Images(), ImageCollate(0, layout="HWC", transform=t), True, **kw)
    plain, _ = batches(Images(), ImageCollate(0, layout="HWC", transform=t), False, **kw)
    direct = [t([Images()[i][0] for i in range(k, min(k + 5, 37))]) for k in range(0, 37, 5)]
    assert same(ours, plain)
    for (images, _labels), want in zip(ours[0], direct, strict=True):
        assert images.shape == want.shape and torch.equal(images, want)
        assert dl.shared_ring.contains(images)
        assert images.is_contiguous(
            memory_format=torch.channels_last if channels_last else torch.contiguous_format
        )


def test_collate_transform_must_match_layout():
    from torchfeed.transforms import ResizeCenterCropNormalize

    t = ResizeCenterCropNormalize(24, 16, mean=[0.5], std=[0.25])
    with pytest.raises(
        ValueError, match="transform.image_layout='CHW' but the collate's layout='HWC'"
    ):
        ImageCollate(0, layout="HWC", transform=t)
    with pytest.raises(TypeError, match="transform must be a torchfeed batch transform"):
        ImageCollate(0, transform=lambda x: x)


def _shmem_kb() -> int:
    """This process's resident shared memory (the ring's pages it has mapped), in kB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def test_a_ring_allocates_what_it_uses_and_populate_makes_it_resident():
    # 1 GiB of capacity costs nothing until touched. (Page-locked, on a GPU machine, it is all
    # resident at once: cudaHostRegister locks every page.)
    ring = SharedRing(1 << 30, pinned=False)
    before = _shmem_kb()
    assert before < 64 * 1024
    assert ring.populate(100 << 20) == 100 << 20
    assert _shmem_kb() - before >= 95 * 1024  # resident now, not at the first batch
    assert ring.populate(5) == 100 << 20  # never less than what is already populated
    assert SharedRing(1 << 20, pinned=False).populate(1 << 30) == 1 << 20  # at most the capacity
    assert SharedRing(1 << 20, pinned=False).populate(4097) == 8192  # whole pages
    with pytest.raises(ValueError, match=r"populate: nbytes must be an int >= 0 \(bytes\), got -1"):
        ring.populate(-1)
    with pytest.raises(ValueError, match="populate: nbytes must be an int >= 0"):
        ring.populate(1.5)


class Counted(Dataset):
    """Fixed-size samples (1 KiB of image, a label), counting the reads made in this process."""

    def __init__(self, n=100, side=32):
        self.n, self.side, self.reads = n, side, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return torch.full((self.side, self.side, 1), i % 256, dtype=torch.uint8), i


@pytest.fixture
def page_locked_sizing(monkeypatch):
    """The loader sizes its ring as on a GPU machine, where every byte of it is page-locked (the
    ring itself is not: there is no GPU here)."""
    from torchfeed import loaders

    monkeypatch.setattr(loaders, "gpu_kernels_usable", lambda: True)


def test_without_a_gpu_the_ring_takes_its_share_and_nothing_is_probed():
    # nothing page-locked: pages are allocated as first written, so the capacity costs nothing
    # and the first epoch pays for no probe (no sample read in this process)
    from torchfeed.memory._budget import memory_budget

    data = Counted()
    dl = loader(data, zero_copy=True, collate_fn=ImageCollate(0, layout="HWC"), batch_size=32,
                num_workers=2)  # fmt: skip
    batches = list(dl)
    assert data.reads == 0 and dl.shared_ring.capacity == memory_budget().share(2)
    assert not dl.shared_ring.pinned
    # what the batches in flight used (2 x 2 queued, 1 held; 32 KiB of images a batch)
    assert 0 < dl.shared_ring.stats()["high_water"] <= 5 * (32 * 1024 + 1024)
    assert same(batches, list(loader(Counted(), collate_fn=ImageCollate(0, layout="HWC"),
                                     batch_size=32)))  # fmt: skip


@pytest.mark.usefixtures("page_locked_sizing")
def test_the_ring_is_sized_from_eight_samples_and_the_loader_queue():
    data = Counted()
    dl = loader(data, zero_copy=True, collate_fn=ImageCollate(0, layout="HWC"), batch_size=32,
                num_workers=2, prefetch_factor=3)  # fmt: skip
    batches = list(dl)
    assert len(batches) == 4 and data.reads == 8  # the probe read 8 samples here, not 32
    eight = ImageCollate(0, layout="HWC")([Counted()[i] for i in range(8)])
    per_batch = 4 * sum(t.numel() * t.element_size() for t in tensors_of(eight))
    ring = dl.shared_ring
    # an estimate (8 of 32 samples): twice the bytes, for 2 x 3 queued batches + 4 held
    assert ring.capacity == (2 * per_batch + 4096) * (2 * 3 + 4)
    # nothing populated up front: the workers' writes allocate what the batches use
    assert ring._populated == 0 and 0 < ring.stats()["high_water"] <= ring.capacity
    plain = list(loader(Counted(), collate_fn=ImageCollate(0, layout="HWC"), batch_size=32))
    assert same(batches, plain)


class Slow(Counted):
    """Samples that take 0.15 s each, as a large photo decoded whole does."""

    def __getitem__(self, i):
        time.sleep(0.15)
        return super().__getitem__(i)


@pytest.mark.usefixtures("page_locked_sizing")
def test_slow_samples_are_probed_fewer_with_more_room_to_spare():
    data = Slow(24)
    dl = loader(data, zero_copy=True, collate_fn=ImageCollate(0, layout="HWC"), batch_size=12,
                num_workers=1)  # fmt: skip
    batches = list(dl)
    assert len(batches) == 2 and data.reads == 2  # 0.3 s after 2 samples: the probe stops
    two = ImageCollate(0, layout="HWC")([Counted()[i] for i in range(2)])
    per_batch = 6 * sum(t.numel() * t.element_size() for t in tensors_of(two))
    # an estimate from 2 of 12 samples: three times the bytes, for 1 x 2 queued batches + 4 held
    assert dl.shared_ring.capacity == (3 * per_batch + 4096) * (1 * 2 + 4)
    assert same(batches, list(loader(Counted(24), collate_fn=ImageCollate(0, layout="HWC"),
                                     batch_size=12)))  # fmt: skip


@pytest.mark.parametrize(
    ("machine", "container", "ranks", "said"),
    [
        (16 << 20, None, None, r"half of this machine's 0\.0 GB: 0\.0 GB"),  # a 16 MiB machine
        (1 << 30, 16 << 20, None, r"half of the container's 0\.0 GB memory limit"),
        (
            64 << 20,
            None,
            "4",
            r"half of this machine's 0\.1 GB, shared by LOCAL_WORLD_SIZE=4 processes",
        ),
    ],
)
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "cpu"])
def test_a_ring_is_never_sized_beyond_half_the_memory_it_may_use(
    monkeypatch, machine, container, ranks, said, gpu
):
    """Half of the machine's memory, or of the container's limit where lower, divided among the
    ranks torchrun started on the machine: 8 MiB in each case here."""
    from torchfeed import loaders
    from torchfeed.memory import _budget

    monkeypatch.setattr(_budget, "physical_memory", lambda: machine)
    monkeypatch.setattr(_budget, "cgroup_memory_limit", lambda: container)
    if ranks is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", ranks)
    # batches of 8 x 256 KiB: 2 MiB each, so 1.5 x 2 MiB x (2 queued + 4) wanted
    dl = loader(Counted(40, side=512), zero_copy=True, collate_fn=ImageCollate(0, layout="HWC"),
                batch_size=8, num_workers=1)  # fmt: skip
    monkeypatch.setattr(loaders, "gpu_kernels_usable", lambda: gpu)
    if gpu:  # sized to the batches, which want more than the share: said so
        with pytest.warns(RuntimeWarning, match=r"want a ring of 0\.0 GB; it gets " + said):
            count = sum(1 for _ in dl)  # each batch dropped before the next
    else:  # the share itself: nothing to warn about
        count = sum(1 for _ in dl)
    assert dl.shared_ring.capacity == 8 << 20 and count == 5
    assert dl.shared_ring.stats()["allocations"] == 5  # workers waited for room, none fell back


def test_the_default_size_is_capped_by_the_bound_the_ring_enforces():
    """One computation of the machine's memory: the C++ check that refuses a larger arena, read
    by the loader's default-size cap; it agrees with what the OS reports to Python."""
    from torchfeed.memory._budget import memory_budget

    expected = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert torchfeed._C.physical_memory() == expected == memory_budget().machine
    with pytest.raises(ValueError, match=rf"physical memory \({expected} bytes\)"):
        SharedRing(expected + 4096)


class Rows(Dataset):
    """16 samples of 4 KiB, each filled with its index."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": torch.full((4096,), i, dtype=torch.uint8)}


def rows_loader(batches: int, prefetch_factor: int):
    return loader(Rows(), zero_copy=True, batch_size=1, num_workers=2, collate_fn=PadCollate([]),
                  prefetch_factor=prefetch_factor, ring_timeout=5.0,
                  ring_capacity=batches * 4096)  # fmt: skip


def test_a_hand_set_ring_too_small_for_the_loader_queue_warns_at_the_first_batch():
    dl = rows_loader(3, prefetch_factor=2)  # 2 x 2 queued + 1 held need 5
    with pytest.warns(RuntimeWarning) as recorded:
        next(iter(dl))
    # (pytest.warns records every category: on Python 3.12 with a GPU, forking the workers of a
    # process that CUDA made multi-threaded adds a DeprecationWarning)
    caught = [w for w in recorded if w.category is RuntimeWarning]
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "zero_copy: ring_capacity=12288 bytes holds 3 batch(es) of 4096 bytes (the first), fewer "
        "than the 4 the loader queues (num_workers=2 x prefetch_factor=2) plus the one the "
        "consumer holds"
    )
    assert "Give it at least 20480 bytes" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the loop


def test_a_second_iterator_supersedes_the_first():
    """iter() twice, as a dict of wrappers or islice(loader) beside iter(loader) does: the new
    iterator reclaims the regions of the first one's batches, so the first says so instead of
    handing out a stale handle (or a region a new worker is writing)."""
    dl = rows_loader(8, prefetch_factor=1)
    first = iter(dl)
    assert int(next(first)["x"][0, 0]) == 0
    second = iter(dl)
    with pytest.raises(RuntimeError, match=r"iter\(\) number 1\) was superseded by a later "
                       r"iter\(loader\) \(number 2\).* one iterator at a time"):  # fmt: skip
        next(first)
    assert [int(b["x"][0, 0]) for b in second] == list(range(16))
    assert [int(b["x"][0, 0]) for b in dl] == list(range(16))  # the next epoch as usual


def test_a_ring_with_room_for_the_queue_and_one_held_batch_never_stalls():
    """The CUDA fence tests' loader on the CPU: a ring of 3 batches, one queued per worker;
    each batch is dropped before the next, so a freed region is rewritten at once."""
    dl = rows_loader(3, prefetch_factor=1)  # 2 x 1 queued + 1 held: no warning
    for _ in range(2):
        assert [int(b["x"][0, 0]) for b in dl] == list(range(16))
    assert dl.shared_ring.stats()["bytes_in_use"] == 0
