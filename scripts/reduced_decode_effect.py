"""What ``reduced_decode=True`` changes on a folder of JPEGs, for the training and the evaluation
transform: how far its output is from the full-scale path's (mean and max absolute difference
after normalization, over every file), and what it costs per image on one thread, from the
file's bytes to the normalized 224 x 224 crop, against the usual ``ImageFolder`` path (Pillow's
loader and torchvision's Compose).

    .venv/bin/python scripts/reduced_decode_effect.py [DIR] [--repeats 3]

DIR: an image folder (default: the bench's built-in large variant, made if missing).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable

import _folder
import PIL.Image
import torch
from torchvision.transforms import v2

import torchfeed
from torchfeed._pipeline_bench.agreement import EVAL_RESIZE, agreement_of, decodable
from torchfeed._pipeline_bench.image_pipelines import MEAN, SIZE, STD, torchvision_transform


def training() -> v2.Compose:
    return v2.Compose([v2.ToImage(), *torchvision_transform().transforms])


def evaluation() -> v2.Compose:
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize(EVAL_RESIZE),
            v2.CenterCrop(SIZE),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def pil_loader(data: bytes) -> PIL.Image.Image:
    with PIL.Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def ms_per_image(files: list[bytes], load: Callable, transform: Callable, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for data in files:
            transform(load(data))
        best = min(best, time.perf_counter() - start)
    return best / len(files) * 1e3


def main() -> None:
    parser, folder, repeats, paths = _folder.parse(__doc__)
    readable = decodable(paths, len(paths))  # unreadable files are skipped, as the bench does
    if not readable:
        parser.error(f"folder: no readable image under {folder}")
    a = agreement_of(readable)
    skipped = (
        f" ({len(paths) - len(readable)} unreadable skipped)" if len(readable) < len(paths) else ""
    )
    print(
        f"{a['images']} images of {folder}{skipped}; differences in normalized units (1 level "
        "~0.017)"
    )
    print(
        f"training (RandomResizedCrop(224), the same draws): {a['scaled_images']} reduced, mean "
        f"{a['scaled_mean_abs_diff']:.4f}, max {a['scaled_max_abs_diff']:.3f}"
    )
    print(
        f"evaluation (Resize({EVAL_RESIZE}) -> CenterCrop({SIZE})): {a['eval_scaled_images']} "
        f"reduced, mean {a['eval_scaled_mean_abs_diff']:.4f}, max "
        f"{a['eval_scaled_max_abs_diff']:.3f}"
    )
    files = [bytes(encoded.numpy()) for _, encoded, _ in readable]
    raw = lambda data: data  # noqa: E731  (loader=torchfeed.decode.read_file)
    for name, make in (("training", training), ("evaluation", evaluation)):
        torch.manual_seed(0)
        base = ms_per_image(files, pil_loader, make(), repeats)
        exact = ms_per_image(files, raw, torchfeed.fuse(make()), repeats)
        fused = torchfeed.fuse(make(), reduced_decode=True)
        reduced = ms_per_image(files, raw, fused, repeats)
        print(
            f"{name}, ms per image on one thread: Pillow loader + torchvision {base:.1f}; "
            f"read_file + fused {exact:.1f} ({base / exact:.2f}x); read_file + fused, "
            f"reduced_decode {reduced:.1f} ({base / reduced:.2f}x)"
        )


if __name__ == "__main__":
    main()
