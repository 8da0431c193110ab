"""The command line of the scripts that measure a folder of images: the folder (default: the
bench's built-in large variant, made if missing) and ``--repeats`` (passes, best kept), and the
image files under it."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from torchfeed._pipeline_bench.dataset import builtin_files, ensure_large_dataset, list_image_folder


def parse(doc: str) -> tuple[argparse.ArgumentParser, Path, int, list[Path]]:
    """The parser (for later errors), the folder, the repeats and the folder's image files (an
    ImageFolder's; none when it has no class folders); the process set to one thread, as every
    figure of these scripts is per thread."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, help="an image folder (default: --large)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the files (best kept)")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    torch.set_num_threads(1)
    if args.folder is None:  # the bench's --large set: its first 128 files, whatever is cached
        folder = ensure_large_dataset(128)
        return parser, folder, args.repeats, builtin_files(folder, 128)[0]
    folder = args.folder
    if not folder.is_dir():
        parser.error(f"folder: {folder} is not a directory")
    try:
        files = list_image_folder(folder)[0]
    except FileNotFoundError:
        files = []
    return parser, folder, args.repeats, files
