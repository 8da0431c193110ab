"""PinnedRing: allocation invariants under a CPU fence the test controls (dropping the tensors),
wrap-around, blocking and timeouts, concurrency, staging, memory; CUDA fences on a GPU."""

from __future__ import annotations

import itertools
import random
import threading
import time

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import torchfeed
from torchfeed import PinnedRing, RaggedBatch, RaggedImages


def offsets_of(ring: PinnedRing, tensors) -> list[int]:
    return [t.data_ptr() - ring._base for t in tensors]


def test_exact_aligned_sizes_and_stats():
    ring = PinnedRing(10_000, alignment=256, pinned=False)
    a, b, c = ring.allocate(1), ring.allocate(256), ring.allocate(1000)
    assert [t.numel() for t in (a, b, c)] == [1, 256, 1000]
    assert offsets_of(ring, (a, b, c)) == [0, 256, 512]  # no power-of-two rounding
    assert ring._base % 4096 == 0  # page-aligned arena
    s = ring.stats()
    assert s["bytes_in_use"] == 256 + 256 + 1024 and s["blocks_in_flight"] == 3
    assert s["allocations"] == 3 and s["high_water"] == 1536 and s["capacity"] == 10_000
    assert [blk[2] for blk in ring.blocks()] == [256, 256, 1024]


def test_fifo_wraps_around_and_waits_for_the_oldest():
    ring = PinnedRing(1024, alignment=128, pinned=False)
    a, b, c = ring.allocate(300), ring.allocate(300), ring.allocate(100)  # 384 + 384 + 128
    assert offsets_of(ring, (a, b, c)) == [0, 384, 768]
    with pytest.raises(TimeoutError):
        ring.allocate(200, timeout=0.05)  # 128 bytes left at the end, none at the start
    del b  # released, but not the oldest: FIFO keeps its bytes until a goes
    with pytest.raises(TimeoutError):
        ring.allocate(200, timeout=0.05)
    del a
    d = ring.allocate(200)  # the end is too short: wraps to offset 0
    assert offsets_of(ring, (c, d)) == [768, 0]
    e = ring.allocate(500)  # between d's end (256) and c (768)
    assert offsets_of(ring, (e,)) == [256]
    with pytest.raises(
        TimeoutError, match=r"the oldest block \(128 bytes\) is still held by its consumer"
    ):
        ring.allocate(10, timeout=0.05)


def test_full_ring_blocks_until_release():
    ring = PinnedRing(1000, alignment=8, pinned=False)
    held = [ring.allocate(496), ring.allocate(496)]  # 992 of 1000 bytes
    start = time.perf_counter()
    timer = threading.Timer(0.2, held.pop, args=(0,))
    timer.start()
    got = ring.allocate(400, timeout=5.0)  # waits for the timer's release
    waited = time.perf_counter() - start
    assert got.data_ptr() == ring._base and waited >= 0.15
    s = ring.stats()
    assert s["waits"] == 1 and s["wait_seconds"] >= 0.15


def test_timeout_message_names_capacity_in_flight_and_request():
    ring = PinnedRing(4096, alignment=256, pinned=False)
    held = ring.allocate(3000)  # noqa: F841
    with pytest.raises(
        TimeoutError,
        match=r"capacity 4096 bytes, 3072 bytes in flight in 1 block\(s\), request 2000 bytes",
    ):
        ring.allocate(2000, timeout=0.05)


def test_oversize_request_fails_at_once():
    ring = PinnedRing(4096, pinned=False)
    start = time.perf_counter()
    with pytest.raises(
        ValueError, match="a request of 5000 bytes is larger than the ring's capacity of 4096 bytes"
    ):
        ring.allocate(5000, timeout=10)
    assert time.perf_counter() - start < 1


def test_views_keep_the_block_held():
    ring = PinnedRing(1024, alignment=256, pinned=False)
    block = ring.allocate(1024)
    view = block[10:20].view(torch.int16)
    del block
    assert ring.stats()["blocks_in_flight"] == 1  # a view still sees it
    del view
    assert ring.stats()["blocks_in_flight"] == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(capacity=0), ValueError, "capacity must be > 0 bytes"),
        (dict(capacity=1024, alignment=3), ValueError, "alignment must be a power of two"),
        (dict(capacity=1024, alignment=8192), ValueError, "alignment must be a power of two"),
        (dict(capacity=1.5), TypeError, "capacity must be an int"),
        (dict(capacity=1024, timeout=0), ValueError, "timeout must be > 0"),
    ],
)
def test_bad_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        PinnedRing(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_pinned_true_without_gpu():
    with pytest.raises(ValueError, match="pinned=True needs"):
        PinnedRing(1024, pinned=True)


def test_mlock_or_a_clear_error():
    try:
        ring = PinnedRing(1 << 16, pinned=False, mlock=True)
    except RuntimeError as e:
        assert "mlock of 65536 bytes failed" in str(e) and "RLIMIT_MEMLOCK" in str(e)
    else:
        assert ring.allocate(100).numel() == 100


def test_negative_request():
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        PinnedRing(1024, pinned=False).allocate(-1)


def test_close():
    ring = PinnedRing(1024, pinned=False)
    t = ring.allocate(16)
    t.fill_(7)
    ring.close()
    assert ring.closed
    assert int(t.sum()) == 7 * 16  # the arena stays while a view is alive
    with pytest.raises(RuntimeError, match="the ring is closed"):
        ring.allocate(16)
    with PinnedRing(1024, pinned=False) as r2:
        r2.allocate(8)
    assert r2.closed


class RingMachine(RuleBasedStateMachine):
    """Random allocations and releases: no handed-out block ever overlaps a held one, every held
    block keeps its bytes, and the statistics add up."""

    def __init__(self) -> None:
        super().__init__()
        self.ring = PinnedRing(4096, alignment=64, pinned=False)
        self.held: list[tuple[torch.Tensor, int]] = []
        self.next_pattern = 1

    @rule(nbytes=st.integers(0, 2000))
    def allocate(self, nbytes):
        try:
            t = self.ring.allocate(nbytes, timeout=0.001)
        except TimeoutError:
            # only when the live blocks (FIFO) really leave no contiguous room
            assert self.ring.stats()["blocks_in_flight"] > 0
            return
        pattern = self.next_pattern % 251 + 1
        self.next_pattern += 1
        t.fill_(pattern)
        self.held.append((t, pattern))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def release(self, data):
        i = data.draw(st.integers(0, len(self.held) - 1))
        self.held.pop(i)

    @invariant()
    def held_blocks_intact_and_disjoint(self):
        spans = []
        for t, pattern in self.held:
            if t.numel():
                assert bool((t == pattern).all()), "a held block was overwritten"
                spans.append((t.data_ptr(), t.data_ptr() + t.numel()))
        spans.sort()
        for (_, a1), (b0, _) in itertools.pairwise(spans):
            assert a1 <= b0, "two held blocks overlap"

    @invariant()
    def stats_add_up(self):
        s = self.ring.stats()
        blocks = self.ring.blocks()
        # zero-byte requests hold no block
        assert s["blocks_in_flight"] == len(blocks) >= sum(t.numel() > 0 for t, _ in self.held)
        assert s["bytes_in_use"] == sum(b[2] for b in blocks) <= s["capacity"]
        assert all(b[1] % 64 == 0 and b[1] + b[2] <= 4096 for b in blocks)
        assert s["high_water"] >= s["bytes_in_use"]


TestRingStateMachine = RingMachine.TestCase
TestRingStateMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


def test_concurrent_producer_and_consumer():
    ring = PinnedRing(1 << 16, alignment=64, pinned=False, timeout=10)
    handoff: list = []
    cond = threading.Condition()
    n_blocks = 3000
    errors = []

    def produce():
        rng = random.Random(0)
        for i in range(n_blocks):
            t = ring.allocate(rng.randint(1, 5000))
            t.fill_(i % 256)
            with cond:
                handoff.append((t, i % 256))
                cond.notify()
            del t

    def consume():
        rng = random.Random(1)
        got = 0
        while got < n_blocks:
            with cond:
                while not handoff:
                    cond.wait()
                t, pattern = handoff.pop(0)
            if rng.random() < 0.1:
                time.sleep(0.0005)
            if not bool((t == pattern).all()):
                errors.append(got)
            del t
            got += 1

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors
    assert ring.stats()["allocations"] == n_blocks
    assert ring.stats()["blocks_in_flight"] == 0


def test_stage_copies_a_nested_batch_into_one_block():
    ring = PinnedRing(1 << 20, pinned=False)
    batch = {
        "x": torch.randn(4, 5),
        "mask": torch.tensor([True, False]),
        "half": torch.randn(3).half(),
        "t": torch.arange(12).view(3, 4).t(),  # non-contiguous source
        "seq": RaggedBatch.from_sequences([torch.arange(3), torch.arange(5)]),
        "img": RaggedImages.from_images([torch.zeros(3, 2, 2, dtype=torch.uint8)]),
        "pad": torchfeed.pad([torch.arange(2), torch.arange(3)]),
        "meta": ["a", 1],
        "scalar": torch.tensor(3.5),
    }
    staged = ring.stage(batch)
    assert ring.stats()["blocks_in_flight"] == 1
    assert torch.equal(staged["x"], batch["x"]) and torch.equal(staged["t"], batch["t"])
    assert staged["half"].dtype == torch.float16 and torch.equal(staged["mask"], batch["mask"])
    assert staged["seq"].host_lengths == (3, 5) and torch.equal(
        staged["seq"].values, batch["seq"].values
    )
    assert isinstance(staged["pad"], torchfeed.Padded) and staged["meta"] == ["a", 1]
    assert float(staged["scalar"]) == 3.5
    for t in [
        staged["x"],
        staged["t"],
        staged["seq"].values,
        staged["img"].data,
        staged["pad"].mask,
    ]:
        assert ring.contains(t)
    del staged, t
    assert ring.stats()["blocks_in_flight"] == 0


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def test_rss_flat_over_10000_cycles():
    ring = PinnedRing(8 << 20, pinned=False)
    batch = {
        "images": torch.randint(0, 255, (8, 3, 64, 64), dtype=torch.uint8),
        "labels": torch.arange(8),
    }
    for _ in range(200):  # warm up: the arena's pages and the allocator's caches
        ring.stage(batch)
    before = _rss_kib()
    for _ in range(10_000):
        staged = ring.stage(batch)
        del staged
    after = _rss_kib()
    assert after - before < 4096, f"RSS grew by {after - before} KiB"
    assert ring.stats()["blocks_in_flight"] == 0


@pytest.mark.cuda
def test_cuda_ring_is_pinned_and_copies_correctly():
    ring = PinnedRing(1 << 22)
    assert ring.pinned
    batch = {"x": torch.randn(64, 100), "y": torch.arange(7)}
    staged = ring.stage(batch)
    assert staged["x"].is_pinned()
    out = ring.to_device(staged, "cuda")
    torch.cuda.synchronize()
    assert torch.equal(out["x"].cpu(), batch["x"]) and torch.equal(out["y"].cpu(), batch["y"])


@pytest.mark.cuda
def test_cuda_block_not_reused_before_its_copy_event():
    ring = PinnedRing(1 << 20, alignment=256)
    side = torch.cuda.Stream()
    src = ring.allocate(1 << 20)
    src.fill_(1)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # holds the copy stream for a while
    device = ring.to_device(src, "cuda", stream=side)  # copy queued behind the sleep
    del src  # the consumer releases the host side at once
    assert ring.blocks()[0][4] == 1  # its copy event is pending
    again = ring.allocate(1 << 20)  # must wait for the event, not reuse the bytes now
    again.fill_(2)
    torch.cuda.synchronize()
    assert int(device.min()) == 1 and int(device.max()) == 1
    assert ring.stats()["waits"] == 1


@pytest.mark.cuda
def test_cuda_close_waits_for_copies():
    ring = PinnedRing(1 << 20)
    src = ring.allocate(1 << 20)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
    ring.to_device(src, "cuda", stream=side)
    del src
    ring.close(timeout=30)
    assert ring.closed


@pytest.mark.parametrize("chunk", [1, 100, 4096, 1 << 20])
def test_stage_and_copy_moves_every_field_in_chunks(chunk):
    """The chunked path's bookkeeping, on the CPU (a CPU target takes a plain copy per chunk):
    every field lands at its offset, strided ones included, whatever the chunk size."""
    from torchfeed._tree import field_layout

    g = torch.Generator().manual_seed(0)
    fields = [
        torch.randint(0, 255, (1000,), dtype=torch.uint8, generator=g),
        torch.randn(33, 17, generator=g).t(),  # strided: staged whole
        torch.randn(257, generator=g).double(),
        torch.randint(-5, 5, (64, 3), generator=g),
    ]
    ring = PinnedRing(1 << 20, pinned=False)
    offsets, total = field_layout(fields)
    block = ring.allocate(total)
    target = torch.zeros(total, dtype=torch.uint8)
    chunks = ring._ring.stage_and_copy(
        fields, [offsets[id(f)] for f in fields], block, target, 0, chunk
    )
    assert chunks == -(-total // chunk)
    for f in fields:
        got = target[offsets[id(f)] : offsets[id(f)] + f.nbytes].view(f.dtype).view(f.shape)
        assert torch.equal(got, f)


def test_stage_and_copy_refuses_what_does_not_fit():
    ring = PinnedRing(1 << 16, pinned=False)
    block = ring.allocate(128)
    with pytest.raises(ValueError, match=r"sources\[0\] .* does not fit the block of 128 bytes"):
        ring._ring.stage_and_copy(
            [torch.zeros(40)], [0], block, torch.zeros(128, dtype=torch.uint8), 0, 64
        )
    with pytest.raises(ValueError, match="target must be a contiguous uint8 tensor of 128 bytes"):
        ring._ring.stage_and_copy([], [], block, torch.zeros(100, dtype=torch.uint8), 0, 64)
    with pytest.raises(ValueError, match="chunk_bytes must be >= 1"):
        ring._ring.stage_and_copy([], [], block, torch.zeros(128, dtype=torch.uint8), 0, 0)


@pytest.mark.cuda
def test_copy_to_device_in_chunks_matches_and_fences_once():
    ring = PinnedRing(1 << 26)
    batch = {"x": torch.randn(64, 3, 224, 224), "y": torch.arange(64), "z": torch.randn(5, 3).t()}
    out = ring.copy_to_device(batch, "cuda", chunk_bytes=1 << 20)
    torch.cuda.synchronize()
    for k in batch:
        assert out[k].is_cuda and torch.equal(out[k].cpu(), batch[k])
    deadline = time.time() + 5
    while ring.stats()["blocks_in_flight"] and time.time() < deadline:
        time.sleep(0.01)  # the fence fires from the stream
    assert ring.stats()["blocks_in_flight"] == 0 and ring.stats()["allocations"] == 1


@pytest.mark.cuda
def test_one_arena_per_device_for_every_prefetcher():
    a = PinnedRing.for_device("cuda", 1 << 20)
    assert PinnedRing.for_device("cuda", 1 << 10) is a  # big enough: the same arena
    b = PinnedRing.for_device("cuda", a.capacity + 1)  # grown once, not per call
    assert b is not a and b.capacity >= 2 * a.capacity
    assert PinnedRing.for_device("cuda", a.capacity + 1) is b
    loader = [{"x": torch.randn(4, 8)} for _ in range(3)]
    rings = []
    for _ in range(3):  # a prefetcher made per epoch
        p = torchfeed.DevicePrefetcher(loader, "cuda")
        list(p)
        rings.append(p.pinned_ring)
    assert rings[0] is rings[1] is rings[2]
