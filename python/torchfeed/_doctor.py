"""``torchfeed doctor``: what this build and machine can do for an input pipeline, with advice."""

from __future__ import annotations

import os
import shutil

import torch

from torchfeed._extension import C, build_info
from torchfeed.memory import PinnedRing

__all__ = ["report"]


def _shm_bytes() -> tuple[int, int] | None:
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None
    return usage.total, usage.free


def report(workers: int, batch_mb: float, prefetch_factor: int) -> str:
    info = build_info()
    lines = ["torchfeed doctor", ""]
    lines.append(
        f"torchfeed {info['version']}, built against torch {info['torch_version']} "
        f"(running {info['torch_version_now']})"
    )
    lines.append(
        "CUDA kernels: "
        + (
            f"compiled for sm {', '.join(info['cuda_archs'])} (CUDA {info['cuda_version']})"
            if info["cuda_compiled"]
            else "not compiled"
        )
    )
    lines.append(f"CPU kernels: {C.cpu_isa()} instruction set")
    advice = []
    if info["jpeg"]:
        lines.append(f"crop-window JPEG decoding (torchfeed.decode): {info['jpeg']}")
    else:
        lines.append(
            "crop-window JPEG decoding (torchfeed.decode): not built, decodes whole images"
        )
        advice.append(
            "torchfeed.decode decodes whole JPEGs here: install libjpeg-turbo's headers (Debian/"
            "Ubuntu: libjpeg-turbo8-dev or libjpeg62-turbo-dev) and rebuild to decode only "
            "the crop"
        )
    if info["gpu_available"]:
        lines.append(f"GPU: {info['gpu_name']} ({torch.cuda.device_count()} visible)")
        try:
            ring = PinnedRing(1 << 20, pinned=True)
            lines.append(f"pinned memory: available (a 1 MiB page-locked ring: {ring.pinned})")
            ring.close()
        except Exception as e:  # report, do not fail
            lines.append(f"pinned memory: NOT available ({e})")
            advice.append("page-locked memory failed: check `ulimit -l` and the driver")
        if not info["cuda_compiled"]:
            advice.append(
                "a GPU is present but this build has no CUDA kernels: rebuild with "
                "TORCHFEED_CUDA=ON and nvcc on PATH"
            )
    else:
        lines.append("GPU: none usable (kernels run on the CPU; pinned memory is not available)")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines.append(
        f"CPUs usable by this process: {cpus}; torch intra-op threads: {torch.get_num_threads()}"
    )
    if cpus is not None and workers >= cpus:
        advice.append(
            f"num_workers={workers} leaves no CPU for the main process ({cpus} usable): with "
            "torchfeed's fused transform running in the main process, try "
            f"num_workers={max(cpus - 1, 1)}"
        )
    threads = torch.get_num_threads()
    if (
        cpus is not None
        and workers > 0
        and workers + threads > cpus
        and torch.backends.openmp.is_available()
        and "OMP_WAIT_POLICY" not in os.environ
    ):
        advice.append(
            f"{workers} workers + {threads} OpenMP threads in the main process > {cpus} CPUs: "
            "OpenMP threads spin-wait after each parallel op and take CPU time the workers "
            "need; start the job with OMP_WAIT_POLICY=PASSIVE (or torch.set_num_threads(1) "
            "in the main process)"
        )
    need = workers * prefetch_factor * batch_mb * 1e6
    shm = _shm_bytes()
    if shm is None:
        lines.append("/dev/shm: not found")
        advice.append("no /dev/shm: DataLoader workers cannot share batches; use num_workers=0")
    else:
        total, free = shm
        lines.append(
            f"/dev/shm: {total / 1e9:.1f} GB, {free / 1e9:.1f} GB free; the loader "
            f"needs about {need / 1e9:.2f} GB ({workers} workers x prefetch_factor "
            f"{prefetch_factor} x {batch_mb:g} MB)"
        )
        if need > free:
            advice.append(
                "/dev/shm is smaller than the batches in flight: workers will fail "
                "with 'bus error'; enlarge it (docker: --shm-size) or lower "
                "num_workers / prefetch_factor / batch size"
            )
    lines.append("")
    lines += ["advice:"] + [f"- {a}" for a in advice] if advice else ["advice: none, all good"]
    return "\n".join(lines)
