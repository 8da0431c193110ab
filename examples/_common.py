"""Shared by the examples: a quick mode for CI, and a timer."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def parse(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a small run (seconds), as CI runs it")
    return p.parse_args()


def rate(fn: Callable[[], int], repeat: int = 2) -> float:
    """Items per second of ``fn`` (which returns how many it handled), best of ``repeat``."""
    best = 0.0
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = fn()
        best = max(best, n / (time.perf_counter() - t0))
    return best
