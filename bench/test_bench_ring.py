"""Staging into the pinned ring against a fresh buffer per batch (what DataLoader's pin thread
does, here without the pinning), and, on a GPU, host-to-device bandwidth through the ring against
``pin_memory()`` per batch, a pageable ``.to(device)`` and the peak of one pinned copy.
Goal: 4x on the CPU; on the GPU >= 90% of the peak and ahead of ``pin_memory()`` per batch."""

from __future__ import annotations

import pytest
import torch

import torchfeed
import torchfeed._tree
from torchfeed import PinnedRing

FLOAT_BATCH = (64, 3, 224, 224)


@pytest.fixture(scope="module")
def float_batch():
    return {"images": torch.rand(FLOAT_BATCH), "labels": torch.arange(64)}


@pytest.fixture(scope="module")
def ragged_batch():
    g = torch.Generator().manual_seed(0)
    images = [
        torch.randint(0, 256, (3, int(h), int(w)), generator=g, dtype=torch.uint8)
        for h, w in torch.randint(300, 600, (64, 2), generator=g).tolist()
    ]
    return {"images": torchfeed.RaggedImages.from_images(images), "labels": torch.arange(64)}


def fresh_copy(batch):
    return torchfeed._tree.map_tensors(batch, lambda t: torch.empty_like(t).copy_(t))


def test_stage_float_ring(benchmark, role, float_batch):
    benchmark.group = "stage 64x3x224x224 float32 (CPU)"
    role("torchfeed")
    ring = PinnedRing(4 * 38_600_000, pinned=False)
    benchmark(ring.stage, float_batch)


def test_stage_float_fresh_buffer(benchmark, role, float_batch):
    benchmark.group = "stage 64x3x224x224 float32 (CPU)"
    role("baseline")
    benchmark(fresh_copy, float_batch)


def test_stage_ragged_uint8_ring(benchmark, role, ragged_batch):
    benchmark.group = "stage 64 ragged uint8 images (CPU)"
    role("torchfeed")
    ring = PinnedRing(4 * ragged_batch["images"].data.numel() + (1 << 20), pinned=False)
    benchmark(ring.stage, ragged_batch)


def test_stage_ragged_uint8_fresh_buffer(benchmark, role, ragged_batch):
    benchmark.group = "stage 64 ragged uint8 images (CPU)"
    role("baseline")
    benchmark(fresh_copy, ragged_batch)


def bench_h2d(benchmark, copy, nbytes):
    """Times ``copy()`` until the device has finished it, and records the bandwidth."""

    def run():
        out = copy()
        torch.cuda.synchronize()
        return out

    benchmark(run)
    benchmark.extra_info["GB/s"] = round(nbytes / benchmark.stats.stats.median / 1e9, 2)


@pytest.mark.cuda
def test_h2d_ring_chunked(benchmark, role, float_batch):
    """Pageable batch -> ring -> GPU in 4 MB chunks: chunk k's transfer overlaps staging chunk
    k + 1. Goal: 1.5x pin_memory() + .to(), and close to one pinned copy."""
    benchmark.group = "H2D 64x3x224x224 float32 (CUDA)"
    role("torchfeed")
    ring = PinnedRing(4 * 38_600_000)
    bench_h2d(
        benchmark, lambda: ring.copy_to_device(float_batch, "cuda"), float_batch["images"].nbytes
    )


@pytest.mark.cuda
def test_h2d_ring_stage_then_copy(benchmark, role, float_batch):
    """The unpipelined form (stage the whole batch, then copy it), for comparison."""
    benchmark.group = "H2D 64x3x224x224 float32 (CUDA)"
    role("baseline")
    ring = PinnedRing(4 * 38_600_000)
    bench_h2d(
        benchmark,
        lambda: ring.to_device(ring.stage(float_batch), "cuda"),
        float_batch["images"].nbytes,
    )


@pytest.mark.cuda
def test_h2d_pin_memory_per_batch(benchmark, role, float_batch):
    benchmark.group = "H2D 64x3x224x224 float32 (CUDA)"
    role("baseline")
    bench_h2d(
        benchmark,
        lambda: {k: v.pin_memory().to("cuda", non_blocking=True) for k, v in float_batch.items()},
        float_batch["images"].nbytes,
    )


@pytest.mark.cuda
def test_h2d_pageable(benchmark, role, float_batch):
    benchmark.group = "H2D 64x3x224x224 float32 (CUDA)"
    role("baseline")
    bench_h2d(
        benchmark,
        lambda: {k: v.to("cuda") for k, v in float_batch.items()},
        float_batch["images"].nbytes,
    )


@pytest.mark.cuda
def test_h2d_peak_single_pinned_copy(benchmark, role, float_batch):
    benchmark.group = "H2D 64x3x224x224 float32 (CUDA)"
    role("floor")
    src = float_batch["images"].pin_memory()
    dst = torch.empty_like(src, device="cuda")
    bench_h2d(benchmark, lambda: dst.copy_(src, non_blocking=True), src.nbytes)


# 20 steps of ~8 ms GPU compute (three 4096^2 fp32 matmuls), each fed a 64x3x224x224 uint8 CPU
# batch. Goal: the epoch within 1.03x compute alone, with the prefetcher made once and with one
# made per epoch (its arena is shared, not page-locked anew).

STEPS = 20


@pytest.fixture(scope="module")
def overlap_setup():
    batches = [torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8) for _ in range(STEPS)]
    weights = torch.randn(4096, 4096, device="cuda")
    return batches, weights


def step(x, weights):
    y = weights
    for _ in range(3):
        y = y @ weights
    return y.sum() + x.float().mean()


def bench_epoch(benchmark, feed, weights):
    """Times one epoch: a step on every batch ``feed()`` yields (on the GPU), then a sync."""

    def epoch():
        for x in feed():
            step(x, weights)
        torch.cuda.synchronize()

    benchmark.group = "epoch: 20 steps fed from the CPU (CUDA)"
    benchmark.pedantic(epoch, rounds=5, warmup_rounds=1)


@pytest.mark.cuda
def test_overlap_compute_alone(benchmark, role, overlap_setup):
    role("floor")
    batches, weights = overlap_setup
    gpu = [b.cuda() for b in batches]
    bench_epoch(benchmark, lambda: gpu, weights)


@pytest.mark.cuda
def test_overlap_plain_to(benchmark, role, overlap_setup):
    role("baseline")
    batches, weights = overlap_setup
    bench_epoch(benchmark, lambda: (x.to("cuda", non_blocking=True) for x in batches), weights)


@pytest.mark.cuda
def test_overlap_prefetcher_made_once(benchmark, role, overlap_setup):
    role("torchfeed")
    batches, weights = overlap_setup
    prefetcher = torchfeed.DevicePrefetcher(batches, "cuda")
    bench_epoch(benchmark, lambda: prefetcher, weights)


@pytest.mark.cuda
def test_overlap_prefetcher_made_per_epoch(benchmark, role, overlap_setup):
    role("torchfeed")
    batches, weights = overlap_setup
    bench_epoch(benchmark, lambda: torchfeed.DevicePrefetcher(batches, "cuda"), weights)
