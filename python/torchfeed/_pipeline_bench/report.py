"""Machine facts, timing statistics and the printed table of ``torchfeed bench``."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torchvision

from torchfeed import _malloc as malloc
from torchfeed._extension import build_info, physical_memory
from torchfeed.memory._budget import Budget, cgroup_memory_limit

__all__ = [
    "baseline_runs",
    "format_machine",
    "format_table",
    "machine_info",
    "pick",
    "plot",
    "print_report",
    "with_speedup",
]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    info = build_info()
    memory = Budget(physical_memory(), cgroup_memory_limit(), processes=1)
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        # what the peak-memory column is set against (a container's limit only when lower)
        "memory_gb": round(memory.machine / 1e9, 1),
        "memory_limit_gb": round(memory.memory / 1e9, 1) if memory.limited else None,
        "torch_threads": torch.get_num_threads(),
        "gpu": info["gpu_name"],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "torchfeed": info["version"],
        "torchfeed_cuda_kernels": info["cuda_compiled"],
        # glibc's defaults give decoded photos' memory back and map it anew every sample: on
        # photos a fifth of the baseline's CPU (docs/benchmarks.md); the workers inherit this
        "malloc": malloc.describe(os.environ),
    }


def format_table(rows: Iterable[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A plain-text table; ``columns`` are (key, header) pairs."""
    rows = list(rows)
    cells = [[header for _, header in columns]]
    for row in rows:
        cells.append([_cell(row.get(key)) for key, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = []
    for n, r in enumerate(cells):
        padded = [
            c.rjust(w) if n and i else c.ljust(w)  # numbers right-aligned, names left
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ]
        lines.append("  ".join(padded))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def format_machine(info: dict[str, Any]) -> str:
    gpu = info["gpu"] or "none"
    return (
        f"machine: {info['cpu']} ({info['usable_cpus']} usable CPUs, torch threads "
        f"{info['torch_threads']}; {_memory(info)}), GPU: {gpu}; python {info['python']}, "
        f"torch {info['torch']}, torchvision {info['torchvision']}, torchfeed {info['torchfeed']} "
        "(CUDA kernels "
        f"{'compiled' if info['torchfeed_cuda_kernels'] else 'not compiled'}); malloc: "
        f"{info.get('malloc', 'not recorded')}"
    )


def _memory(info: dict[str, Any]) -> str:
    memory = info.get("memory_gb")
    if memory is None:  # a JSON of an earlier version
        return "memory not recorded"
    limit = info.get("memory_limit_gb")
    return f"{memory} GB memory" + (f", {limit} GB container limit" if limit else "")


def with_speedup(results, baseline: str) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        row = r.row()
        base = next(b for b in results if b.pipeline == baseline and b.config == r.config)
        row["speedup"] = r.samples_per_second / base.samples_per_second
        rows.append(row)
    return rows


def baseline_runs(rows: list[dict[str, Any]]) -> list[str]:
    """A line per baseline timed twice (runner.rerun_baseline): each run's samples/s, and how far
    apart they are, the drift of the machine over the run that every ratio shares."""
    lines = []
    for row in rows:
        runs = row.get("baseline_runs_per_s")
        if not runs:
            continue
        before, after = runs
        lines.append(
            f"baseline ({row['pipeline'].split(':')[0]}, {row['config']}): {before:,.2f} samples/s "
            f"timed first, {after:,.2f} timed again after the others "
            f"({100 * (after / before - 1):+.0f}%); its row is both runs' epochs"
        )
    return lines


FIRST_EPOCH_BOUND = 1.5  # a first epoch slower than this times a later one is pointed out
# Epochs of fewer batches than this are short: a start-up cost paid once weighs on them in full.
SHORT_EPOCH_BATCHES = 8


def pick(
    rows: list[dict[str, Any]], baselines: Mapping[str, str], batch_size: int | None = None
) -> list[str]:
    """Which pipeline to pick, per suite and config, from the measured rows: the fastest, the
    one spending the least CPU per sample when that is another, those slower than the baseline
    (with their peak memory: the pipelines that ship whole decoded images) and those whose first
    epoch took over ``FIRST_EPOCH_BOUND`` times a later one; each of the last two says whether
    the difference stays within the run's epoch-to-epoch spread (``epoch_min_s``,
    ``epoch_max_s``), where this run cannot tell it from noise. With ``batch_size``, a slow first
    epoch of fewer than ``SHORT_EPOCH_BATCHES`` batches is said to be short."""
    lines = []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["pipeline"].split(":")[0], row["config"]), []).append(row)
    for (suite, config), part in groups.items():
        ours = [r for r in part if r["pipeline"] != baselines.get(suite)]
        if not ours:
            continue
        best = max(ours, key=lambda r: r["samples_per_s"])
        line = f"pick ({suite}, {config}): '{_short(best)}', {best['speedup']:.2f}x"
        cpu = [r for r in ours if r.get("cpu_ms_per_sample")]
        if cpu:
            lean = min(cpu, key=lambda r: r["cpu_ms_per_sample"])
            line += f" at {best['cpu_ms_per_sample']:.1f} CPU ms/sample"
            if lean is not best:
                line += (
                    f"; least CPU: '{_short(lean)}', {lean['cpu_ms_per_sample']:.1f} ms/sample "
                    f"({lean['speedup']:.2f}x)"
                )
        lines.append(line)
        base = next((r for r in part if r["pipeline"] == baselines.get(suite)), None)
        slow = [r for r in ours if r["speedup"] < 1.0]
        if slow:
            lines.append(
                "  slower than the baseline here: " + "; ".join(_slower(r, base) for r in slow)
            )
        late = [r for r in part if _first_epoch_ratio(r) > FIRST_EPOCH_BOUND]
        if late:
            lines.append(
                f"  first epoch over {FIRST_EPOCH_BOUND}x the median of the later ones: "
                + "; ".join(_late(r) for r in late)
            )
            batches = _batches_per_epoch(late[0], batch_size)
            if batches is not None and batches < SHORT_EPOCH_BATCHES:
                lines.append(
                    f"  (an epoch here is {batches} batch{'es' if batches > 1 else ''} of "
                    f"{batch_size}: what a pipeline pays once, its workers' first batches and "
                    "the memory they first write, weighs on it in full; more samples "
                    f"({'--images' if suite == 'images' else '--text-samples'}) give longer "
                    "epochs)"
                )
    return lines


def _batches_per_epoch(row: dict[str, Any], batch_size: int | None) -> int | None:
    samples = row.get("samples_per_epoch")
    if not batch_size or not samples:
        return None
    return -(-int(samples) // batch_size)


def _slower(row: dict[str, Any], base: dict[str, Any] | None) -> str:
    text = f"'{_short(row)}' {row['speedup']:.2f}x"
    if row.get("peak_mb"):
        text += f", peak {row['peak_mb']:,.0f} MB"
    fastest, slowest = row.get("epoch_min_s"), (base or {}).get("epoch_max_s")
    if fastest is not None and slowest is not None and fastest <= slowest:
        text += (
            f" (within this run's noise: its fastest epoch, {fastest:.2f} s, beat the "
            f"baseline's slowest, {slowest:.2f} s)"
        )
    return text


def _first_epoch_ratio(row: dict[str, Any]) -> float:
    first, median = row.get("first_epoch_s"), row.get("epoch_s")
    if first is None or not median or median != median:
        return float("nan")  # comparisons with nan are false: not pointed out
    return first / median


def _late(row: dict[str, Any]) -> str:
    first, slowest = row["first_epoch_s"], row.get("epoch_max_s")
    text = f"'{_short(row)}' {_first_epoch_ratio(row):.2f}x ({first:.2f} s"
    if row.get("epoch_range"):
        text += f"; later epochs {row['epoch_range']} s"
    if slowest is not None and first <= slowest * FIRST_EPOCH_BOUND:
        text += f"; within {FIRST_EPOCH_BOUND}x of the slowest of them: this run's noise"
    return text + ")"


def _short(row: dict[str, Any]) -> str:
    return row["pipeline"].split(": ", 1)[-1]


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "--plot: matplotlib is not installed (pip install matplotlib); no chart written",
            file=sys.stderr,
        )
        return
    suites = sorted({r["pipeline"].split(":")[0] for r in rows})
    fig, axes = plt.subplots(
        len(suites), 1, figsize=(10, 0.45 * len(rows) + 1.5 * len(suites)), squeeze=False
    )
    for ax, suite in zip(axes[:, 0], suites, strict=True):
        part = [r for r in rows if r["pipeline"].split(":")[0] == suite]
        labels = [f"{r['pipeline'].split(': ', 1)[1]} [{r['config']}]" for r in part]
        colors = ["#999" if r["speedup"] == 1.0 else "#2a7" for r in part]  # baselines grey
        ax.barh(range(len(part)), [r["samples_per_s"] for r in part], color=colors)
        for i, r in enumerate(part):
            ax.text(r["samples_per_s"], i, f" {r['speedup']:.2f}x", va="center", fontsize=7)
        ax.set_yticks(range(len(part)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{suite}: samples/s, speedup over the suite's baseline", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_report(
    payload: dict[str, Any],
    rows: list[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    baselines: Mapping[str, str],
) -> None:
    """The tables ``torchfeed bench`` prints: results, where the time goes, the agreement of the
    pipelines, skipped files, the machine. ``baselines``: suite -> its baseline pipeline."""
    suites = list(baselines)

    settings = payload["settings"]
    epochs, batch_size, device = settings["epochs"], settings["batch_size"], settings["device"]
    print(format_table(rows, columns))
    print(
        f"speedup: samples/s over the baseline of its suite with the same config (images: "
        f"'{baselines.get('images', '-')}'; text: '{baselines.get('text', '-')}'); "
        f"median of {epochs} epoch(s) after a start-up epoch (a baseline: timed before and "
        f"again after the others, the median of both runs' epochs); batch size {batch_size}; "
        f"device {device}; CPU ms/sample: every process (workers too) over the timed epochs; "
        "peak MB: the most the process tree held (PSS) above what it held before the pipeline"
    )
    for line in baseline_runs(rows) + pick(rows, baselines, batch_size):
        print(line)
    if "images" in suites:
        print()
        print(f"where the time goes, ms per batch of {batch_size} (measured one stage at a time):")
        print(
            format_table(
                payload["stages"],
                [
                    ("stage", "stage"),
                    ("baseline_ms", "baseline"),
                    ("torchfeed_ms", "torchfeed"),
                    ("zero_copy_ms", "torchfeed zero-copy"),
                    ("window_ms", "zero-copy + crop-window decode"),
                    ("scaled_ms", "... at reduced scale"),
                ],
            )
        )
        a = payload["agreement"]
        print(
            f"pipelines agree: the same {a['images']} images and parameters give outputs within "
            f"{a['max_abs_diff']:.4f} of each other (bound {a['bound']:.4f}: torchvision rounds "
            "to uint8 after resizing, torchfeed does not); crop-window decoding (and the fused "
            "transform on the file's bytes) gives the full-decode result within "
            f"{a['window_max_abs_diff']:.1e} (bound {a['window_bound']:.0e})"
        )
        print(
            f"decoding at reduced scale ({a['scaled_images']} of the {a['images']} crops were "
            f"large enough to reduce) differs from the full-scale result by "
            f"{a['scaled_mean_abs_diff']:.4f} on average and {a['scaled_max_abs_diff']:.3f} at "
            "most (normalized units: one uint8 level is ~0.017); the evaluation transform "
            f"(Resize(256) -> CenterCrop(224)) with reduced_decode ({a['eval_scaled_images']} "
            f"of {a['images']} reduced) by {a['eval_scaled_mean_abs_diff']:.4f} on average and "
            f"{a['eval_scaled_max_abs_diff']:.3f} at most"
        )
        if payload["skipped_files"]:
            print(
                f"skipped {len(payload['skipped_files'])} unreadable file(s): "
                + ", ".join(payload["skipped_files"])
            )
    print(format_machine(payload["machine"]))
