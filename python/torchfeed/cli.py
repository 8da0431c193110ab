"""The ``torchfeed`` command: ``torchfeed bench`` (the end-to-end pipeline benchmark)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="torchfeed", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser(
        "bench",
        help="measure a real DataLoader pipeline, baseline vs torchfeed",
        description="Runs the usual input pipeline and the torchfeed pipeline on the same "
        "built-in data and prints samples/s, the speedup, epoch times and the machine.",
    )
    bench.add_argument(
        "--workers",
        type=_workers,
        default=None,
        help="DataLoader worker counts to run, comma-separated (default: 2)",
    )
    bench.add_argument("--batch-size", type=_positive("--batch-size"), default=64)
    bench.add_argument(
        "--epochs",
        type=_positive("--epochs"),
        default=3,
        help="timed epochs after one start-up epoch (default: 3)",
    )
    bench.add_argument(
        "--text-samples",
        type=_positive("--text-samples"),
        default=8192,
        help="sequences in the built-in token workload (default: 8192)",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a few seconds: small workloads, one timed epoch (for CI and tests)",
    )
    bench.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    bench.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser  # fmt: skip


def cmd_bench(args: argparse.Namespace) -> int:
    from torchfeed.bench import text
    from torchfeed.bench.report import format_machine, format_table, machine_info

    workers = args.workers or [2]
    epochs = 1 if args.quick else args.epochs
    text_samples = min(args.text_samples, 1024) if args.quick else args.text_samples
    show = not args.no_progress and sys.stderr.isatty()
    machine = machine_info()

    results = text.run(
        size=text_samples, batch_size=args.batch_size, workers=workers, epochs=epochs,
        show_progress=show,
    )  # fmt: skip
    rows = []
    for r in results:
        row = r.row()
        base = next(b for b in results if b.pipeline == text.BASELINE and b.config == r.config)
        row["speedup"] = r.samples_per_second / base.samples_per_second
        rows.append(row)

    columns = [
        ("pipeline", "pipeline"),
        ("config", "config"),
        ("samples_per_s", "samples/s"),
        ("speedup", "speedup"),
        ("epoch_s", "epoch s (median)"),
        ("first_epoch_s", "first epoch s"),
        ("tokens_kept_pct", "real tokens %"),
    ]
    print(format_table(rows, columns))
    print(
        f"speedup: samples/s over '{text.BASELINE}' with the same config; median of {epochs} "
        f"epoch(s) after a start-up epoch; batch size {args.batch_size}"
    )
    print(format_machine(machine))
    if args.json is not None:
        payload = {
            "machine": machine,
            "settings": {"batch_size": args.batch_size, "epochs": epochs, "workers": workers,
                         "text_samples": text_samples, "quick": args.quick},
            "results": rows,
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return cmd_bench(args)
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
