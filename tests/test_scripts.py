"""The measurement scripts a README figure points to run on a user's folder and refuse bad input
with the argument's name."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchfeed._pil import encode_jpeg
from torchfeed._pipeline_bench.dataset import synthetic_image

from jpeg_cases import needs_window_decoder

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@needs_window_decoder
def test_decode_costs_reports_each_kind_of_jpeg(tmp_path):
    (tmp_path / "a").mkdir()
    for i, progressive in enumerate((False, False, True)):
        data = encode_jpeg(synthetic_image(i), quality=90, progressive=progressive)
        (tmp_path / "a" / f"{i}.jpg").write_bytes(data)
    (tmp_path / "a" / "notes.png").write_bytes(b"not an image")
    done = run_script("decode_costs.py", str(tmp_path), "--repeats", "1")
    assert done.returncode == 0, done.stderr
    assert "3 JPEGs, one thread, best of 1 passes" in done.stdout
    assert "sequential     2 files" in done.stdout
    assert "progressive    1 files" in done.stdout


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["{empty}", "--repeats", "0"], "--repeats must be at least 1, got 0"),
        (["{missing}"], "folder: .* is not a directory"),
        (["{empty}"], "folder: no JPEG files under"),
    ],
)
def test_decode_costs_refuses_bad_arguments(tmp_path, args, match):
    (tmp_path / "empty").mkdir()
    args = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in args]
    done = run_script("decode_costs.py", *args)
    assert done.returncode == 2
    assert re.search(match, done.stderr), done.stderr
