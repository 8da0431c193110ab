"""Fixtures shared by the tests."""

from __future__ import annotations

import pytest

import torchfeed


@pytest.fixture(params=["avx2", "baseline"])
def isa(request):
    """Runs a test with each instruction set of the CPU kernel (where the machine has it)."""
    before = torchfeed._C.cpu_isa()
    now = torchfeed._C._testing.limit_cpu_isa(request.param)
    if now != request.param:
        torchfeed._C._testing.limit_cpu_isa(before)
        pytest.skip(f"this CPU has no {request.param}")
    yield now
    torchfeed._C._testing.limit_cpu_isa("avx2")
