"""The torchfeed command end to end: bench in quick mode (table, JSON, PNG), --data with a
corrupt file, bad options, doctor."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchfeed._malloc import describe, heap_kept
from torchfeed._pil import encode_jpeg
from torchfeed._pipeline_bench.dataset import list_image_folder, synthetic_image
from torchfeed.cli import main

from helpers import run_in_process

QUICK = [
    "--quick",
    "--images",
    "40",
    "--batch-size",
    "16",
    "--workers",
    "1",
    "--text-samples",
    "64",
    "--no-progress",
]


def run_cli(*args: str, cache: Path | None = None, **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)  # the doctor's advice depends on it
    if cache is not None:
        env["TORCHFEED_CACHE"] = str(cache)
    env.update(env_vars)
    return subprocess.run(
        [sys.executable, "-m", "torchfeed", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


@pytest.fixture
def cli(capsys, monkeypatch):
    """``torchfeed ...`` run in this process: what fails on its arguments, and the doctor, which
    only reads. A subprocess of its own imports torch and torchfeed again, several seconds of CPU
    each (the bench runs above and below keep going through ``python -m torchfeed``)."""
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)  # the doctor's advice depends on it

    def run(*args: str, **env_vars: str) -> subprocess.CompletedProcess:
        with monkeypatch.context() as env:
            for name, value in env_vars.items():
                env.setenv(name, value)
            return run_in_process(capsys, ["torchfeed", *args], lambda: main(list(args)))

    return run


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    result = run_cli(
        "bench",
        *QUICK,
        "--json",
        str(tmp / "out.json"),
        "--plot",
        str(tmp / "chart.png"),
        cache=tmp / "cache",
    )
    return result, tmp


def test_bench_quick_prints_the_table(quick_run):
    result, tmp = quick_run
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    for text in (
        "images: baseline (torchvision per image)",
        "images: torchfeed",
        "text: torchfeed PadCollate",
        "samples/s",
        "speedup",
        "first epoch s",
        "where the time goes",
        "read + decode",
        "floor: whole files at 1/8 scale",
        "collate + worker -> main transfer",
        "pipelines agree",
        "machine:",
        "images: torchfeed zero-copy + crop-window decode",
        "zero-copy + crop-window decode",
        "images: torchfeed zero-copy + crop-window decode at reduced scale",
        "on the file's bytes: loader=read_file)",
        "CPU ms/sample",
        "peak MB",
        "decoding at reduced scale (",
        "the evaluation transform (Resize(256) -> CenterCrop(224)) with reduced_decode (",
        "pick (images, workers=1): '",
        "pick (text, workers=1): '",
    ):
        assert text in out, text
    # the built-in dataset was made in the cache: 40 JPEGs, ImageFolder layout
    files, labels = list_image_folder(tmp / "cache" / "images-v2")
    assert len(files) == 40 and len(set(labels)) == 10


def test_bench_json_schema(quick_run):
    result, tmp = quick_run
    payload = json.loads((tmp / "out.json").read_text())
    assert set(payload) >= {"machine", "settings", "results", "stages", "agreement"}
    assert payload["settings"]["quick"] is True and payload["settings"]["workers"] == [1]
    for row in payload["results"]:
        assert {
            "pipeline",
            "config",
            "samples_per_s",
            "speedup",
            "epoch_s",
            "first_epoch_s",
        } <= set(row)
        assert row["samples_per_s"] > 0
        # the workers' CPU is counted: no pipeline delivers an image for nothing
        assert row["cpu_ms_per_sample"] > 0 and row["peak_mb"] > 1, row
    baselines = [r for r in payload["results"] if r["speedup"] == 1.0]
    assert len(baselines) >= 2  # one per suite
    # each timed before and again after the others, and each run's figure kept
    for row in baselines:
        assert len(row["baseline_runs_per_s"]) == 2 and min(row["baseline_runs_per_s"]) > 0, row
        assert row["samples_per_s"] <= max(row["baseline_runs_per_s"]) * 1.0001
    assert (
        sum("timed again after the others" in line for line in quick_run[0].stdout.split("\n")) == 2
    )
    assert payload["agreement"]["max_abs_diff"] <= payload["agreement"]["bound"]
    assert payload["agreement"]["window_max_abs_diff"] <= payload["agreement"]["window_bound"]
    assert all("scaled_ms" in row for row in payload["stages"] if "baseline_ms" in row)
    # a scaled window differs a little from the full-scale one, and only when one was scaled
    agreement = payload["agreement"]
    assert (agreement["scaled_images"] > 0) == (agreement["scaled_mean_abs_diff"] > 0)
    assert agreement["scaled_mean_abs_diff"] < 0.2
    reduced = agreement["eval_scaled_images"]
    assert (reduced > 0) == (agreement["eval_scaled_mean_abs_diff"] > 0)
    assert agreement["eval_scaled_mean_abs_diff"] < 0.2
    assert {"cpu", "torch", "torchfeed"} <= set(payload["machine"])
    # the memory the peak-memory column is set against: the machine's (a container's limit too,
    # where lower)
    memory = payload["machine"]["memory_gb"]
    assert memory == round(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9, 1)
    limit = payload["machine"]["memory_limit_gb"]
    assert limit is None or limit < memory
    assert f"{memory} GB memory" in result.stdout
    # the allocator the pipelines ran on (glibc's defaults cost photo pipelines a fifth)
    assert payload["machine"]["malloc"] == describe(os.environ)
    assert f"malloc: {describe(os.environ)}" in result.stdout


def test_bench_plot(quick_run):
    pytest.importorskip("matplotlib")
    _result, tmp = quick_run
    data = (tmp / "chart.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_bench_on_a_folder_with_a_corrupt_file(tmp_path):
    root = tmp_path / "photos"
    for i in range(12):
        folder = root / ("cats" if i % 2 else "dogs")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i}.jpg").write_bytes(encode_jpeg(synthetic_image(i)))
    (root / "cats" / "broken.jpg").write_bytes(b"not a jpeg at all")
    result = run_cli(
        "bench",
        "--data",
        str(root),
        "--suite",
        "images",
        "--quick",
        "--batch-size",
        "4",
        "--workers",
        "1",
        "--no-progress",
        "--json",
        str(tmp_path / "o.json"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "skipped 1 unreadable file(s)" in result.stdout and "broken.jpg" in result.stdout
    payload = json.loads((tmp_path / "o.json").read_text())
    assert [Path(p).name for p in payload["skipped_files"]] == ["broken.jpg"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "tpu"], "--device: unknown device 'tpu'"),
        (["--workers", "-1"], "--workers must be integers >= 0"),
        (["--workers", "two"], "--workers must be a comma-separated list of integers"),
        (["--data", "/no/such/folder"], "--data: /no/such/folder is not a directory"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--suite", "audio"], "--suite takes 'images', 'text' or both"),
    ],
)
def test_bench_bad_options(args, message, cli):
    result = cli("bench", *args)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_cuda_without_gpu(cli):
    result = cli("bench", "--device", "cuda")
    assert result.returncode == 2 and "no CUDA GPU is usable" in result.stderr


def test_doctor(cli):
    workers = str(os.cpu_count())  # as many workers as CPUs, whatever the machine
    result = cli("doctor", "--workers", workers, "--batch-mb", "1000000")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "torchfeed doctor" in out and "CPU kernels:" in out and "/dev/shm" in out
    assert "leaves no CPU for the main process" in out
    assert "smaller than the batches in flight" in out  # workers x 2 x 1 TB
    assert "crop-window JPEG decoding (torchfeed.decode):" in out
    assert "OMP_WAIT_POLICY=PASSIVE" in out  # the workers + the main process's threads
    passive = cli("doctor", "--workers", workers, OMP_WAIT_POLICY="PASSIVE")
    assert passive.returncode == 0 and "OMP_WAIT_POLICY" not in passive.stdout


def test_doctor_says_what_a_self_sized_ring_may_take(cli):
    """The memory budget (memory/_budget.py) with the ranks torchrun would start here: eight
    ranks of 40 MB batches fit, a thousand do not; a LOCAL_WORLD_SIZE that is not a count is
    reported, not a crash."""
    eight = cli("doctor", "--workers", "1", LOCAL_WORLD_SIZE="8")
    assert eight.returncode == 0, eight.stderr
    assert (
        "host memory: a ring torchfeed sizes itself (zero copy, the prefetcher's) gets at "
        "most half of "
        in eight.stdout
        and "shared by LOCAL_WORLD_SIZE=8 processes" in eight.stdout
    )
    assert "more than a zero-copy ring may take" not in eight.stdout
    many = cli("doctor", "--workers", "1", "--batch-mb", "5000", LOCAL_WORLD_SIZE="1000")
    assert many.returncode == 0 and "more than a zero-copy ring may take here" in many.stdout
    bad = cli("doctor", LOCAL_WORLD_SIZE="eight")
    assert bad.returncode == 0, bad.stderr
    assert (
        "fix the environment: the environment variable LOCAL_WORLD_SIZE must be an integer"
        in bad.stdout
    )


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) != os.cpu_count(),
    reason="this process is pinned to some CPUs",
)
def test_doctor_counts_every_rank_torchrun_starts_here(cli):
    """Ranks of one node share its CPUs and its /dev/shm: as many ranks as CPUs leave each under
    two for its main process and its workers, and the batches in flight add up."""
    cpus = os.cpu_count()
    out = cli("doctor", "--workers", "1", "--batch-mb", "10", LOCAL_WORLD_SIZE=str(cpus)).stdout
    assert (
        f"LOCAL_WORLD_SIZE={cpus} ranks x (num_workers=1 + the main process) = {2 * cpus} "
        f"processes on {cpus} CPUs: each rank has fewer than two CPUs" in out
    )
    assert f"(1 workers x prefetch_factor 2 x 10 MB); {cpus} ranks share it: " in out
    assert "leaves no CPU for the main process" not in out  # the per-rank advice instead
    one = cli("doctor", "--workers", "1", "--batch-mb", "10", LOCAL_WORLD_SIZE="1").stdout
    assert "ranks x" not in one and "ranks share it" not in one


def _folder_of_jpegs(root: Path, shapes) -> Path:
    for i, (h, w) in enumerate(shapes):
        image = torch.full((3, h, w), 40 * i, dtype=torch.uint8)  # only headers are read
        (root / "class_0").mkdir(parents=True, exist_ok=True)
        (root / "class_0" / f"{i}.jpg").write_bytes(encode_jpeg(image, progressive=i == 0))
    return root


def test_doctor_reads_the_users_images(tmp_path, cli, monkeypatch):
    for name in (
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
        "GLIBC_TUNABLES",
        "LD_PRELOAD",
    ):
        monkeypatch.delenv(name, raising=False)  # glibc's malloc as it comes
    photos = _folder_of_jpegs(tmp_path / "photos", [(1500, 2000), (2448, 3264), (1600, 1200)])
    (photos / "class_0" / "broken.jpg").write_bytes(b"not a jpeg")
    out = cli("doctor", "--data", str(photos), "--batch-size", "32")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # the median of 3.00, 8.00 and 1.92 MP; the progressive one counted; the broken one named
    assert (
        "4 files; of 4 sampled: median 3.00 MP, largest 7.99 MP, 3 JPEG (1 progressive), 1 unreadable"
        in text
    )
    assert "DecodeRandomCrop(size=224)" in text and "about 1/4" in text
    assert "torchfeed.fuse(your_compose, reduced_decode=True)" in text
    # the evaluation transform keeps 7/8 of the median shorter side (1500 px): 1312 px, 1/4
    assert "(Resize(256) -> CenterCrop(224)) keeps a ~1312 px square" in text
    assert "torchfeed.fuse(your_eval_compose, reduced_decode=True)" in text
    assert "only that square, at about 1/4" in text
    assert "loader=torchfeed.decode.read_file, transform=torchfeed.fuse(" in text
    assert "~288 MB per batch of 32" in text  # 3 MP x 3 bytes x 32
    if not torch.cuda.is_available():
        assert "no GPU: run the fused transform in the workers" in text
    assert "1 of the 3 sampled are progressive JPEGs" in text and "jpegtran" in text
    if platform.libc_ver()[0] == "glibc":  # a 9 MB photo freed and allocated once a sample
        assert "a decoded image of this size (~9 MB)" in text
        assert "MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296" in text
    # the job already keeps its heap: nothing to say; with one threshold of the two, the advice
    both = {"MALLOC_TRIM_THRESHOLD_": "1000000000", "MALLOC_MMAP_THRESHOLD_": "1000000000"}
    kept = cli("doctor", "--data", str(photos), **both).stdout
    assert "MALLOC_MMAP_THRESHOLD_" not in kept and "decode only the crop window" in kept
    half = cli("doctor", "--data", str(photos), MALLOC_TRIM_THRESHOLD_="1000000000").stdout
    assert ("MALLOC_MMAP_THRESHOLD_=1073741824" in half) == (platform.libc_ver()[0] == "glibc")
    # a bigger output: the crop is fewer times the output, a smaller reduction
    assert "about 1/2" in cli("doctor", "--data", str(photos), "--size", "512").stdout
    # crops 8x the output: the progressive file loses its unread scans, nothing to re-encode
    eighth = cli("doctor", "--data", str(photos), "--size", "128").stdout
    assert "about 1/8" in eighth and "leaves out the scans it never reads" in eighth
    assert "jpegtran" not in eighth
    small = _folder_of_jpegs(tmp_path / "small", [(300, 400), (500, 375), (320, 480)])
    text = cli("doctor", "--data", str(small)).stdout
    assert "median 0.15 MP" in text
    assert "DecodeRandomCrop(size=" not in text and "MB per batch" not in text
    assert "your_eval_compose" not in text  # a 300 px square: nothing to reduce
    assert "fused transform in the workers" not in text  # small images: the main process wins
    assert "MALLOC_MMAP_THRESHOLD_" not in text  # 0.5 MB: under glibc's thresholds
    assert "progressive JPEGs" in text  # whatever their size


def test_doctor_data_errors(tmp_path, cli):
    missing = cli("doctor", "--data", str(tmp_path / "nowhere"))
    assert (
        missing.returncode == 2
        and "--data:" in missing.stderr
        and "not a directory" in missing.stderr
    )
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jpg").write_bytes(b"junk")
    unreadable = cli("doctor", "--data", str(tmp_path / "bad"))
    assert (
        unreadable.returncode == 2
        and "none of the 1 files sampled is readable" in unreadable.stderr
    )
    size = cli("doctor", "--size", "0")
    assert size.returncode == 2 and "--size must be >= 1" in size.stderr


def test_bench_large_uses_the_photo_sized_variant(tmp_path):
    result = run_cli(
        "bench", "--large", "--images", "3", "--suite", "images", "--quick", "--batch-size", "3",
        "--workers", "0", "--no-progress", "--cache-dir", str(tmp_path / "cache"),
        "--json", str(tmp_path / "o.json"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    files, _ = list_image_folder(tmp_path / "cache" / "photos-v1")
    assert len(files) == 3
    payload = json.loads((tmp_path / "o.json").read_text())
    assert payload["settings"]["large"] is True and payload["settings"]["images"] == 3
    # photo-sized crops: some are large enough to decode at a reduced scale
    assert payload["agreement"]["scaled_images"] >= 1
    assert 0 < payload["agreement"]["scaled_mean_abs_diff"] < 0.2
    assert payload["agreement"]["eval_scaled_images"] >= 1
    assert 0 < payload["agreement"]["eval_scaled_mean_abs_diff"] < 0.2


def test_bench_large_does_not_go_with_data(tmp_path, cli):
    result = cli("bench", "--large", "--data", str(tmp_path), "--no-progress")
    assert result.returncode == 2
    assert "--large chooses the built-in dataset's variant" in result.stderr


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="advice about glibc's malloc")
def test_the_heap_is_kept_when_the_job_says_how():
    assert not heap_kept({})
    assert not heap_kept({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2", "LD_PRELOAD": "libfoo.so"})
    # it takes both thresholds: either alone stops glibc adjusting the other
    assert not heap_kept({"MALLOC_TRIM_THRESHOLD_": "1"})
    assert not heap_kept({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1073741824"})
    assert heap_kept({"MALLOC_TRIM_THRESHOLD_": "1", "MALLOC_MMAP_THRESHOLD_": "1"})
    assert heap_kept(
        {"MALLOC_TRIM_THRESHOLD_": "1", "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"}
    )
    assert heap_kept(
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1:glibc.malloc.mmap_threshold=1"}
    )
    assert heap_kept({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"})
    version = platform.libc_ver()[1]
    assert describe({}) == f"glibc {version} defaults"
    assert describe(
        {"MALLOC_TRIM_THRESHOLD_": "9", "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    ) == (f"glibc {version}, MALLOC_TRIM_THRESHOLD_=9 glibc.malloc.arena_max=2")
    assert describe({"LD_PRELOAD": "libtcmalloc_minimal.so.4"}) == "tcmalloc (LD_PRELOAD)"
