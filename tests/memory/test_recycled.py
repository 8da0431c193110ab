"""Recycled worker memory (ImageCollate in an ordinary DataLoader): batches identical to the
ordinary path with fork and spawn, the worker's memory reused batch after batch, never a wait
when the consumer keeps batches, regions a worker drops or the loader discards returned, and
batches that outlive their workers."""

from __future__ import annotations

import copy
import gc
import os
import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchfeed
from torchfeed import ImageCollate, RaggedImages
from torchfeed.memory import SharedRing, _recycled


class Images(Dataset):
    def __init__(self, n=37, size=(8, 40)):
        self.n, self.size = n, size

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        h, w = (int(v) for v in torch.randint(*self.size, (2,), generator=g))
        return torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8), i


def expected(ds, labels):
    return [ds[int(i)][0].permute(2, 0, 1) for i in labels]


def check(batch, ds):
    images, labels = batch
    assert isinstance(images, RaggedImages)
    for got, want in zip(images.images(), expected(ds, labels), strict=True):
        assert torch.equal(got, want)


def recycled(images: RaggedImages) -> bool:
    # the ordinary path's buffer is a torch shared-memory storage; a recycled one views the
    # worker's ring through a mapping of this process's own
    return not images.data.is_shared()


def loader(ds, recycle=True, **kw):
    kw = {"batch_size": 4, "num_workers": 2, **kw}
    return DataLoader(ds, collate_fn=ImageCollate(0, layout="HWC", recycle=recycle), **kw)


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("persistent", [False, True])
def test_recycled_batches_are_the_ordinary_ones(context, persistent):
    ds = Images()
    kw = dict(multiprocessing_context=context, persistent_workers=persistent)
    ours = loader(ds, **kw)
    plain = loader(ds, recycle=False, **kw)
    for _ in range(2):  # two epochs: persistent workers reuse their rings
        for a, b in zip(ours, plain, strict=True):
            check(a, ds)
            assert recycled(a[0]) and not recycled(b[0])
            assert a[0].shapes == b[0].shapes and a[0].layout == b[0].layout
            assert torch.equal(a[0].data, b[0].data) and torch.equal(a[1], b[1])


class Stats(Dataset):
    """Images, plus the worker ring's counters as the sample's label (read when the sample is
    made, so they describe the batches before it)."""

    def __init__(self, n, side=60):
        self.images = Images(n, size=(side, side + 1))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        ring = _recycled._worker_ring
        stats = ring.stats() if ring is not None and ring._owner == os.getpid() else {}
        return self.images[i][0], (stats.get("allocations", 0), stats.get("high_water", 0))


def test_a_worker_reuses_its_memory_batch_after_batch():
    ds = Stats(120)
    batch_bytes = 4 * 60 * 60 * 3
    seen = []
    for images, stats in loader(ds, num_workers=1):
        assert recycled(images)
        seen.append(stats)
    del images
    # 30 batches, each dropped before the next arrives: the worker's ring never held more than
    # the batches in flight (prefetch_factor 2, the one being written, the consumer's)
    allocations, high_water = seen[-1]
    assert len(seen) == 30 and int(allocations[-1]) == 29
    assert 0 < int(high_water[-1]) <= 4 * (batch_bytes + 256)


def test_a_consumer_keeping_every_batch_never_waits(monkeypatch):
    monkeypatch.setattr(_recycled, "RING_MIN_BYTES", 0)  # rings of 6 first batches (forked)
    ds = Images(200, size=(120, 160))  # images past SMALL_FIELD_BYTES: kept, they hold the ring
    kept = list(loader(ds, timeout=60))  # 50 batches held: far more than a ring of 6
    assert len(kept) == 50
    for batch in kept:
        check(batch, ds)
    modes = [recycled(images) for images, _ in kept]
    assert modes[0] and not all(modes)  # the ring filled, then the ordinary path


def test_regions_return_when_the_worker_drops_or_the_loader_discards_them():
    ds = Stats(200)
    inner = ImageCollate(0, layout="HWC")

    def clone_images(batch):
        images, labels = inner(batch)
        return images.with_tensors((images.data.clone(),)), labels  # the lent buffer dropped

    dl = DataLoader(ds, batch_size=4, num_workers=1, collate_fn=clone_images)
    seen = []
    for images, stats in dl:
        assert not recycled(images)  # a clone in ordinary shared memory
        seen.append(stats)
    # every region came back: 50 lent, and the ring never ran out (each lend succeeded)
    assert len(seen) == 50 and int(seen[-1][0][-1]) == 49

    dl = loader(ds, num_workers=1, persistent_workers=True)
    for epoch in range(5):  # leaked regions would fill the worker's ring (6 batches) by now
        for k, (images, _stats) in enumerate(dl):
            assert recycled(images), (epoch, k)
            if k == 3:
                break  # the batches the worker has already sent are discarded by the reset
    del images
    gc.collect()


def test_batches_outlive_their_workers_and_pickle_as_usual():
    ds = Images(12)
    dl = loader(ds)
    kept = list(dl)
    del dl
    gc.collect()  # the workers are gone; their rings live on in the batches
    for batch in kept:
        check(batch, ds)
        images = batch[0]
        for again in (pickle.loads(pickle.dumps(images)), copy.deepcopy(images)):
            assert not recycled(again) or again.data.data_ptr() != images.data.data_ptr()
            assert torch.equal(again.data, images.data) and again.shapes == images.shapes


def test_no_descriptor_is_left_open():
    ds = Images(80)
    dl = loader(ds, persistent_workers=True)
    counts = []
    for _ in range(4):  # the first epoch starts the workers, which make their rings
        for images, _labels in dl:
            assert recycled(images)
        del images
        gc.collect()
        counts.append(len(os.listdir("/proc/self/fd")))
    assert counts[1:] == counts[:1] * 3


def test_outside_workers_and_when_off_it_is_the_ordinary_path():
    ds = Images(8)
    images, _ = next(iter(loader(ds, num_workers=0)))
    assert images._lent is None
    images, _ = next(iter(loader(ds, recycle=False)))
    assert not recycled(images)
    with pytest.raises(TypeError, match="recycle must be True or False, got 1"):
        ImageCollate(0, recycle=1)  # type: ignore[arg-type]


def test_a_worker_that_cannot_make_its_memory_warns_once_and_packs_as_usual(monkeypatch):
    def no_memory(*args, **kwargs):
        raise OSError("memfd_create: too many open files")

    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())  # as in a worker
    monkeypatch.setattr(_recycled, "SharedRing", no_memory)
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)
    ims = [torch.full((3, 4, 5), 7, dtype=torch.uint8), torch.ones(3, 2, 2, dtype=torch.uint8)]
    with pytest.warns(RuntimeWarning, match="cannot make its shared memory.*too many open"):
        out = RaggedImages.from_images(ims, recycle=True)
    assert out._lent is None and torch.equal(out[0], ims[0]) and torch.equal(out[1], ims[1])
    assert _recycled.lend(100) is None  # no second warning (filterwarnings=error would raise)


def test_a_larger_batch_reuses_the_region_a_smaller_one_freed(monkeypatch):
    # batches of photos differ in size, and regions are placed first fit: each region is as
    # large as the largest batch yet, so the next batch fits the hole an earlier one left
    # rather than going on into memory never written
    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())  # as in a worker
    for name in ("_worker_ring", "_worker_ring_pid", "_largest_lent"):
        monkeypatch.setattr(_recycled, name, getattr(_recycled, name))
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)  # this process's own ring
    first = _recycled.lend(50 << 12)
    smaller = _recycled.lend(40 << 12)  # while the first is in flight: the next region
    assert first is not None and smaller is not None
    buf, lent = smaller
    assert buf.numel() == 40 << 12 and lent.nbytes == 40 << 12
    address = lent.address
    del buf, lent, smaller  # never sent: its region goes back to the ring
    larger = _recycled.lend(45 << 12)
    assert larger is not None and larger[1].address == address  # in the freed region
    assert larger[0].numel() == 45 << 12
    stats = _recycled._worker_ring.stats()
    assert stats["high_water"] == 2 * (50 << 12)


class Odd(Dataset):
    """float32 images, and images with no pixels."""

    def __len__(self):
        return 12

    def __getitem__(self, i):
        h, w = (0, 3) if i % 3 == 0 else (i + 1, 2 * i + 1)
        return torch.arange(h * w * 3, dtype=torch.float32).reshape(h, w, 3) + i, i


def test_any_dtype_and_images_with_no_pixels():
    ds = Odd()
    ours = list(loader(ds, batch_size=3))
    plain = list(loader(ds, batch_size=3, recycle=False))
    for (a, la), (b, lb) in zip(ours, plain, strict=True):
        assert a.data.dtype == torch.float32 and a.shapes == b.shapes
        assert torch.equal(a.data, b.data) and torch.equal(la, lb)
        check((a, la), ds)
    assert all(recycled(images) for images, _ in ours)


@pytest.mark.cuda
def test_recycled_batches_pin_and_reach_the_gpu():
    ds = Images(40)
    pinned = list(loader(ds, pin_memory=True))  # the pin thread unpickles and copies them
    assert all(images.is_pinned() for images, _ in pinned)
    got = []
    for images, labels in torchfeed.DevicePrefetcher(loader(ds), "cuda"):
        assert images.data.is_cuda
        got.append((images.data.cpu(), labels))
    plain = list(loader(ds, recycle=False))
    assert len(got) == len(plain) == len(pinned)
    for (data, labels), (images, want) in zip(got, plain, strict=True):
        assert torch.equal(data, images.data) and torch.equal(labels.cpu(), want)


def test_lend_checks_its_size_and_never_waits():
    ring = SharedRing(1 << 16)
    with pytest.raises(ValueError, match="SharedRing.lend: nbytes must be >= 0, got -1"):
        ring._ring.lend(-1)
    assert ring._ring.lend((1 << 16) + 1) == (None, -1, -1)  # larger than the ring
    held = [ring._ring.lend(1 << 14)[0] for _ in range(4)]
    assert all(t is not None for t in held)
    assert ring._ring.lend(1 << 14) == (None, -1, -1)  # full: at once, no wait
    del held
    assert ring._ring.lend(1 << 16)[0] is not None  # all four came back (never handed over)


class CountingAttach:
    """_recycled.C with its ring's attach counted (the mappings this process makes)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = _recycled.C

        class Ring:
            @staticmethod
            def attach(fd):
                self.calls += 1
                return real._SharedRing.attach(fd)

        fake = {"_SharedRing": Ring, "process_alive": real.process_alive}
        monkeypatch.setattr(_recycled, "C", type("C", (), fake))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_workers_ring_is_mapped_once_while_the_worker_lives(monkeypatch, workers):
    counting = CountingAttach(monkeypatch)
    ds = Images(48)
    dl = loader(ds, num_workers=workers, persistent_workers=True)
    for _ in range(2):
        for batch in dl:  # each batch freed before the next: no view keeps a mapping alive
            check(batch, ds)
            assert recycled(batch[0])
    # 24 batches over two epochs; mapping each worker's ring anew per batch made 24 mappings
    assert counting.calls == workers
    del batch, dl
    gc.collect()


class Pids(Dataset):
    """Images labelled with the pid of the worker that made them."""

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return Images()[i][0], os.getpid()


def owners():
    return {owner for _, owner in _recycled._mappings.rings.values()}


def test_a_mapping_goes_once_its_worker_has_exited(monkeypatch):
    monkeypatch.setattr(_recycled._Mappings, "CHECK_EVERY", 0.0)
    it = iter(loader(Pids()))
    kept = [next(it), next(it)]  # one batch from each of the two workers
    workers = {int(p) for _, pids in kept for p in pids}
    assert len(workers) == 2 and workers <= owners()  # kept while the workers live
    kept += list(it)  # exhausted: the workers (not persistent) have exited
    gc.collect()  # the collector's callback finds them gone
    assert not workers & owners()
    assert (_recycled._mappings._collected in gc.callbacks) == bool(owners())
    ds = Images()
    for b, (images, _) in enumerate(kept):  # the batches keep the memory they view
        assert recycled(images)
        for k, image in enumerate(images.images()):
            assert torch.equal(image, ds[4 * b + k][0].permute(2, 0, 1))


def test_a_full_collection_drops_the_mappings_of_exited_workers_at_once(monkeypatch):
    # gc.collect() after a loader is done: its workers' memory goes now, not during whatever
    # runs next (young collections still check at most every CHECK_EVERY seconds)
    monkeypatch.setattr(_recycled._Mappings, "CHECK_EVERY", 3600.0)
    it = iter(loader(Pids()))
    kept = [next(it), next(it)]
    workers = {int(p) for _, pids in kept for p in pids}
    kept += list(it)  # exhausted: the workers (not persistent) have exited
    gc.collect(1)
    assert workers <= owners()  # a young collection within CHECK_EVERY: not checked
    gc.collect()
    assert not workers & owners()
    assert len(kept) == 4


def test_a_process_is_dead_only_when_the_system_has_no_such_process():
    # the one test of a worker's life, C++'s, for rings and for these mappings alike
    from torchfeed._extension import C

    assert C.process_alive(os.getpid())
    child = os.fork()
    if child == 0:
        os._exit(0)
    assert C.process_alive(child)  # exited, not yet reaped: still a process (a zombie)
    os.waitpid(child, 0)
    assert not C.process_alive(child)
    assert not C.process_alive(0) and not C.process_alive(-1)
    assert C.process_alive(1)  # another user's process (EPERM outside a sandbox): alive


def test_a_forked_child_keeps_none_of_its_parents_mappings():
    ds = Images(16)
    dl = loader(ds, num_workers=1, persistent_workers=True)
    kept = list(dl)
    assert _recycled._mappings.rings
    ctx = torch.multiprocessing.get_context("fork")
    child = ctx.Process(target=_exit_with_mappings_count)
    child.start()
    child.join()
    assert child.exitcode == 0
    del kept, dl
    gc.collect()


def _exit_with_mappings_count():
    os._exit(len(_recycled._mappings.rings) + (_recycled._mappings._collected in gc.callbacks))


def test_only_a_workers_first_batch_carries_its_descriptor(monkeypatch):
    """Passing a descriptor costs the receiver a connection to the worker's resource sharer: the
    ring's goes with the first batch a worker sends, and the mapping kept from it serves the
    rest (RingRef)."""
    refs = []
    real = _recycled.receive

    def counted(ref, *args):
        refs.append(ref)
        return real(ref, *args)

    monkeypatch.setattr(_recycled, "receive", counted)
    ds = Images(48)
    dl = loader(ds, num_workers=2, persistent_workers=True)
    for _ in range(2):
        for batch in dl:
            check(batch, ds)
    assert len(refs) == 24 and len({(r.dev, r.ino) for r in refs}) == 2
    assert sum(r.dup is not None for r in refs) == 2  # one per worker, over both epochs
    del batch, dl
    gc.collect()


def test_a_receiver_without_the_mapping_opens_the_ring_through_proc(monkeypatch):
    """A batch whose worker sent its descriptor elsewhere (here: the mapping forgotten after the
    first batch) is mapped from /proc/<worker>/fd/<fd>; the batches stay the ordinary ones."""
    counting = CountingAttach(monkeypatch)
    carried = []  # per mapping made: whether the batch carried the descriptor
    real_open = _recycled._Mappings._open

    def opened(ref, owner):
        carried.append(ref.dup is not None)
        return real_open(ref, owner)

    monkeypatch.setattr(_recycled._Mappings, "_open", staticmethod(opened))
    ds = Images(24)
    dl = loader(ds, num_workers=1, persistent_workers=True)
    got = []
    for batch in dl:
        check(batch, ds)
        got.append(batch)
        _recycled._mappings.rings.clear()  # the next batch finds no mapping and no descriptor
    plain = list(loader(ds, recycle=False))
    assert len(got) == len(plain) == 6 and counting.calls == 6
    assert carried == [True] + [False] * 5  # the first by its descriptor, the rest from /proc
    for (a, la), (b, lb) in zip(got, plain, strict=True):
        assert recycled(a) and torch.equal(a.data, b.data) and torch.equal(la, lb)
    del batch, got, dl
    gc.collect()


def test_a_ring_that_cannot_be_found_is_an_error_that_says_why(tmp_path):
    # no such descriptor in the owner
    ref = _recycled.RingRef(0, 0, 1 << 20)
    with pytest.raises(RuntimeError, match=r"cannot open it through /proc .*recycle=False"):
        _recycled.receive(ref, 0, 0, 16, os.getpid())
    # a descriptor that is another file now
    with open(tmp_path / "other", "wb") as f:
        ref = _recycled.RingRef(0, 0, f.fileno())
        with pytest.raises(RuntimeError, match=rf"descriptor {f.fileno()} is no longer the shared"):
            _recycled.receive(ref, 0, 0, 16, os.getpid())


def in_a_kept_ring(t: torch.Tensor) -> bool:
    """Whether ``t`` views one of the worker rings this process keeps mapped."""
    return any(
        ring.data_address <= t.data_ptr() < ring.data_address + ring.capacity
        for ring, _ in _recycled._mappings.rings.values()
    )


def test_labels_cross_in_the_images_region_and_kept_hold_none_of_it():
    """The labels go in the images' region (no shared-memory file of their own), and arrive as
    copies of their own: an evaluation loop keeping every batch's labels holds no batch's
    images. (A view would keep each region from going back to the worker.)"""
    side = 150  # 4 images of 150 x 151 x 3: 272 KB a batch, past SMALL_FIELD_BYTES
    ds = Stats(120, side=side)
    kept = []
    for images, stats in loader(ds, num_workers=1):
        assert in_a_kept_ring(images.data) and not images.data.is_shared()
        assert not any(in_a_kept_ring(s) or s.is_shared() for s in stats)
        kept.append(stats)
    del images
    allocations, high_water = kept[-1]
    assert len(kept) == 30 and int(allocations[-1]) == 29
    # every batch's region went back although its labels are all kept
    assert 0 < int(high_water[-1]) <= 4 * (4 * side * (side + 1) * 3 + 512)


class Transformed(Dataset):
    def __init__(self, n=24):
        self.images = Images(n, size=(40, 90))

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image, label = self.images[i]
        return {"image": image.permute(2, 0, 1), "label": label, "name": f"im{i}"}


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_transform_in_the_workers_writes_straight_into_their_memory(context):
    """ImageCollate(transform=...) in an ordinary DataLoader: the fused kernel writes the batch
    into the worker's recycled memory, the same values as the ordinary path (a fresh
    shared-memory file of the output, per batch) with the same worker seeds."""
    t = torchfeed.RandomResizedCropFlipNormalize(96, mean=[0.5] * 3, std=[0.25] * 3)
    batches, where = {}, []  # 4 x 3 x 96 x 96 float32: 442 KB, past SMALL_FIELD_BYTES
    for recycle in (True, False):
        torch.manual_seed(0)  # the workers' seeds
        collate = ImageCollate("image", transform=t, recycle=recycle)
        dl = DataLoader(Transformed(), batch_size=4, num_workers=2, collate_fn=collate,
                        multiprocessing_context=context)  # fmt: skip
        batches[recycle] = []
        for batch in dl:  # looked at while the workers live
            where.append((in_a_kept_ring(batch["image"]), batch["image"].is_shared()))
            batches[recycle].append(batch)
    assert where == [(True, False)] * 6 + [(False, True)] * 6
    for ours, plain in zip(batches[True], batches[False], strict=True):
        assert ours["image"].shape == (4, 3, 96, 96) and ours["name"] == plain["name"]
        assert torch.equal(ours["image"], plain["image"])
        assert torch.equal(ours["label"], plain["label"]) and not ours["label"].is_shared()
