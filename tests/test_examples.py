"""The examples (the course's labs and capstone, redone on torchfeed) run, in their quick mode,
and say what they claim: each checks its own claim with an assert and prints the figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# What each example must print (its claim), checked in addition to its own asserts.
CLAIMS = {
    "lab1_resilient_dataset.py": r"course's dataset -> RecursionError .* torchfeed -> RuntimeError",
    "lab2_sharded_stream.py": r"resumed on 3: (\d+) of \1 samples, each exactly once: True",
    "lab3_multimodal_collate.py": r"(\d+) real tokens; the course's mask keeps \d+ .* torchfeed's keeps \1",
    "lab4_loader_throughput.py": r"zero copy with 2 workers: [\d.]+x the DataLoader",
    "lab5_batch_augmentation.py": r"draws 1 crop for 32 images; torchfeed drew 32 distinct crops",
    "capstone_engine.py": r"resumed and read the other \d+ \(total (\d+) of \1\)",
}  # fmt: skip


def test_every_example_is_checked():
    found = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert found == set(CLAIMS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_example_runs_and_shows_its_claim(name):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--quick"],
        cwd=EXAMPLES,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(CLAIMS[name], proc.stdout), proc.stdout
