"""Hostile and edge-case inputs (issue 14), class by class: no crash, no hang, no silent wrong
result, no unbounded allocation; every refusal a Python exception naming the argument."""

from __future__ import annotations

import io
import math
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

import torchfeed
import torchfeed.limits
import torchfeed.ops._jpeg as jpeg_op
import torchfeed.transforms
from torchfeed import PadCollate, PinnedRing
from torchfeed.data import ShardedIterableDataset, SkipCorrupt
from torchfeed.data._distributed import rank_and_world_size
from torchfeed.decode import DecodeRandomCrop, decode_window
from torchfeed.memory import SharedRing
from torchfeed.sampling import sample_resized_crop_params

from jpeg_cases import full_decode, sends_every_bit

needs_window_decoder = pytest.mark.skipif(not jpeg_op.window_decoder(), reason="no libjpeg-turbo")


def jpeg(h=40, w=56, seed=0, **options) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(3 * x + y) % 256, (5 * y) % 256, (x * y // 7) % 256], -1)
    rgb = (rgb + rng.integers(0, 48, rgb.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90, **options)
    return buf.getvalue()


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def claiming(data: bytes, height: int, width: int) -> bytes:
    """The JPEG with its frame header (SOF0/SOF2) declaring another size."""
    out = bytearray(data)
    i = 2
    while i < len(out):
        marker, length = out[i + 1], int.from_bytes(out[i + 2 : i + 4], "big")
        if marker in (0xC0, 0xC1, 0xC2):
            out[i + 5 : i + 7] = height.to_bytes(2, "big")
            out[i + 7 : i + 9] = width.to_bytes(2, "big")
            return bytes(out)
        i += 2 + length
    raise AssertionError("no frame header")


BIG = [2**63 - 1, 2**63 - 4, 2**63 - 10, 2**62, 2**31, -(2**63), -1]


@needs_window_decoder
@pytest.mark.parametrize(
    "box",
    [
        (0, 2**63 - 4, 8, 8),
        (2**63 - 10, 0, 20, 8),
        (0, 0, 2**62, 2**62),
        (-1, 0, 4, 4),
        (0, 0, 0, 4),
        (39, 55, 2, 2),
    ],
)
def test_window_boxes_that_overflow_are_refused(box):
    with pytest.raises(ValueError, match="must lie inside the 40 x 56 image|must be >= 1"):
        torch.ops.torchfeed.decode_jpeg_window(as_tensor(jpeg()), *box)


@needs_window_decoder
@settings(max_examples=150, deadline=None)
@given(box=st.tuples(*[st.sampled_from([*BIG, 0, 1, 3, 39, 40, 56]) | st.integers(-5, 80)] * 4))
def test_random_window_boxes_never_crash(box):
    data = as_tensor(jpeg())
    top, left, h, w = box
    inside = top >= 0 and left >= 0 and h >= 1 and w >= 1 and top + h <= 40 and left + w <= 56
    try:
        out = torch.ops.torchfeed.decode_jpeg_window(data, *box)
    except ValueError:
        assert not inside
    else:
        assert inside and out.shape == (3, h, w)


@settings(max_examples=150, deadline=None)
@given(nbytes=st.sampled_from(BIG) | st.integers(-10, 10_000))
def test_ring_requests_near_the_int64_limit_are_refused(nbytes):
    ring = PinnedRing(4096, pinned=False)
    try:
        block = ring.allocate(nbytes, timeout=0.01)
    except ValueError as e:
        assert nbytes < 0 or nbytes > 4096, e
    except TimeoutError:
        raise AssertionError("an empty ring timed out") from None
    else:
        assert 0 <= nbytes <= 4096 and block.numel() == nbytes


def test_shared_ring_requests_near_the_int64_limit_are_refused():
    ring = SharedRing(1 << 16)
    for nbytes in BIG:
        with pytest.raises(ValueError):
            ring._ring.acquire(nbytes, 0.01)
    with pytest.raises(ValueError, match="no slot"):
        ring._ring.abandon(2**62, 0)
    with pytest.raises(ValueError, match="out of the mapping"):
        ring._ring.region(2**63 - 10, 100)


@pytest.mark.parametrize("timeout", [math.inf, math.nan, 0, -1.0, -math.inf])
def test_timeouts_that_are_not_finite_positive_are_refused(timeout):
    for make in (
        lambda: PinnedRing(4096, timeout=timeout),
        lambda: SharedRing(4096, timeout=timeout),
    ):
        with pytest.raises(ValueError, match="timeout must be > 0 seconds and finite, or None"):
            make()
    with pytest.raises(ValueError, match="timeout must be > 0 seconds and finite, or None"):
        PinnedRing(4096, pinned=False).allocate(10, timeout=timeout)
    with pytest.raises(ValueError, match="ring_timeout must be > 0"):
        torchfeed.loader(
            list(range(8)), zero_copy=True, collate_fn=PadCollate(), ring_timeout=timeout
        )


def test_no_timeout_waits_until_space_is_freed():
    """timeout=None waits without limit, and truly wakes when a block is freed (issue 14: an
    infinite timeout never woke)."""
    import threading

    ring = PinnedRing(4096, pinned=False, timeout=None)
    held = ring.allocate(4096)
    got = []
    waiter = threading.Thread(target=lambda: got.append(ring.allocate(4096)))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got  # waiting
    del held
    waiter.join(5)
    assert not waiter.is_alive() and got[0].numel() == 4096


def test_shared_ring_without_timeout_wakes_when_space_is_freed(ring_views):
    import threading

    ring = SharedRing(4096, timeout=None)
    first = ring.pack({"x": torch.zeros(3000, dtype=torch.uint8)})
    held = ring.unpack(first)
    got = []
    waiter = threading.Thread(
        target=lambda: got.append(ring.pack({"x": torch.ones(3000, dtype=torch.uint8)}))
    )
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()
    del held
    waiter.join(5)
    assert not waiter.is_alive() and torch.equal(
        ring.unpack(got[0])["x"], torch.ones(3000, dtype=torch.uint8)
    )


@settings(max_examples=40, deadline=None)
@given(timeout=st.floats(allow_nan=True, allow_infinity=True) | st.none() | st.integers(-5, 5))
def test_random_timeouts(timeout):
    ok = timeout is None or (math.isfinite(timeout) and timeout > 0)
    try:
        ring = PinnedRing(64, pinned=False, timeout=timeout)
    except ValueError:
        assert not ok
        return
    assert ok
    held = ring.allocate(64)
    if timeout is not None and timeout <= 0.05:
        with pytest.raises(TimeoutError):
            ring.allocate(64)
    del held


class Flaky(Dataset):
    def __init__(self, n, bad=()):
        self.n, self.bad = n, set(bad)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i in self.bad:
            raise OSError(f"corrupt {i}")
        return i


def test_skip_corrupt_ends_iteration_and_refuses_out_of_range():
    ds = SkipCorrupt(Flaky(5, bad=[2]))
    assert list(ds) == [0, 1, 3, 3, 4]
    with pytest.raises(IndexError, match="index 100 out of range for a dataset of 5 samples"):
        ds[100]
    assert ds[-1] == 4
    with pytest.raises(IndexError, match="out of range for a dataset of 0 samples"):
        SkipCorrupt(Flaky(0))[0]
    with pytest.raises(TypeError, match="index must be an int"):
        ds["a"]


def test_skip_corrupt_when_every_sample_is_corrupt_raises_instead_of_recursing():
    with pytest.raises(RuntimeError, match="sample 0 and the 3 after it all failed"):
        SkipCorrupt(Flaky(4, bad=range(4)), max_retries=3)[0]


def test_pad_value_that_overflows_the_dtype_is_refused():
    seqs = [torch.ones(3, dtype=torch.float16), torch.ones(1, dtype=torch.float16)]
    with pytest.raises(ValueError, match=r"pad_value=1000000.0 overflows torch.float16"):
        torchfeed.pad(seqs, pad_value=1e6)
    with pytest.raises(ValueError, match="not representable in torch.int8"):
        torchfeed.pad([torch.ones(2, dtype=torch.int8)], pad_value=300)
    out = torchfeed.pad(seqs, pad_value=float("-inf"))  # asked for: kept
    assert out.padded[1, 1:].isneginf().all()


def test_pad_of_tensors_on_two_devices_is_refused():
    with pytest.raises(ValueError, match=r"sequences\[1\] is on meta but sequences\[0\] is on cpu"):
        torchfeed.pad([torch.ones(2), torch.empty(2, device="meta")])


@pytest.mark.parametrize("packed", [False, True])
def test_pad_propagates_gradients_like_pad_sequence(packed):
    g = torch.Generator().manual_seed(0)
    seqs = [
        torch.randn(n, 3, dtype=torch.float64, generator=g, requires_grad=True) for n in (4, 1, 6)
    ]
    weights = torch.randn(3, 8, 3, dtype=torch.float64, generator=g)
    if packed:
        rb = torchfeed.RaggedBatch.from_sequences(seqs)
        out = rb.pad(
            pad_to_multiple_of=8, max_length=5, truncation_side="left", padding_side="left"
        )
    else:
        out = torchfeed.pad(
            seqs, pad_to_multiple_of=8, max_length=5, truncation_side="left", padding_side="left"
        )
    (out.padded * weights).sum().backward()
    ours = [s.grad.clone() for s in seqs]
    for s in seqs:
        s.grad = None
    # the same computation with pad_sequence on the truncated sequences, padded on the left
    kept = [s[-5:] for s in seqs]
    ref = pad_sequence([k.flip(0) for k in kept], batch_first=True).flip(1)
    ref = torch.cat([ref.new_zeros(3, 8 - ref.shape[1], 3), ref], dim=1)
    assert torch.equal(ref.detach(), out.padded.detach())
    (ref * weights).sum().backward()
    for a, s in zip(ours, seqs, strict=True):
        assert torch.equal(a, s.grad)


def test_mixed_field_kinds_are_refused_in_either_order():
    collate = PadCollate()
    for values in ([None, torch.ones(2)], [torch.ones(2), None], [1, "a"], ["a", 1]):
        with pytest.raises(TypeError, match="field 'f' is a .* in sample 0 but a .* in sample 1"):
            collate([{"f": values[0]}, {"f": values[1]}])
    assert collate([{"f": None}, {"f": None}])["f"] == [None, None]  # one kind: kept as a list


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 CPUs
def test_sharding_that_would_silently_read_nothing_is_refused(monkeypatch):
    ds = ShardedIterableDataset([10, 20], mode="sample", uneven="drop")
    loader = torch.utils.data.DataLoader(ds, num_workers=3, batch_size=None)
    with pytest.raises(ValueError, match="every consumer would read nothing"):
        list(loader)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="RANK=3 and WORLD_SIZE=2"):
        list(ShardedIterableDataset([10, 20, 30], mode="sample"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE=0"):
        rank_and_world_size()


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    uneven=st.sampled_from(["drop", "pad"]),
)
def test_random_sharding_configurations(n, world, workers, uneven):
    """Every consumer's share, put together: exactly-once over what is kept, never silently
    empty, equal counts (drop leaves out at most consumers - 1; pad repeats at most that)."""
    from torchfeed.data._plan import split_for_consumer

    consumers = world * workers
    shares = [split_for_consumer(list(range(n)), c, consumers, uneven) for c in range(consumers)]
    flat = [i for s in shares for i in s]
    assert len({len(s) for s in shares}) == 1
    if uneven == "drop":
        assert len(flat) == len(set(flat)) == n - n % consumers
    else:
        assert set(flat) == set(range(n)) and len(flat) - n < consumers


def pil_decode(data: bytes) -> torch.Tensor | None:
    """A tolerant full decode (Pillow with truncated images allowed): what the pixels of a
    damaged file are where its data is intact."""
    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        with Image.open(io.BytesIO(data)) as im:
            return torch.from_numpy(np.asarray(im.convert("RGB")).copy()).permute(2, 0, 1)
    except Exception:
        return None
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False


def mutate(data: bytes, rng: random.Random) -> bytes:
    d = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        i = rng.randrange(len(d))
        if kind < 0.6:
            d[i] = rng.randrange(256)
        elif kind < 0.8:
            del d[i : i + rng.randint(1, 16)]
        else:
            d[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(d)


@needs_window_decoder
@pytest.mark.parametrize("options", [{}, {"progressive": True}, {"subsampling": 0}])
def test_mutated_jpegs_give_an_error_or_the_true_pixels(options):
    """Random byte mutations: a window is returned only when every row of it decoded cleanly.
    Then it equals Pillow's whole-image decode (with truncation tolerated where Pillow refuses
    the file: the mutation did not reach the window). The case of issue 14 (a decoder rejects
    the file, we returned thousands of corrupted pixels) cannot happen.

    A mutation can leave a valid progressive file whose scans stop short of some coefficients'
    last bits (an EOI where a marker was, or a scan header's Ss, Se or Al changed). libjpeg estimates the missing terms (block smoothing), and
    this machine's libjpeg-turbo (the one the extension links) and Pillow's own estimate
    differently (by up to 11 levels), so for such a file the reference is the whole image
    decoded by the extension's libjpeg: still every window a slice of it."""
    # a seed that does not depend on PYTHONHASHSEED (hash() of a string is salted per process)
    rng = random.Random(repr(sorted(options.items())))
    base = jpeg(64, 80, seed=3, **options)
    returned = refused = 0
    for _ in range(300):
        data = mutate(base, rng)
        box = (rng.randrange(0, 40), rng.randrange(0, 50), 20, 25)
        try:
            window = decode_window(data, box)
        except (RuntimeError, ValueError):
            refused += 1
            continue
        returned += 1
        top, left, h, w = box
        if sends_every_bit(data):
            try:
                full = full_decode(data)
            except RuntimeError:
                full = pil_decode(data)  # Pillow refuses: compare with it tolerating truncation
        else:
            with Image.open(io.BytesIO(data)) as im:
                full = decode_window(data, (0, 0, im.height, im.width))
        assert full is not None
        assert torch.equal(window, full[:, top : top + h, left : left + w])
    assert returned > 0 and refused > 0


@needs_window_decoder
def test_a_corrupt_marker_inside_the_window_is_an_error():
    data = bytearray(jpeg(64, 80, seed=4))
    scan = data.index(b"\xff\xda") + 40  # inside the entropy-coded data, near its start
    data[scan : scan + 2] = b"\xff\x13"  # an unknown marker: libjpeg warns, torchvision rejects
    with pytest.raises(RuntimeError, match="Corrupt JPEG data"):
        decode_window(bytes(data), (0, 0, 64, 80))


@needs_window_decoder
@pytest.mark.parametrize("options", [{}, {"progressive": True}])
def test_a_jpeg_claiming_a_huge_size_is_refused_before_allocating(options):
    data = claiming(jpeg(16, 16, **options), 65500, 65500)
    with pytest.raises(
        torchfeed.limits.ImageTooLargeError, match="65500 x 65500 = 4290250000 pixels"
    ):
        DecodeRandomCrop()(data)
    with pytest.raises(ValueError, match="the limit of 89478485"):
        decode_window(data, (0, 0, 8, 8))
    with pytest.raises(ValueError, match="declares 65500 x 65500"):
        torch.ops.torchfeed.decode_jpeg_window(as_tensor(data), 0, 0, 8, 8)  # the op's own check


@pytest.mark.parametrize(
    "options", [{}, {"progressive": True}, {"subsampling": 1}, {"optimize": True}]
)
@pytest.mark.parametrize("size", [(1, 1), (40, 56), (17, 300)])
def test_the_frame_header_reader_agrees_with_pillow(options, size):
    data = jpeg(*size, **options)
    image = full_decode(data)
    assert jpeg_op.jpeg_frame_size(as_tensor(data)) == tuple(image.shape[1:]) == size
    assert jpeg_op.jpeg_frame_size(as_tensor(claiming(data, 65500, 3))) == (65500, 3)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64), st.integers(0, 600))
def test_the_frame_header_reader_never_fails_on_garbage(noise, cut):
    data = jpeg()
    for candidate in (data[:cut], data[:cut] + noise, b"\xff\xd8\xff" + noise, noise):
        size = jpeg_op.jpeg_frame_size(as_tensor(candidate)) if candidate else None
        assert size is None or all(0 <= n < 2**16 for n in size)


def test_the_pixel_limit_holds_without_the_window_decoder(monkeypatch):
    """The fallback (a build without libjpeg-turbo) reads the size from the frame header too."""
    monkeypatch.setattr(jpeg_op, "_use_window_decoder", False)
    data = claiming(jpeg(16, 16, progressive=True), 65500, 65500)
    with pytest.raises(torchfeed.limits.ImageTooLargeError, match="65500 x 65500"):
        decode_window(data, (0, 0, 8, 8))
    with pytest.raises(torchfeed.limits.ImageTooLargeError, match="65500 x 65500"):
        DecodeRandomCrop()(data)


def test_the_pixel_limit_can_be_changed_and_names_the_setting():
    data = jpeg(40, 56)
    torchfeed.limits.set_max_image_pixels(1000)
    try:
        with pytest.raises(torchfeed.limits.ImageTooLargeError, match="set_max_image_pixels"):
            decode_window(data, (0, 0, 4, 4))
        with pytest.raises(torchfeed.limits.ImageTooLargeError, match=r"size \(40, 40\)"):
            torchfeed.transforms.RandomResizedCropFlipNormalize(40, mean=[0.5], std=[0.5])
    finally:
        torchfeed.limits.set_max_image_pixels(torchfeed.limits.DEFAULT_MAX_IMAGE_PIXELS)
    with pytest.raises(ValueError, match="max_image_pixels must be a positive integer or None"):
        torchfeed.limits.set_max_image_pixels(-5)
    env = dict(os.environ, TORCHFEED_MAX_IMAGE_PIXELS="none")
    result = subprocess.run(
        [sys.executable, "-c", "import torchfeed.limits as l; print(l.max_image_pixels())"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.stdout.strip() == "None"


def test_an_output_size_beyond_the_pixel_limit_is_refused():
    images = [torch.zeros(3, 8, 8, dtype=torch.uint8)]
    with pytest.raises(torchfeed.limits.ImageTooLargeError, match=r"size \(20000, 20000\)"):
        torchfeed.crop_flip_normalize(images, [(0, 0, 8, 8)], None, 20000, mean=[0.5], std=[0.5])


def test_a_ring_larger_than_the_machine_is_refused_at_once():
    with pytest.raises(
        ValueError,
        match=r"capacity 1099511627776 bytes is more than this machine's physical memory \(\d+ bytes\)",
    ):
        SharedRing(2**40)
    with pytest.raises(ValueError, match="more than this machine's physical memory"):
        PinnedRing(2**40, pinned=False)


def test_zero_copy_over_an_iterable_dataset_says_what_it_needs():
    with pytest.raises(TypeError, match="needs ring_capacity=<bytes>"):
        torchfeed.loader(
            ShardedIterableDataset([1, 2], mode="sample"),
            zero_copy=True,
            collate_fn=PadCollate(),
            num_workers=1,
        )


def test_an_empty_image_list_gives_an_empty_batch():
    out = torchfeed.crop_flip_normalize(
        [], torch.zeros(0, 4), None, 8, mean=[0.5] * 3, std=[0.2] * 3
    )
    assert out.shape == (0, 3, 8, 8)


def test_sampler_scales_that_are_nan_are_refused():
    with pytest.raises(ValueError, match="scale values must be >= 0"):
        sample_resized_crop_params([(10, 10)], scale=(float("nan"), float("nan")))


def _without_ipc_lock() -> list[str]:
    """A command prefix that runs a process without CAP_IPC_LOCK, which lets root mlock
    beyond RLIMIT_MEMLOCK (an ordinary user has no such capability)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and util-linux's setpriv is not there to drop CAP_IPC_LOCK")
    return ["setpriv", "--bounding-set=-ipc_lock", "--inh-caps=-ipc_lock"]


def test_mlock_beyond_the_memlock_limit_is_an_error_with_the_numbers():
    # Without CAP_IPC_LOCK (an ordinary user, or root with it dropped), a ring that would lock
    # more than RLIMIT_MEMLOCK is refused before anything is allocated, naming the request and
    # the limit; it never comes back as an unlocked ring.
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_MEMLOCK, (65536, 65536))\n"
        "import torchfeed\n"
        "try:\n    torchfeed.PinnedRing(1 << 20, pinned=False, mlock=True)\n"
        "except (ValueError, RuntimeError) as e:\n    print('refused:', e)\n"
        "else:\n    print('accepted')\n"
    )
    result = subprocess.run(
        [*_without_ipc_lock(), sys.executable, "-c", code], capture_output=True, text=True
    )
    if result.returncode != 0 and result.stderr.startswith("setpriv:"):
        pytest.skip(f"cannot drop CAP_IPC_LOCK here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: PinnedRing: mlock=True needs 1048576 bytes" in result.stdout, result.stdout
    assert "RLIMIT_MEMLOCK (`ulimit -l`) allows 65536 bytes" in result.stdout, result.stdout
