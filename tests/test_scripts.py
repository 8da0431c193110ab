"""The measurement scripts a README figure points to run on a user's folder and refuse bad input
with the argument's name."""

from __future__ import annotations

import os
import platform
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torchvision.transforms.v2 import functional as TF

from torchfeed._pil import encode_jpeg
from torchfeed._pipeline_bench.dataset import synthetic_image

from helpers import run_in_process
from jpeg_cases import needs_window_decoder

ROOT = Path(__file__).resolve().parents[1]


def run_script(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs scripts/<name>: a shell script with bash, a Python one with this interpreter."""
    interpreter = "bash" if name.endswith(".sh") else sys.executable
    return subprocess.run(
        [interpreter, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_script_here(capsys, monkeypatch, name: str, *args: str) -> subprocess.CompletedProcess:
    """Runs scripts/<name> (Python) in this process, for what fails on its arguments: a
    subprocess of its own imports torch and torchfeed again, several seconds of CPU each. The
    thread count the scripts set is put back."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.setattr(sys, "argv", [name, *args])

    def script() -> None:
        runpy.run_path(str(ROOT / "scripts" / name), run_name="__main__")

    threads = torch.get_num_threads()
    try:
        return run_in_process(capsys, [name, *args], script)
    finally:
        torch.set_num_threads(threads)


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


def test_reduced_decode_effect_measures_both_transforms(tmp_path):
    (tmp_path / "a").mkdir()
    for i, (h, w) in enumerate([(1200, 900), (700, 1100), (333, 401)]):  # 2 large enough
        image = TF.resize(synthetic_image(i), [h, w], antialias=True)
        (tmp_path / "a" / f"{i}.jpg").write_bytes(encode_jpeg(image, quality=90))
    (tmp_path / "a" / "broken.jpg").write_bytes(b"not an image")  # skipped, as the bench does
    done = run_script("reduced_decode_effect.py", str(tmp_path), "--repeats", "1")
    assert done.returncode == 0, done.stderr
    assert "3 images of" in done.stdout and "(1 unreadable skipped)" in done.stdout
    evaluation = re.search(r"evaluation \(Resize\(256\) -> CenterCrop\(224\)\): (\d) reduced, "
                           r"mean ([0-9.]+), max ([0-9.]+)", done.stdout)  # fmt: skip
    assert evaluation is not None, done.stdout
    reduced, mean, most = int(evaluation[1]), float(evaluation[2]), float(evaluation[3])
    assert reduced == 2 and 0 < mean < 0.1 and mean <= most
    for name in ("training", "evaluation"):
        assert f"{name}, ms per image on one thread: Pillow loader + torchvision" in done.stdout


def test_malloc_effect_runs_both_pipelines_with_and_without_the_setting(tmp_path):
    for i in range(21):  # a batch of 10 for each of the 2 workers, one image over
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        image = synthetic_image(i)[:, :96, :128]
        (tmp_path / f"c{i % 2}" / f"{i}.jpg").write_bytes(encode_jpeg(image, quality=80))
    done = run_script("malloc_effect.py", str(tmp_path), "--repeats", "1", timeout=600)
    assert done.returncode == 0, done.stderr
    assert "21 images, 2 workers, batches of 10, 1 rounds" in done.stdout
    # what each side ran on, glibc's thresholds named where they apply
    assert "as is: " in done.stdout and "; tuned: " in done.stdout
    if platform.libc_ver()[0] == "glibc" and "LD_PRELOAD" not in os.environ:
        assert "MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296" in done.stdout
    figures = re.findall(r"CPU ms/image: ([0-9.]+) as is, ([0-9.]+) tuned", done.stdout)
    assert len(figures) == 2 and all(float(a) > 0 and float(b) > 0 for a, b in figures)
    assert "baseline (torchvision per image)" in done.stdout and "at reduced scale" in done.stdout


@pytest.mark.parametrize(
    ("script", "args", "match"),
    [
        (script, args, match)
        for script, empty in [
            ("decode_costs.py", "folder: no JPEG files under"),
            ("reduced_decode_effect.py", "folder: no readable image under"),
            ("malloc_effect.py", "folder: .* has 0 images; the pipelines need at least 16"),
        ]
        for args, match in [
            (["{empty}", "--repeats", "0"], "--repeats must be at least 1, got 0"),
            (["{missing}"], "folder: .* is not a directory"),
            (["{empty}"], empty),
        ]
    ],
)
def test_the_folder_scripts_refuse_bad_arguments(
    tmp_path, capsys, monkeypatch, script, args, match
):
    (tmp_path / "empty").mkdir()
    args = [a.format(missing=tmp_path / "missing", empty=tmp_path / "empty") for a in args]
    done = run_script_here(capsys, monkeypatch, script, *args)
    assert done.returncode == 2
    assert re.search(match, done.stderr), done.stderr


def test_debian_photos_keeps_every_background_and_each_wallpapers_largest(tmp_path):
    share = tmp_path / "root" / "usr" / "share"
    files = {
        "backgrounds/mate/nature/Aqua.jpg": b"aqua",
        "backgrounds/mate/abstract/Elephants.jpg": b"elephants",
        "backgrounds/gnome/notes.png": b"not a jpeg",
        "wallpapers/Kite/contents/screenshot.jpg": b"a preview, not a wallpaper",
        "wallpapers/Kite/contents/images/640x480.jpg": b"small",
        "wallpapers/Kite/contents/images/2560x1440.jpg": b"largest",  # 3.7 MP
        "wallpapers/Kite/contents/images/1920x1920.jpg": b"taller, fewer pixels",  # 3.7 MP - 1
        "wallpapers/Flow/contents/images_dark/720x1440.jpg": b"dark small",
        "wallpapers/Flow/contents/images_dark/5120x2880.jpg": b"dark largest",
        "wallpapers/Volna/contents/images/Volna.jpg": b"no size in its name",
    }
    for name, data in files.items():
        (share / name).parent.mkdir(parents=True, exist_ok=True)
        (share / name).write_bytes(data)
    out = tmp_path / "photos"
    done = run_script("debian_photos.sh", str(out), "--from", str(tmp_path / "root"), timeout=60)
    assert done.returncode == 0, done.stderr
    got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*.jpg")}
    assert got == {
        "backgrounds/nature-Aqua.jpg": b"aqua",
        "backgrounds/abstract-Elephants.jpg": b"elephants",
        "plasma/Kite.jpg": b"largest",
        "plasma/Flow_dark.jpg": b"dark largest",
    }
    assert "4 JPEGs in" in done.stdout


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ([], r"usage: scripts/debian_photos.sh DIR \[--from ROOT\]"),
        (["{out}", "--form", "{root}"], "usage:"),
        (["{full}"], r"DIR \(.*full\) exists and is not empty"),
        (["{out}", "--from", "{missing}"], "--from .*missing holds no unpacked packages"),
    ],
)
def test_debian_photos_refuses_bad_arguments(tmp_path, args, match):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a.jpg").write_bytes(b"x")
    names = {"out": "out", "root": "root", "full": "full", "missing": "missing"}
    args = [a.format(**{k: tmp_path / v for k, v in names.items()}) for a in args]
    done = run_script("debian_photos.sh", *args, timeout=60)
    assert done.returncode == 2
    assert re.search(match, done.stderr), done.stderr
    assert not (tmp_path / "out").exists()


def test_the_gpu_checks_ring_probe_runs_here():
    """scripts/gpu_ring_probe.py, gpu_check.sh's first step on a GPU machine, where it showed the
    zero-copy tests' stale handle was not the ring's: here it must agree with the ring too
    (without a GPU the ring is not page-locked), so it does not rot between GPU runs."""
    result = run_script("gpu_ring_probe.py", timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "parent reads the child's batch: [7, 7, 7, 7]" in result.stdout
    assert "tight loader: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]" in result.stdout
    assert result.stdout.rstrip().endswith("== result: ok")
