"""Checkpoints across real ranks (torchrun, gloo, CPU): 2 ranks x 2 workers, stopped and resumed
on the same world (bit for bit), on another world (2 -> 3, 3 -> 2: exactly once), and after a
rank is killed with SIGKILL (nothing lost, nothing read twice after the checkpoint)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "dist_resume.py"
ITEMS = 150

pytestmark = pytest.mark.slow


def torchrun(tmp: Path, ranks: int, kind: str, tag: str, *args: str, ok: bool = True) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            str(SCRIPT),
            str(tmp),
            kind,
            tag,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    if ok:
        assert result.returncode == 0, result.stderr[-4000:]
    else:
        assert result.returncode != 0, "the job was meant to lose a rank"


def seen(tmp: Path, tag: str, ranks: int, upto: int | None = None) -> list[list]:
    out = []
    for r in range(ranks):
        lines = (tmp / f"seen-{tag}-rank{r}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        out.append([row for row in rows if upto is None or row[0] <= upto])
    return out


def ids(parts) -> list[int]:
    return sorted(k for part in parts for _, k, _ in part)


@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_stop_and_resume_on_the_same_world_is_the_uninterrupted_run(tmp_path, kind):
    torchrun(tmp_path, 2, kind, "full")
    torchrun(tmp_path, 2, kind, "head", "--every", "5", "--stop", "5")
    torchrun(tmp_path, 2, kind, "tail", "--resume", str(tmp_path / "ckpt-head-rank0.pt"))
    full, head, tail = (seen(tmp_path, t, 2) for t in ("full", "head", "tail"))
    for r in range(2):  # the same samples, in the same order, with the same augmentation
        assert [row[1:] for row in head[r] + tail[r]] == [row[1:] for row in full[r]]


@pytest.mark.parametrize(
    ("kind", "before", "after"),
    [("iterable", 2, 3), ("iterable", 3, 2), ("map", 2, 3), ("map", 3, 2)],
)
def test_elastic_resume_in_lockstep_reads_the_rest_once(tmp_path, kind, before, after):
    """Every rank of the resumed epoch yields the same number of batches (each step runs an
    all_reduce, so an extra batch on one rank would hang the job into its timeout), and reads
    the rest of the epoch once, but for what the docs say is repeated or left out."""
    torchrun(tmp_path, before, kind, "head", "--every", "4", "--stop", "4")
    ckpt = str(tmp_path / "ckpt-head-rank0.pt")
    torchrun(tmp_path, after, kind, "tail", "--resume", ckpt, "--next")
    steps = json.loads((tmp_path / "steps-tail.json").read_text())
    assert len(steps) == after and len(set(steps)) == 1  # lockstep: the same count everywhere
    read = ids(seen(tmp_path, "head", before)) + ids(seen(tmp_path, "tail", after))
    if kind == "iterable":
        # uneven="drop": the fresh plan leaves out ITEMS % consumers (2 workers a rank), the
        # resumed one the rest's remainder over its consumers; nothing is read twice
        planned = ITEMS - ITEMS % (before * 2)
        assert len(read) == len(set(read)) and planned - after * 2 < len(read) <= planned
    else:
        # drop_last=False: the rest is padded by repeating its first samples; nothing is lost
        assert set(read) == set(range(ITEMS)) and len(read) - ITEMS < after
    nxt = json.loads((tmp_path / "next-tail.json").read_text())
    assert len(nxt) == after and len(set(nxt)) == 1  # the next epoch: balanced again


def test_a_rank_killed_mid_epoch_resumes_from_the_last_checkpoint(tmp_path):
    torchrun(tmp_path, 2, "iterable", "crash", "--every", "3", "--crash", "8", ok=False)
    steps = {int((tmp_path / f"ckpt-crash-rank{r}.step").read_text()) for r in range(2)}
    assert steps == {6}  # both ranks saved at step 6; rank 1 died at step 8
    torchrun(tmp_path, 2, "iterable", "after", "--resume", str(tmp_path / "ckpt-crash-rank0.pt"))
    before = seen(tmp_path, "crash", 2, upto=6)  # what the checkpoint covers
    read = ids(before) + ids(seen(tmp_path, "after", 2))
    # nothing lost, nothing twice after the checkpoint (uneven="drop" plans 148 of the 150)
    assert len(read) == len(set(read)) == ITEMS - ITEMS % 4
