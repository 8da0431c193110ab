"""What glibc's malloc defaults cost an image pipeline on large photos.

glibc maps an allocation above its mmap threshold (at most 32 MB by default) fresh, and unmaps it
when freed; freed heap above the trim threshold goes back to the system too. A decoded photo is
such an allocation, made and freed once a sample, so its pixels are written into new pages every
time: a page fault a page. Setting both thresholds in the environment makes a process keep its
heap and write into memory it has written before.

For the torchvision baseline and the best torchfeed pipeline of ``torchfeed bench`` (crops decoded
at reduced scale, fused in the workers), each round runs the pipeline in a child process with the
environment as it is and with ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` set, in
turn (the order alternating from round to round), and reports the CPU per image of the timed
epochs (every process, workers too, as the bench measures it) and the images/s of each, with
the ratio of each round's pair. Two workers, batches of 64 (of half the folder, for a folder of
fewer than 128 images), three timed epochs after a start-up one.

    .venv/bin/python scripts/malloc_effect.py [DIR] [--repeats 3]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import _folder
import torch

from torchfeed._malloc import KEEP_HEAP_ENV as TUNED  # what torchfeed doctor advises
from torchfeed._malloc import describe
from torchfeed._pipeline_bench import image_pipelines as ip
from torchfeed._pipeline_bench.runner import run_epochs

PIPELINES = (ip.BASELINE, ip.SCALED_WORKERS)
WORKERS, EPOCHS = 2, 3
BATCH = 64  # at most: a smaller folder gets a batch for each worker
SMALLEST_BATCH = 8


def child(name: str, listing: Path, batch: int) -> None:
    """Runs one pipeline over the files listed (JSON) and prints its figures (JSON)."""
    files = [Path(f) for f in json.loads(listing.read_text())]
    pipes, batches = ip.make_pipelines(
        files, [0] * len(files), batch, WORKERS, torch.device("cpu"), ip.SkippedLog()
    )
    r = run_epochs(name, f"workers={WORKERS}", pipes[name], ip.step, EPOCHS, batches, False)
    print(json.dumps({"cpu_ms": r.cpu_ms_per_sample, "per_s": r.samples_per_second}))


def environment(tuned: bool) -> dict[str, str]:
    """This environment without the two thresholds, or with them set."""
    env = {k: v for k, v in os.environ.items() if k not in TUNED}
    return {**env, **TUNED} if tuned else env


def run_child(name: str, listing: Path, batch: int, tuned: bool) -> dict[str, float]:
    env = environment(tuned)
    done = subprocess.run(
        [sys.executable, __file__, "--child", name, str(listing), str(batch)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"{name}: the child process failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser, folder, repeats, found = _folder.parse(__doc__)
    if len(found) < SMALLEST_BATCH * WORKERS:
        parser.error(
            f"folder: {folder} has {len(found)} images; the pipelines need at least "
            f"{SMALLEST_BATCH * WORKERS} (a batch of {SMALLEST_BATCH} for each of {WORKERS} "
            "workers)"
        )
    batch = min(BATCH, len(found) // WORKERS)
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "files.json"
        listing.write_text(json.dumps([str(f) for f in found]))
        runs: dict[tuple[str, bool], list[dict[str, float]]] = {}
        for r in range(repeats):
            for name in PIPELINES:
                for tuned in (r % 2 == 1, r % 2 == 0):  # A B, then B A
                    runs.setdefault((name, tuned), []).append(
                        run_child(name, listing, batch, tuned)
                    )
    print(f"{folder}: {len(found)} images, {WORKERS} workers, batches of {batch}, {repeats} rounds")
    # what each side ran on (this environment's own thresholds are left out of "as is")
    print(f"as is: {describe(environment(False))}; tuned: {describe(environment(True))}")
    for name in PIPELINES:
        plain, tuned = runs[name, False], runs[name, True]
        cpu = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(plain, tuned, strict=True)]
        speed = [b["per_s"] / a["per_s"] for a, b in zip(plain, tuned, strict=True)]
        print(
            f"  {name}\n"
            f"    CPU ms/image: {statistics.median(a['cpu_ms'] for a in plain):.1f} as is, "
            f"{statistics.median(b['cpu_ms'] for b in tuned):.1f} tuned "
            f"(pairs: {', '.join(f'{x:.2f}x' for x in cpu)} less)\n"
            f"    images/s: {statistics.median(a['per_s'] for a in plain):.1f} as is, "
            f"{statistics.median(b['per_s'] for b in tuned):.1f} tuned "
            f"(pairs: {', '.join(f'{x:.2f}x' for x in speed)})"
        )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], Path(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
