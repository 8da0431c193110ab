"""Lab 1, with torchfeed: a map-style image dataset over real files, some of them corrupt.

The course's version caught the error and returned ``self[idx - 1]``: with every file corrupt it
recursed until Python gave up (RecursionError, after ~1000 decodes), and it logged nothing.
``torchfeed.data.SkipCorrupt`` tries a bounded number of other samples, logs each failure once,
keeps the set of skipped samples (across workers, and in checkpoints) and names them when it
gives up.
"""

from __future__ import annotations

import io
import logging
import sys
import tempfile
from pathlib import Path

import torch
from _common import parse
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms.v2.functional import pil_to_tensor

from torchfeed.data import SkipCorrupt


class ImageFiles(Dataset):
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        with Image.open(self.paths[i]) as im:
            image = pil_to_tensor(im.convert("RGB"))
        return image[:, :32, :32].float() / 255, i


class CourseFallback(ImageFiles):
    """The course's recovery: on any error, the previous sample (recursively)."""

    def __getitem__(self, i: int):
        try:
            return super().__getitem__(i)
        except Exception:
            return self[(i - 1) % len(self)]


def write_files(root: Path, n: int, corrupt: set[int]) -> list[Path]:
    g = torch.Generator().manual_seed(0)
    paths = []
    for i in range(n):
        pixels = torch.randint(0, 256, (40, 40, 3), dtype=torch.uint8, generator=g)
        buf = io.BytesIO()
        Image.fromarray(pixels.numpy()).save(buf, "JPEG")
        raw = buf.getvalue()
        if i in corrupt:
            raw = raw[: len(raw) // 3]  # truncated, as a half-written download is
        path = root / f"img_{i:03d}.jpg"
        path.write_bytes(raw)
        paths.append(path)
    return paths


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
    with tempfile.TemporaryDirectory() as tmp:
        n = 24 if args.quick else 200
        paths = write_files(Path(tmp), n, corrupt={1, 3, 7, 8})
        ds = SkipCorrupt(ImageFiles(paths))
        labels = [int(x) for _, y in DataLoader(ds, batch_size=8, num_workers=2) for x in y]
        print(
            f"lab 1: {len(labels)} samples read, skipped (logged once each): {ds.skipped_indices}"
        )

        dead = write_files(Path(tmp), 5, corrupt=set(range(5)))
        try:
            CourseFallback(dead)[0]
            course = "returned a sample"
        except RecursionError:
            course = "RecursionError (unbounded recursion)"
        try:
            SkipCorrupt(ImageFiles(dead), max_retries=4)[0]
            ours = "returned a sample"
        except RuntimeError as e:
            ours = f"RuntimeError after 5 tries: {str(e).split(';')[0]}"
        print(f"lab 1, every file corrupt: the course's dataset -> {course}; torchfeed -> {ours}")


if __name__ == "__main__":
    main()
