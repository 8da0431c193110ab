"""The ``torchfeed`` command.

- ``torchfeed bench``: the usual input pipeline and the torchfeed pipeline on the same data
  (built-in JPEGs and token sequences, or your image folder), with samples/s, speedups, epoch
  times, where the time goes, and the machine.
- ``torchfeed doctor``: what this machine and build can do, and advice for the loader.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _workers(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--workers must be a comma-separated list of integers, got {text!r}"
        ) from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--workers must be integers >= 0, got {text!r}")
    return values


def _positive(name: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{name} must be >= 1, got {value}")
        return value

    return parse


def _suites(text: str) -> list[str]:
    values = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in values if v not in ("images", "text")]
    if not values or bad:
        raise argparse.ArgumentTypeError(f"--suite takes 'images', 'text' or both, got {text!r}")
    return values


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchfeed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="measure a real DataLoader pipeline, baseline vs torchfeed",
        description="Runs the usual input pipeline and the torchfeed pipeline on the same data "
        "and prints samples/s, the speedup, epoch times, a stage breakdown and the machine.",
    )
    bench.add_argument(
        "--device",
        default=None,
        help="cpu or cuda[:N] (default: cuda when a GPU is usable, else cpu)",
    )
    bench.add_argument(
        "--workers",
        type=_workers,
        default=[2],
        help="DataLoader worker counts, comma-separated (default: 2)",
    )
    bench.add_argument("--batch-size", type=_positive("--batch-size"), default=64)
    bench.add_argument(
        "--epochs",
        type=_positive("--epochs"),
        default=3,
        help="timed epochs after one start-up epoch (default: 3)",
    )
    bench.add_argument(
        "--images",
        type=_positive("--images"),
        default=None,
        help="images in the built-in dataset, or N of --data's, drawn in a fixed shuffled order "
        "(the same every run) (default: 2000; --large: 128)",
    )
    bench.add_argument(
        "--large",
        action="store_true",
        help="the built-in dataset's photo-sized variant: 2-12 megapixels, every fifth JPEG "
        "progressive (about 1.5 MB a file; generated once, ~1 s an image)",
    )
    bench.add_argument(
        "--text-samples",
        type=_positive("--text-samples"),
        default=32768,
        help="token sequences in the text suite (default: 32768; fewer make epochs too short "
        "to time)",
    )
    bench.add_argument(
        "--data",
        type=Path,
        default=None,
        help="an ImageFolder-style directory of your own images instead",
    )
    bench.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the built-in dataset lives (default: ~/.cache/torchfeed, or $TORCHFEED_CACHE)",
    )
    bench.add_argument(
        "--suite", type=_suites, default=["images", "text"], help="images, text, or both (default)"
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds: 96 images, batches of 32, one timed epoch",
    )
    bench.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    bench.add_argument(
        "--plot",
        type=Path,
        default=None,
        help="write a PNG bar chart of samples/s here (needs matplotlib)",
    )
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")

    doctor = commands.add_parser("doctor", help="check this machine and build, with advice")
    doctor.add_argument("--workers", type=int, default=2, help="num_workers you plan to use")
    doctor.add_argument(
        "--batch-mb",
        type=float,
        default=40.0,
        help="size of one collated batch in MB (default: 40)",
    )
    doctor.add_argument("--prefetch-factor", type=int, default=2)
    doctor.add_argument(
        "--data",
        type=Path,
        default=None,
        help="a folder of your images (ImageFolder layout or flat): advice on the pipeline "
        "that suits their size (reads up to 64 files' headers)",
    )
    doctor.add_argument(
        "--size", type=_positive("--size"), default=224, help="your crop's output size"
    )
    doctor.add_argument("--batch-size", type=_positive("--batch-size"), default=64)
    return parser


def _device(parser: argparse.ArgumentParser, text: str | None):
    import torch

    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        parser.error(f"--device: unknown device {text!r} (expected cpu or cuda[:N])")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device: {text!r} is not supported by the benchmark (cpu or cuda)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {text}: no CUDA GPU is usable on this machine")
    return device


def _progress_printer(enabled: bool):
    def report(done: int, total: int) -> None:
        if enabled and (done == total or done % 100 == 0):
            print(
                f"\rgenerating the built-in dataset: {done}/{total} JPEGs",
                end="",
                file=sys.stderr,
                flush=True,
            )
            if done == total:
                print(file=sys.stderr)

    return report


RESULT_COLUMNS = [
    ("pipeline", "pipeline"),
    ("config", "config"),
    ("samples_per_s", "samples/s"),
    ("speedup", "speedup"),
    ("epoch_s", "epoch s (median)"),
    ("epoch_range", "epochs s (min-max)"),
    ("first_epoch_s", "first epoch s"),
    ("cpu_ms_per_sample", "CPU ms/sample"),
    ("peak_mb", "peak MB"),
    ("tokens_kept_pct", "real tokens %"),
]


def _cmd_bench(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import torch

    from torchfeed._pipeline_bench import (
        agreement,
        dataset,
        image_pipelines,
        stages,
        text_pipelines,
    )
    from torchfeed._pipeline_bench.report import machine_info, plot, print_report, with_speedup

    device = _device(parser, args.device)
    if args.data is not None and not args.data.is_dir():
        parser.error(f"--data: {args.data} is not a directory")
    if args.data is not None and args.large:
        parser.error("--large chooses the built-in dataset's variant; it does not go with --data")
    quick = args.quick
    epochs = 1 if quick else args.epochs
    batch_size = min(args.batch_size, 32) if quick else args.batch_size
    n_images = args.images or (128 if args.large else 2000)
    if quick:
        n_images = min(n_images, 24 if args.large else 96)
    text_samples = min(args.text_samples, 1024) if quick else args.text_samples
    show = not args.no_progress and sys.stderr.isatty()
    machine = machine_info()
    payload: dict[str, Any] = {
        "machine": machine,
        "settings": {
            "device": str(device),
            "workers": args.workers,
            "batch_size": batch_size,
            "epochs": epochs,
            "images": n_images,
            "text_samples": text_samples,
            "data": str(args.data) if args.data else None,
            "large": args.large,
            "quick": quick,
        },
        "results": [],
    }
    rows: list[dict[str, Any]] = []

    if "images" in args.suite:
        if args.data is not None:
            try:
                files, labels = dataset.sample_image_folder(args.data, n_images)
            except FileNotFoundError as e:
                parser.error(str(e))
        else:
            make = dataset.ensure_large_dataset if args.large else dataset.ensure_builtin_dataset
            root = make(n_images, args.cache_dir, progress=_progress_printer(not args.no_progress))
            files, labels = dataset.builtin_files(root, n_images)
        payload["agreement"] = agreement.check_agreement(files)
        # stages first, on a quiet machine (no pipeline's workers around)
        payload["stages"] = stages.stage_breakdown(
            files, batch_size, device, repeat=2 if quick else 5
        )
        skipped = image_pipelines.SkippedLog()
        results = image_pipelines.run(
            files,
            labels,
            batch_size=batch_size,
            workers=args.workers,
            epochs=epochs,
            device=device,
            show_progress=show,
            skipped=skipped,
        )
        rows += with_speedup(results, image_pipelines.BASELINE)
        payload["skipped_files"] = [str(files[i]) for i in skipped.indices()]
    if "text" in args.suite:
        results = text_pipelines.run(
            size=text_samples,
            batch_size=batch_size,
            workers=args.workers,
            epochs=epochs,
            show_progress=show,
        )
        rows += with_speedup(results, text_pipelines.BASELINE)
    payload["results"] = rows

    baselines = {"images": image_pipelines.BASELINE, "text": text_pipelines.BASELINE}
    print_report(payload, rows, RESULT_COLUMNS, {k: baselines[k] for k in args.suite})
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2, default=str))
    if args.plot is not None:
        plot(rows, args.plot)
    del torch
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from torchfeed._doctor import report

    try:
        text = report(
            args.workers, args.batch_mb, args.prefetch_factor, args.data, args.size, args.batch_size
        )
    except (FileNotFoundError, OSError) as e:
        print(f"torchfeed doctor: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _cmd_bench(parser, args)
    if args.command == "doctor":
        return _cmd_doctor(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
