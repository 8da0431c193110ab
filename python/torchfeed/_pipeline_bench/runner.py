"""Times a DataLoader pipeline epoch by epoch: the first epoch is start-up (workers, caches) and
reported apart; the rest give the median throughput."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from torchfeed._pipeline_bench import resources

__all__ = ["PipelineResult", "rerun_baseline", "run_bracketed", "run_epochs"]


@dataclass
class PipelineResult:
    pipeline: str
    config: str
    samples_per_epoch: int
    epoch_seconds: list[float] = field(default_factory=list)
    first_epoch_seconds: float = float("nan")
    cpu_seconds: float | None = None  # all processes, over the timed epochs
    peak_memory_bytes: int | None = None  # the process tree's peak PSS above its start
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median_epoch_seconds(self) -> float:
        return statistics.median(self.epoch_seconds) if self.epoch_seconds else float("nan")

    @property
    def samples_per_second(self) -> float:
        return self.samples_per_epoch / self.median_epoch_seconds

    @property
    def cpu_ms_per_sample(self) -> float | None:
        """CPU time (the main process and its workers, every thread) per sample delivered."""
        samples = self.samples_per_epoch * len(self.epoch_seconds)
        if self.cpu_seconds is None or samples == 0:
            return None
        return 1e3 * self.cpu_seconds / samples

    def row(self) -> dict[str, Any]:
        timed = self.epoch_seconds or [float("nan")]
        return {
            "pipeline": self.pipeline,
            "config": self.config,
            "samples_per_s": self.samples_per_second,
            "epoch_s": self.median_epoch_seconds,
            # the spread of the timed epochs: what tells a real difference from this run's noise
            "epoch_min_s": min(timed),
            "epoch_max_s": max(timed),
            "epoch_range": f"{min(timed):.2f}-{max(timed):.2f}" if self.epoch_seconds else None,
            "first_epoch_s": self.first_epoch_seconds,
            "samples_per_epoch": self.samples_per_epoch,
            "cpu_ms_per_sample": self.cpu_ms_per_sample,
            "peak_mb": None if self.peak_memory_bytes is None else self.peak_memory_bytes / 2**20,
            **self.extra,
        }


def progress(iterable: Iterable, total: int, desc: str, enabled: bool):
    """tqdm when it is installed and wanted, else the iterable itself."""
    if not enabled:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, leave=False, unit="batch")


def run_epochs(
    pipeline: str,
    config: str,
    make_iterable: Callable[[], Iterable],
    consume: Callable[[Any], int],
    epochs: int,
    batches_per_epoch: int,
    show_progress: bool = True,
) -> PipelineResult:
    """Runs ``epochs + 1`` epochs of ``make_iterable()`` (created once, so persistent workers
    stay up); ``consume(batch)`` does the step's use of a batch and returns its sample count.
    Also measures the CPU time of the timed epochs and the peak memory of all of them."""
    resources.release_freed_memory()  # every pipeline starts from the same, compact process
    meter = resources.ProcessTreeMeter().start()
    iterable = make_iterable()
    result = PipelineResult(pipeline, config, samples_per_epoch=0)
    cpu_start = meter_start = None
    for epoch in range(epochs + 1):
        if epoch == 1 and resources.supported():
            cpu_start, meter_start = meter.cpu_and_metering()
        seen = 0
        start = time.perf_counter()
        desc = f"{pipeline} [{config}] epoch {epoch}{' (start-up)' if epoch == 0 else ''}"
        for batch in progress(iterable, batches_per_epoch, desc, show_progress):
            seen += consume(batch)
        elapsed = time.perf_counter() - start
        if epoch == 0:
            result.first_epoch_seconds = elapsed
        else:
            result.epoch_seconds.append(elapsed)
        result.samples_per_epoch = seen
    if cpu_start is not None and meter_start is not None:
        # the pipeline's CPU, without the meter's own samples (taken in this process); both
        # read between samples, or a sample half inside the interval is taken out whole
        cpu_end, meter_end = meter.cpu_and_metering()
        result.cpu_seconds = (cpu_end - cpu_start) - (meter_end - meter_start)
    peak = meter.stop()
    if peak is not None and meter.before is not None:
        # the pipeline's own: what the tree held at most above what it held before it started
        # (the main process keeps the earlier pipelines' freed heap, which is not this one's)
        result.peak_memory_bytes = peak - meter.before
    close = getattr(iterable, "close", None)
    if close is not None:
        close()
    del iterable
    gc.collect()  # persistent workers of this pipeline go now, not during the next one
    return result


def rerun_baseline(results: list[PipelineResult], again: PipelineResult) -> None:
    """Folds a second run of a baseline, timed after the other pipelines of its config, into its
    first run's result (the one in ``results`` with the same pipeline and config): every timed
    epoch of both runs (so the median and the spread cover both), the first run's start-up
    epoch, the CPU of both, the higher peak; ``extra["baseline_runs_per_s"]`` keeps each run's own
    samples/s. On a shared machine the conditions drift over a run of minutes (here a baseline
    took 3.45 s an epoch in one run and 4.18 s in the next, where the best pipeline took
    1.51 s and 1.42 s): timed once, first, the baseline meets only the start of the run, and every
    ratio inherits wherever that fell; timed before and after, it brackets the others."""
    first = next(r for r in results if (r.pipeline, r.config) == (again.pipeline, again.config))
    runs = [first.samples_per_second, again.samples_per_second]
    first.epoch_seconds += again.epoch_seconds
    if first.cpu_seconds is None or again.cpu_seconds is None:
        first.cpu_seconds = None
    else:
        first.cpu_seconds += again.cpu_seconds
    peaks = [p for p in (first.peak_memory_bytes, again.peak_memory_bytes) if p is not None]
    first.peak_memory_bytes = max(peaks) if peaks else None
    first.extra["baseline_runs_per_s"] = runs


def run_bracketed(
    names: Iterable[str], timed: Callable[[str], PipelineResult], baseline: str
) -> list[PipelineResult]:
    """``timed(name)`` for each pipeline of a config in turn, then the baseline once more, folded
    into its first run (:func:`rerun_baseline`) when there was anything to bracket."""
    names = list(names)
    results = [timed(name) for name in names]
    if len(names) > 1:
        rerun_baseline(results, timed(baseline))
    return results
