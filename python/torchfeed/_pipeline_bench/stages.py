"""Where the time goes: milliseconds per batch of each stage, measured one at a time."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset, default_collate

from torchfeed._pil import decode_rgb, read_bytes
from torchfeed._pipeline_bench.agreement import decodable
from torchfeed._pipeline_bench.image_pipelines import (
    MEAN,
    SIZE,
    STD,
    fused_transform,
    torchvision_transform,
)
from torchfeed.collate import ImageCollate
from torchfeed.decode import DecodeRandomCrop, decode_image
from torchfeed.images import RaggedImages
from torchfeed.loaders import loader as zc_loader
from torchfeed.memory import PinnedRing, SharedRing
from torchfeed.transforms import ResizeRandomFlipNormalize

__all__ = ["stage_breakdown"]


_COLUMNS = ("baseline_ms", "torchfeed_ms", "zero_copy_ms", "window_ms", "scaled_ms")


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class _Samples(Dataset):
    """Hands out the same decoded samples again and again: through a 1-worker DataLoader with
    the pipeline's own collate, the main process then waits for collate + worker-to-main
    transfer only (the worker allocates the batch in shared memory, as in the real run)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return self.samples[i % len(self.samples)]


def _collate_transfer_ms(
    samples, collate, batch_size: int, repeat: int, zero_copy: bool = False
) -> float:
    dl = zc_loader(
        _Samples(samples),
        zero_copy=zero_copy,
        batch_size=batch_size,
        num_workers=1,
        collate_fn=collate,
        prefetch_factor=1,
    )
    it = iter(dl)
    next(it)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = next(it)
        times.append(time.perf_counter() - start)
        del out
    del it
    return statistics.median(times) * 1e3


def stage_breakdown(
    files: Sequence[Path], batch_size: int, device: torch.device, repeat: int = 5
) -> list[dict[str, Any]]:
    """Milliseconds per batch for each stage, measured one at a time in this process (the
    transfer through a real 1-worker DataLoader): what bounds each pipeline."""
    readable = decodable(files, batch_size)
    files = [f for f, _, _ in readable]
    decoded = [image for _, _, image in readable]
    tv = torchvision_transform()
    fused = fused_transform()
    transformed = [tv(i) for i in decoded]
    float_batch = torch.stack(transformed)
    ragged = RaggedImages.from_images(decoded)
    read_decode = _median_ms(lambda: [decode_rgb(read_bytes(f)) for f in files], repeat)
    read_ours = _median_ms(lambda: [decode_image(read_bytes(f)) for f in files], repeat)
    crop_decode = DecodeRandomCrop(generator=torch.Generator().manual_seed(0))  # windows only
    read_window = _median_ms(lambda: [crop_decode(read_bytes(f)) for f in files], repeat)
    windows: list[torch.Tensor] = [crop_decode(read_bytes(f)) for f in files]  # type: ignore[misc]
    ragged_windows = RaggedImages.from_images(windows)
    scaled_decode = DecodeRandomCrop(size=SIZE, generator=torch.Generator().manual_seed(0))
    read_scaled = _median_ms(lambda: [scaled_decode(read_bytes(f)) for f in files], repeat)
    scaled: list[torch.Tensor] = [scaled_decode(read_bytes(f)) for f in files]  # type: ignore[misc]
    # the floor of decoding: every file whole at 1/8 scale (libjpeg-turbo's smallest IDCT; about
    # the cost of reading the entropy-coded data once)
    floor = _median_ms(lambda: [decode_rgb(read_bytes(f), reduce=8) for f in files], repeat)
    ragged_scaled = RaggedImages.from_images(scaled)
    resize = ResizeRandomFlipNormalize(SIZE, mean=MEAN, std=STD)
    fused_ms = _median_ms(lambda: fused(ragged), repeat)
    images_with_labels = [(d, 0) for d in decoded]
    rows = [
        {
            "stage": "read + decode (workers)",
            "baseline_ms": read_decode,
            "torchfeed_ms": read_ours,
            "zero_copy_ms": read_ours,
            "window_ms": read_window,
            "scaled_ms": read_scaled,
        },
        {
            "stage": "  floor: whole files at 1/8 scale",
            **dict.fromkeys(_COLUMNS, floor),
        },
        {
            "stage": "transform (baseline: in workers)",
            "baseline_ms": _median_ms(lambda: [tv(i) for i in decoded], repeat),
            "torchfeed_ms": fused_ms,
            "zero_copy_ms": fused_ms,
            "window_ms": _median_ms(lambda: resize(ragged_windows), repeat),
            "scaled_ms": _median_ms(lambda: resize(ragged_scaled), repeat),
        },
        {
            "stage": "collate + worker -> main transfer",
            "baseline_ms": _collate_transfer_ms(  # named: torchfeed.loader's own recycles
                [(t, 0) for t in transformed], default_collate, len(files), repeat
            ),
            "torchfeed_ms": _collate_transfer_ms(
                images_with_labels, ImageCollate(0), len(files), repeat
            ),
            "zero_copy_ms": _collate_transfer_ms(
                images_with_labels, ImageCollate(0), len(files), repeat, zero_copy=True
            ),
            "window_ms": _collate_transfer_ms(
                [(w, 0) for w in windows], ImageCollate(0), len(files), repeat, zero_copy=True
            ),
            "scaled_ms": _collate_transfer_ms(
                [(w, 0) for w in scaled], ImageCollate(0), len(files), repeat, zero_copy=True
            ),
        },
    ]
    if device.type == "cuda":
        # sized from what it stages, the decoded images (a batch of large photos is larger
        # than its float output: the 2026-12-04 H200 run's --large bench failed on 54 MB)
        ring = PinnedRing(max(4 * ragged.data.nbytes, 1 << 20))

        def pinned_copy():
            float_batch.pin_memory().to(device, non_blocking=True)
            torch.cuda.synchronize()

        def ring_copy():
            ring.to_device(ring.stage(ragged), device)
            torch.cuda.synchronize()

        shared = SharedRing(4 * ragged.data.nbytes)

        def registered_copy(batch):  # straight from the page-locked shared memory
            registered = shared.unpack(shared.pack(batch))  # as the workers leave a batch

            def copy():
                registered.data.to(device, non_blocking=True)
                torch.cuda.synchronize()

            return _median_ms(copy, repeat)

        rows.append(
            {
                "stage": "host -> device",
                "baseline_ms": _median_ms(pinned_copy, repeat),
                "torchfeed_ms": _median_ms(ring_copy, repeat),
                "zero_copy_ms": registered_copy(ragged),
                "window_ms": registered_copy(ragged_windows),
                "scaled_ms": registered_copy(ragged_scaled),
            }
        )
    else:
        rows.append({"stage": "host -> device"})
    rows.append(
        {
            "stage": "MB per batch, worker -> main",
            "baseline_ms": float_batch.nbytes / 1e6,
            "torchfeed_ms": ragged.data.nbytes / 1e6,
            "zero_copy_ms": ragged.data.nbytes / 1e6,
            "window_ms": ragged_windows.data.nbytes / 1e6,
            "scaled_ms": ragged_scaled.data.nbytes / 1e6,
        }
    )
    return rows
