"""DevicePrefetcher overlaps loading with the step: a loop over a loader that takes 20 ms per
batch, with a 20 ms step, through the prefetcher (torchfeed) and without it (baseline: the
plain loop, loading and stepping one after the other). Ideal overlap: about half the time."""

from __future__ import annotations

import time

import pytest
from torch.utils.data import DataLoader, Dataset

from torchfeed import DevicePrefetcher

STEP_S = 0.02
BATCHES = 10


class Slow(Dataset):
    def __len__(self):
        return BATCHES

    def __getitem__(self, i):
        time.sleep(STEP_S)
        return i


def epoch(iterable) -> None:
    for _ in iterable:
        time.sleep(STEP_S)  # the training step


@pytest.mark.benchmark(group="prefetch: overlap of loading and step")
def test_prefetcher(benchmark):
    benchmark.extra_info["role"] = "torchfeed"
    loader = DataLoader(Slow(), batch_size=1)
    benchmark.pedantic(lambda: epoch(DevicePrefetcher(loader, device="cpu")), rounds=5)


@pytest.mark.benchmark(group="prefetch: overlap of loading and step")
def test_plain_loop(benchmark):
    benchmark.extra_info["role"] = "baseline"
    loader = DataLoader(Slow(), batch_size=1)
    benchmark.pedantic(lambda: epoch(loader), rounds=5)
