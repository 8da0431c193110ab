"""DevicePrefetcher overlaps preparing batch i+1 (its ``transform``: 20 ms a batch, a sleep
that frees the GIL as a C++ kernel does) with the step on batch i (20 ms), through the
prefetcher (torchfeed) and without it (baseline: the plain loop, transforming and stepping one
after the other). Ideal overlap: about half the time.

A DataLoader without workers is read in the loop's thread (its reads draw from the global
generators the loop draws from too), so its reads do not overlap the step: what overlaps them is
the DataLoader's own workers (``num_workers=1`` or more), with or without the prefetcher."""

from __future__ import annotations

import time

import pytest
from torch.utils.data import DataLoader

from torchfeed import DevicePrefetcher

STEP_S = 0.02
BATCHES = 10


def slow_transform(batch):
    time.sleep(STEP_S)
    return batch


def epoch(iterable, transform=None) -> None:
    for batch in iterable:
        if transform is not None:
            transform(batch)
        time.sleep(STEP_S)  # the training step


@pytest.mark.benchmark(group="prefetch: overlap of the batch's transform and the step")
def test_prefetcher(benchmark):
    benchmark.extra_info["role"] = "torchfeed"
    loader = DataLoader(list(range(BATCHES)), batch_size=1)
    benchmark.pedantic(
        lambda: epoch(DevicePrefetcher(loader, device="cpu", transform=slow_transform)), rounds=5
    )


@pytest.mark.benchmark(group="prefetch: overlap of the batch's transform and the step")
def test_plain_loop(benchmark):
    benchmark.extra_info["role"] = "baseline"
    loader = DataLoader(list(range(BATCHES)), batch_size=1)
    benchmark.pedantic(lambda: epoch(loader, slow_transform), rounds=5)
