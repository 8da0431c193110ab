"""Machine facts, timing statistics and the printed table of ``torchfeed bench``."""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import torch


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
    import torchvision

    import torchfeed

    info = torchfeed.build_info()
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "gpu": info["gpu_name"],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "torchfeed": info["version"],
        "torchfeed_cuda_kernels": info["cuda_compiled"],
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
        f"{info['torch_threads']}), GPU: {gpu}; python {info['python']}, torch {info['torch']}, "
        f"torchvision {info['torchvision']}, torchfeed {info['torchfeed']} (CUDA kernels "
        f"{'compiled' if info['torchfeed_cuda_kernels'] else 'not compiled'})"
    )
