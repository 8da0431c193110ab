"""``torchfeed doctor``: what this build and machine can do for an input pipeline, with advice."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import PIL.Image
import torch

from torchfeed._extension import C, build_info
from torchfeed._malloc import KEEP_HEAP_ENV, heap_kept
from torchfeed._pipeline_bench.dataset import list_image_folder
from torchfeed.decode import _reduction
from torchfeed.memory import PinnedRing
from torchfeed.memory._budget import Budget, memory_budget

__all__ = ["images_report", "report"]


def _shm_bytes() -> tuple[int, int] | None:
    try:
        usage = shutil.disk_usage("/dev/shm")
    except OSError:
        return None
    return usage.total, usage.free


def report(
    workers: int,
    batch_mb: float,
    prefetch_factor: int,
    data: Path | None = None,
    size: int = 224,
    batch_size: int = 64,
) -> str:
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
    try:
        budget: Budget | None = memory_budget()
    except ValueError as e:  # a LOCAL_WORLD_SIZE that is not a count: report, do not fail
        budget = None
        lines.append(f"host memory: {e}")
        advice.append(f"fix the environment: {e}")
    ranks = budget.processes if budget is not None else 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines.append(
        f"CPUs usable by this process: {cpus}; torch intra-op threads: {torch.get_num_threads()}"
    )
    if cpus is not None and ranks > 1 and cpus == os.cpu_count():
        # every rank torchrun started here may run on every CPU: each has its share of them
        mine = max(cpus // ranks, 1)
        if workers >= mine:
            advice.append(
                f"LOCAL_WORLD_SIZE={ranks} ranks x (num_workers={workers} + the main process) "
                f"= {ranks * (workers + 1)} processes on {cpus} CPUs: "
                + (
                    f"try num_workers={mine - 1} per rank"
                    if mine >= 2
                    else "each rank has fewer than two CPUs for its main process and its "
                    "workers, which compete for them whatever num_workers is"
                )
            )
    elif cpus is not None and workers >= cpus:
        advice.append(
            f"num_workers={workers} leaves no CPU for the main process ({cpus} usable), "
            "which runs the training step (and torchfeed's fused transform, unless it runs in "
            f"the workers): try num_workers={max(cpus - 1, 1)}"
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
    if budget is not None:
        lines.append(
            "host memory: a ring torchfeed sizes itself (zero copy, the prefetcher's) gets at "
            f"most {budget.describe(2)}" + (", all page-locked" if info["gpu_available"] else "")
        )
        if need > budget.share(2):
            advice.append(
                f"the batches in flight ({need / 1e9:.2f} GB) are more than a zero-copy ring "
                f"may take here ({budget.share(2) / 1e9:.2f} GB): its workers would wait for "
                "room; lower num_workers / prefetch_factor / batch size, or decode crop "
                "windows in the workers (torchfeed.decode.DecodeRandomCrop)"
            )
    shm = _shm_bytes()
    if shm is None:
        lines.append("/dev/shm: not found")
        advice.append("no /dev/shm: DataLoader workers cannot share batches; use num_workers=0")
    else:
        total, free = shm
        every = f"; {ranks} ranks share it: {ranks * need / 1e9:.2f} GB" if ranks > 1 else ""
        lines.append(
            f"/dev/shm: {total / 1e9:.1f} GB, {free / 1e9:.1f} GB free; the loader "
            f"needs about {need / 1e9:.2f} GB ({workers} workers x prefetch_factor "
            f"{prefetch_factor} x {batch_mb:g} MB){every}"
        )
        if ranks * need > free:
            advice.append(
                "/dev/shm is smaller than the batches in flight: workers will fail "
                "with 'bus error'; enlarge it (docker: --shm-size) or lower "
                "num_workers / prefetch_factor / batch size"
            )
    if data is not None:
        more, hints = images_report(data, size, batch_size, bool(info["gpu_available"]))
        lines += more
        advice += hints
    lines.append("")
    lines += ["advice:"] + [f"- {a}" for a in advice] if advice else ["advice: none, all good"]
    return "\n".join(lines)


# RandomResizedCrop's default scale (0.08, 1) draws a crop of about 54% of the image's area on
# average (uniform in area, cut to the image): the window a typical crop decodes.
_MEAN_CROP_AREA = 0.54


def _header(path: Path) -> tuple[int, int, str, bool] | None:
    """(height, width, format, progressive) from a file's header, nothing decoded; None for a
    file Pillow cannot read."""
    try:
        with PIL.Image.open(path) as image:
            width, height = image.size
            progressive = bool(image.info.get("progressive") or image.info.get("progression"))
            return height, width, image.format or "?", progressive
    except (OSError, SyntaxError, ValueError):  # Pillow's words for a file it cannot read
        return None


def images_report(folder: Path, size: int, batch_size: int, gpu: bool) -> tuple[list, list]:
    """Lines and advice about a folder of the user's images: their size (from up to 64 files'
    headers, spread over the folder), what a typical crop window decodes, and the pipeline that
    suits them."""
    files, _ = list_image_folder(folder)
    step = max(1, len(files) // 64)
    sampled = [_header(p) for p in files[::step][:64]]
    headers = [h for h in sampled if h is not None]
    if not headers:
        raise FileNotFoundError(f"--data: none of the {len(sampled)} files sampled is readable")
    pixels = sorted(h * w for h, w, _, _ in headers)
    median = pixels[len(pixels) // 2]
    jpegs = sum(f == "JPEG" for _, _, f, _ in headers)
    progressive = sum(p for _, _, _, p in headers)
    lines = [
        f"images under {folder}: {len(files)} files; of {len(sampled)} sampled: median "
        f"{median / 1e6:.2f} MP, largest {pixels[-1] / 1e6:.2f} MP, {jpegs} JPEG "
        f"({progressive} progressive)"
        + (f", {len(sampled) - len(headers)} unreadable" if len(headers) < len(sampled) else "")
    ]
    advice = []
    window = math.sqrt(_MEAN_CROP_AREA * median)  # a typical crop's side, in pixels
    whole_mb = median * 3 * batch_size / 1e6
    # the largest of libjpeg's scales (1/2, 1/4, 1/8) at which that crop still covers the output
    scale = _reduction(window, window, (size, size))
    # the evaluation transform, Resize(size * 8 / 7) -> CenterCrop(size) (256 -> 224), keeps a
    # square of 7/8 of the shorter side
    shorter = sorted(min(h, w) for h, w, _, _ in headers)[len(headers) // 2]
    resize = round(size * 8 / 7)
    kept = shorter * size / resize
    eval_scale = _reduction(kept, kept, (size, size))
    if jpegs:
        advice.append(
            "a per-sample transform (ImageFolder(transform=...)): ImageFolder(root, "
            "loader=torchfeed.decode.read_file, transform=torchfeed.fuse(your_compose)) hands "
            "the fused transform the file's bytes, and it decodes only the pixels its crop reads "
            "(the same output as on the decoded image)"
        )
    if scale >= 2 and jpegs:
        advice.append(
            f"a typical random crop of these images is ~{window:.0f} px a side, "
            f"{window / size:.1f}x the output ({size} px): decode it at reduced scale, per "
            "sample with torchfeed.fuse(your_compose, reduced_decode=True) on the file's bytes, "
            f"in batches with torchfeed.decode.DecodeRandomCrop(size={size}) (here about "
            f"1/{scale}: several times less decoding, pixels that differ slightly from the "
            "full-scale decode; `torchfeed bench --data` measures both)"
        )
    if eval_scale >= 2 and jpegs:
        advice.append(
            f"the evaluation transform (Resize({resize}) -> CenterCrop({size})) keeps a "
            f"~{kept:.0f} px square of these images: on the file's bytes, "
            "torchfeed.fuse(your_eval_compose, reduced_decode=True) decodes only that square, "
            f"at about 1/{eval_scale} (scripts/reduced_decode_effect.py DIR measures the "
            "difference and the speed)"
        )
    if progressive:
        eighth = scale == 8
        advice.append(
            f"{progressive} of the {len(headers)} sampled are progressive JPEGs, whose every scan "
            "libjpeg decodes before the first row comes out: the window decoder stops each scan "
            "at the crop's last row, but decodes all of them down to there (on the bench's large "
            "photos 2-3x a sequential file's decode); "
            + (
                "at 1/8, as here, it also leaves out the scans it never reads "
                "(3.4-5.9x faster on the bench's progressive photos)"
                if eighth
                else "only at 1/8 scale (crops 8x the output) can it leave out scans; "
                "re-encoding them sequential, losslessly (jpegtran -copy all -optimize in.jpg > "
                "out.jpg), saves the rest"
            )
        )
    if median >= 1_000_000:
        if not heap_kept(os.environ):
            settings = " ".join(f"{k}={v}" for k, v in KEEP_HEAP_ENV.items())
            advice.append(
                f"a decoded image of this size (~{median * 3 / 1e6:.0f} MB) is allocated and freed "
                "once a sample, and glibc's malloc gives memory that large back to the system and "
                "maps it anew: every sample's pixels are written into fresh pages, a page fault a "
                "page (on the bench's large photos and on 35 real photographs, on a 2-vCPU VM, the "
                "torchvision pipeline took 1.15-1.29x more CPU than with the setting below; "
                "torchfeed's reduced-scale crops, whose windows are small, about the same). Start "
                "the job with "
                f"{settings} in its environment (DataLoader workers inherit it; each process then "
                "keeps the heap it has used); scripts/malloc_effect.py DIR measures the difference "
                "on your images"
            )
        advice.append(
            f"whole decoded images of this size are ~{whole_mb:.0f} MB per batch of "
            f"{batch_size}: decode only the crop window in the workers (DecodeRandomCrop) "
            "rather than shipping whole images to the main process"
        )
        if not gpu:  # measured: in the workers wins on photos, in the main process on small ones
            advice.append(
                "no GPU: run the fused transform in the workers, ImageCollate(transform=...) "
                "in torchfeed.loader(..., zero_copy=True); on images this size the main "
                "process would otherwise compete with the workers for the CPUs"
            )
    return lines, advice
