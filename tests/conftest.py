"""Fixtures shared by the tests."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import torchfeed

# CI runs every property test on the same examples (a red CI must be reproducible); a local run
# explores new ones each time.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(params=["avx512", "avx2", "baseline"])
def isa(request):
    """Runs a test with each instruction set of the CPU kernel (where the machine has it); the
    SIMD ones use fused multiply-adds, the baseline does not."""
    now = torchfeed._C._testing.limit_cpu_isa(request.param)
    if now != request.param:
        torchfeed._C._testing.limit_cpu_isa("avx512")
        pytest.skip(f"this CPU has no {request.param}")
    yield now
    torchfeed._C._testing.limit_cpu_isa("avx512")  # the best the machine has


@pytest.fixture
def ring_views(monkeypatch):
    """Every tensor of a ring's batch arrives as a view of its region, however small: for tests
    of the regions themselves on small batches (tensors of at most SMALL_FIELD_BYTES otherwise
    arrive as copies of their own, which hold no region)."""
    from torchfeed.memory import _ring_base

    monkeypatch.setattr(_ring_base, "SMALL_FIELD_BYTES", -1)
