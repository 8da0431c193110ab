"""The bench's CPU and memory meters: a worker's CPU and memory are counted, shared pages once."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from torchfeed._pipeline_bench import dataset, resources

pytestmark = pytest.mark.skipif(not resources.supported(), reason="needs Linux's /proc")


def spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_childs_cpu_is_counted_while_it_runs_and_after_it_exits():
    ctx = mp.get_context("fork")
    before = resources.tree_cpu_seconds()
    child = ctx.Process(target=spin, args=(0.6,))
    child.start()
    time.sleep(0.45)
    live = resources.tree_cpu_seconds() - before  # the child is alive and spinning
    child.join()
    after = resources.tree_cpu_seconds() - before  # reaped: counted through RUSAGE_CHILDREN
    assert live > 0.1
    assert 0.55 < after < 2.0


def hold(megabytes: int, ready, done) -> None:
    block = bytearray(megabytes * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touch every page
    ready.set()
    done.wait(10)


def test_the_peak_includes_a_childs_memory():
    ctx = mp.get_context("fork")
    meter = resources.ProcessTreeMeter(interval=0.02).start()
    base = meter.peak
    ready, done = ctx.Event(), ctx.Event()
    child = ctx.Process(target=hold, args=(256, ready, done))
    child.start()
    assert ready.wait(10)
    meter.sample()
    done.set()
    child.join()
    peak = meter.stop()
    assert base is not None and peak is not None
    # Not 256 MiB to the byte: Pss splits each shared page among every process on the machine that
    # maps it, so the tree's other pages shrink or grow while other processes map the same
    # libraries (under pytest -n 2 the other worker's DataLoader workers moved the sum by 10 MiB
    # in CI). A meter that missed the child would see a rise of about nothing.
    assert peak - base > 200 * 2**20


def test_the_meter_spends_a_bounded_share_of_a_core_and_counts_it():
    """Asked to sample as often as it can, the meter still waits long enough between samples
    to spend about 5% of one core (a sample walks every mapping of each process), and it counts
    what it spent, for the bench to leave out of a pipeline's CPU time."""
    began = time.monotonic()
    meter = resources.ProcessTreeMeter(interval=0.0, budget=0.05).start()
    time.sleep(1.5)
    meter.stop()
    elapsed = time.monotonic() - began
    # Paced on its total, it overspends by at most the sample that crossed the budget and the one
    # stop() takes. The bound uses the costliest sample it took, not one measured at another
    # moment: a sample's cost moves with the load (CI once saw 17 ms probed, more in the run).
    assert 0 < meter.longest_sample <= meter.cpu_seconds
    assert meter.cpu_seconds <= 0.05 * elapsed + 2 * meter.longest_sample + 0.005


def test_the_photo_sized_variant():
    sizes = []
    for i in range(5):
        image = dataset.synthetic_photo(i)
        assert image.dtype.is_floating_point is False and image.shape[0] == 3
        sizes.append(image.shape[1] * image.shape[2])
    assert all(2e6 <= s <= 12.1e6 for s in sizes), sizes
    assert dataset.photo_encoding(0)["progressive"] and not dataset.photo_encoding(1)["progressive"]
    assert dataset.synthetic_photo(3).equal(dataset.synthetic_photo(3))  # deterministic


def test_the_bench_measures_the_same_files_whatever_the_cache_holds(tmp_path, monkeypatch):
    # a cache an earlier run filled further (--images 12, then the default): the first 5 files
    # are the ones a fresh cache gives, in the order they were made, every class among them
    small = [torch.full((3, 2, 2), i, dtype=torch.uint8) for i in range(12)]
    monkeypatch.setattr(dataset, "synthetic_image", lambda i, seed=0: small[i])
    fresh = dataset.ensure_builtin_dataset(5, tmp_path / "fresh", classes=5)
    full = dataset.ensure_builtin_dataset(12, tmp_path / "full", classes=5)
    want = [fresh / f"class_{i:02d}" / f"{i:05d}.jpg" for i in range(5)]
    assert dataset.builtin_files(fresh, 5, classes=5) == (want, [0, 1, 2, 3, 4])
    files, labels = dataset.builtin_files(full, 5, classes=5)
    assert [p.relative_to(full) for p in files] == [p.relative_to(fresh) for p in want]
    assert labels == [0, 1, 2, 3, 4]
    # what a listing of the folder gives instead: two classes' files
    _, listed_labels = dataset.list_image_folder(full, 5)
    assert set(listed_labels) == {0, 1}
    with pytest.raises(FileNotFoundError, match="7 of the 12 built-in files are missing"):
        dataset.builtin_files(fresh, 12, classes=5)


def test_the_bench_samples_a_users_folder_across_its_classes(tmp_path):
    for name in ("apples", "pears", "plums"):
        (tmp_path / name).mkdir()
        for i in range(6):
            (tmp_path / name / f"{i}.jpg").write_bytes(b"")  # listed, never read here
    everything, _ = dataset.list_image_folder(tmp_path)
    files, labels = dataset.sample_image_folder(tmp_path, 5)
    assert len(files) == 5 and set(files) < set(everything)
    assert len(set(labels)) >= 2  # the first 5 by name would be all apples
    assert all(labels[k] == everything.index(f) // 6 for k, f in enumerate(files))
    assert dataset.sample_image_folder(tmp_path, 5) == (files, labels)  # the same every run
    whole, _ = dataset.sample_image_folder(tmp_path)
    assert whole[:5] == files and sorted(whole) == everything
    assert whole != everything  # shuffled, as a training loader's sampler would


def test_the_bench_says_which_pipeline_to_pick():
    from torchfeed._pipeline_bench.report import pick

    def row(name, config, rate, speedup, cpu, peak):
        return {"pipeline": name, "config": config, "samples_per_s": rate, "speedup": speedup,
                "cpu_ms_per_sample": cpu, "peak_mb": peak}  # fmt: skip

    rows = [
        row("images: base", "workers=2", 10.0, 1.0, 90.0, 900.0),
        row("images: whole images", "workers=2", 7.0, 0.7, 120.0, 8000.0),
        row("images: windows", "workers=2", 25.0, 2.5, 40.0, 700.0),
        row("images: windows, in workers", "workers=2", 24.0, 2.4, 35.0, 650.0),
        row("images: base", "workers=0", 5.0, 1.0, 90.0, 400.0),
        row("images: windows", "workers=0", 12.0, 2.4, 40.0, 300.0),
    ]
    lines = pick(rows, {"images": "images: base"})
    assert lines == [
        "pick (images, workers=2): 'windows', 2.50x at 40.0 CPU ms/sample; least CPU: "
        "'windows, in workers', 35.0 ms/sample (2.40x)",
        "  slower than the baseline here: 'whole images' 0.70x, peak 8,000 MB",
        "pick (images, workers=0): 'windows', 2.40x at 40.0 CPU ms/sample",
    ]


def measured_row(name, epochs, first, samples=100):
    """A pipeline's row as the bench reports it, timed against a baseline whose median epoch
    is 1.0 s."""
    from torchfeed._pipeline_bench.runner import PipelineResult

    r = PipelineResult(name, "workers=2", samples_per_epoch=samples, epoch_seconds=epochs)
    r.first_epoch_seconds = first
    out = r.row()
    out["speedup"] = 1.0 / r.median_epoch_seconds
    return out


def test_the_bench_tells_a_slower_pipeline_and_a_slow_first_epoch_from_noise():
    from torchfeed._pipeline_bench.report import pick

    base = measured_row("images: base", [0.9, 1.0, 1.2], 1.1)
    assert base["epoch_range"] == "0.90-1.20" and base["epoch_min_s"] == 0.9
    lines = pick(
        [
            base,
            measured_row(
                "images: noisy", [1.05, 1.1, 1.3], 1.2
            ),  # fastest epoch beats base's slowest
            measured_row(
                "images: slow", [1.3, 1.4, 1.5], 1.4
            ),  # every epoch slower than base's slowest
            measured_row(
                "images: windows", [0.4, 0.5, 0.9], 1.3
            ),  # 2.6x the median, 1.4x the slowest
            measured_row("images: cold", [0.4, 0.5, 0.6], 1.0),  # 2.0x the median, 1.7x the slowest
        ],
        {"images": "images: base"},
    )
    assert lines[1:] == [
        "  slower than the baseline here: 'noisy' 0.91x (within this run's noise: its fastest "
        "epoch, 1.05 s, beat the baseline's slowest, 1.20 s); 'slow' 0.71x",
        "  first epoch over 1.5x the median of the later ones: 'windows' 2.60x (1.30 s; later "
        "epochs 0.40-0.90 s; within 1.5x of the slowest of them: this run's noise); 'cold' "
        "2.00x (1.00 s; later epochs 0.40-0.60 s)",
    ]


def test_the_bench_says_when_a_slow_first_epoch_is_a_short_one():
    from torchfeed._pipeline_bench.report import pick

    def notes(samples, batch_size, suite="images"):
        rows = [
            measured_row(f"{suite}: base", [1.0] * 3, 1.0, samples),
            measured_row(f"{suite}: cold", [1.0] * 3, 3.0, samples),
        ]
        return [
            line
            for line in pick(rows, {suite: f"{suite}: base"}, batch_size)
            if "(an epoch" in line
        ]

    assert notes(128, 64) == [
        "  (an epoch here is 2 batches of 64: what a pipeline pays once, its workers' first "
        "batches and the memory they first write, weighs on it in full; more samples (--images) "
        "give longer epochs)"
    ]
    assert notes(10, 64)[0].startswith("  (an epoch here is 1 batch of 64:")
    assert "(--text-samples)" in notes(100, 64, suite="text")[0]
    assert notes(640, 64) == []  # ten batches: not short
    assert notes(128, None) == []  # no batch size: nothing said


def test_a_baseline_timed_again_after_the_others_brackets_them():
    from torchfeed._pipeline_bench.report import baseline_runs, with_speedup
    from torchfeed._pipeline_bench.runner import PipelineResult, rerun_baseline

    def result(name, epochs, cpu, peak, first=9.0):
        r = PipelineResult(name, "workers=2", samples_per_epoch=100, epoch_seconds=list(epochs))
        r.first_epoch_seconds, r.cpu_seconds, r.peak_memory_bytes = first, cpu, peak
        return r

    base = result("images: base", [1.0, 1.0, 1.1], 6.0, 500)
    ours = result("images: ours", [0.5, 0.5, 0.5], 2.0, 900)
    other_config = result("images: base", [2.0, 2.0, 2.0], 8.0, 100)
    other_config.config = "workers=0"
    results = [base, ours, other_config]
    rerun_baseline(results, result("images: base", [1.5, 1.5, 1.6], 9.0, 700, first=3.0))
    # the first run's result holds both runs: its median and spread cover both, its start-up is
    # the first run's, its CPU is both runs' over both runs' samples, its peak the higher one
    assert base.epoch_seconds == [1.0, 1.0, 1.1, 1.5, 1.5, 1.6]
    assert base.median_epoch_seconds == pytest.approx(1.3) and base.first_epoch_seconds == 9.0
    assert base.cpu_ms_per_sample == pytest.approx(1e3 * 15.0 / 600)
    assert base.peak_memory_bytes == 700
    assert base.extra["baseline_runs_per_s"] == [pytest.approx(100 / 1.0), pytest.approx(100 / 1.5)]
    assert other_config.epoch_seconds == [2.0, 2.0, 2.0] and not other_config.extra
    rows = with_speedup(results, "images: base")
    assert rows[1]["speedup"] == pytest.approx(1.3 / 0.5)
    assert rows[0]["epoch_range"] == "1.00-1.60"
    assert baseline_runs(rows) == [
        "baseline (images, workers=2): 100.00 samples/s timed first, 66.67 timed again after "
        "the others (-33%); its row is both runs' epochs"
    ]
    # the CPU of a run the meter could not read is not guessed
    rerun_baseline(results, result("images: base", [1.0], None, None))
    assert base.cpu_seconds is None and base.peak_memory_bytes == 700


def test_each_suite_times_its_baseline_first_and_again_last():
    from torchfeed._pipeline_bench.runner import PipelineResult, run_bracketed

    calls = []

    def timed(name):
        calls.append(name)
        return PipelineResult(name, "workers=2", samples_per_epoch=10, epoch_seconds=[1.0])

    results = run_bracketed(["base", "ours", "other"], timed, "base")
    assert calls == ["base", "ours", "other", "base"]
    assert [r.pipeline for r in results] == ["base", "ours", "other"]
    assert results[0].epoch_seconds == [1.0, 1.0] and "baseline_runs_per_s" in results[0].extra
    calls.clear()
    (alone,) = run_bracketed(["base"], timed, "base")  # nothing to bracket
    assert calls == ["base"] and alone.epoch_seconds == [1.0]
