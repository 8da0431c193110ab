"""The built-in image dataset of ``torchfeed bench``: real JPEG files of varied sizes and
natural-looking content (smooth fields, shapes, texture), generated deterministically once and
cached; or an ImageFolder-style directory of the user's own images."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from torchfeed._pil import encode_jpeg

__all__ = [
    "builtin_files",
    "default_cache_dir",
    "ensure_builtin_dataset",
    "ensure_large_dataset",
    "list_image_folder",
    "photo_encoding",
    "sample_image_folder",
    "synthetic_image",
    "synthetic_photo",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
DATASET_VERSION = "v2"  # v2: encoded with Pillow


def default_cache_dir() -> Path:
    env = os.environ.get("TORCHFEED_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchfeed"


def synthetic_image(index: int, seed: int = 0) -> torch.Tensor:
    """A uint8 RGB image [3, H, W], H and W in [300, 600]: a few octaves of smooth colour noise
    (sky, terrain), soft-edged ellipses and bars with gradients (objects), and fine texture."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index)
    h, w = (int(v) for v in torch.randint(300, 601, (2,), generator=g))
    img = torch.zeros(1, 3, h, w)
    for octave, weight in ((4, 0.55), (16, 0.3), (48, 0.15)):
        coarse = torch.rand(
            1, 3, max(2, h // (600 // octave)), max(2, w // (600 // octave)), generator=g
        )
        img += weight * F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=False)
    ys = torch.linspace(0, 1, h).view(h, 1)
    xs = torch.linspace(0, 1, w).view(1, w)
    for _ in range(int(torch.randint(3, 9, (1,), generator=g))):
        cy, cx, ry, rx, angle = torch.rand(5, generator=g).tolist()
        ry, rx, angle = 0.05 + 0.3 * ry, 0.05 + 0.3 * rx, angle * math.pi
        dy, dx = ys - cy, xs - cx
        u = (dx * math.cos(angle) + dy * math.sin(angle)) / rx
        v = (-dx * math.sin(angle) + dy * math.cos(angle)) / ry
        inside = torch.sigmoid((1 - (u * u + v * v)) * 12)  # soft edge
        colour = torch.rand(3, 1, 1, generator=g)
        shade = 0.7 + 0.3 * (ys - cy + 0.5)  # a gradient across the shape
        img[0] = img[0] * (1 - inside) + inside * (colour * shade).clamp(0, 1)
    img += 0.02 * torch.randn(1, 3, h, w, generator=g)  # sensor-like texture
    return (img[0].clamp(0, 1) * 255).round().to(torch.uint8)


CLASSES = 10  # the built-in sets' classes: file i is in class_{i % CLASSES}


def _jpeg_path(root: Path, index: int, classes: int) -> Path:
    return root / f"class_{index % classes:02d}" / f"{index:05d}.jpg"


def builtin_files(root: Path, count: int, classes: int = CLASSES) -> tuple[list[Path], list[int]]:
    """The first ``count`` files of a built-in dataset (``ensure_builtin_dataset`` or
    ``ensure_large_dataset`` with the same ``count`` and ``classes``), in the order they were
    made, and their classes. Never a listing of the folder: a cache that an earlier run (a larger
    ``--images``) filled further holds more files, and the first ``count`` of them sorted by
    name would be a few classes' files, not the set a fresh cache gives (in the large variant,
    two classes of which one is all progressive JPEGs, half of the set instead of a fifth, and
    all of them in the first half of the epoch)."""
    files = [_jpeg_path(Path(root), i, classes) for i in range(count)]
    missing = [p for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{root}: {len(missing)} of the {count} built-in files are missing (first: "
            f"{missing[0].name}); make them with the dataset's ensure_* function"
        )
    return files, [i % classes for i in range(count)]


def _ensure_jpegs(
    root: Path,
    count: int,
    classes: int,
    make: Callable[[int], bytes],
    progress: Callable[[int, int], None] | None,
) -> Path:
    """``count`` files ``root/class_07/00042.jpg`` (ImageFolder layout), ``make(i)`` writing
    only the missing ones; each lands under its name whole or not at all."""
    for i in range(count):
        path = _jpeg_path(root, i, classes)
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(make(i))
        tmp.replace(path)  # never a half-written file under the real name
        if progress is not None:
            progress(i + 1, count)
    return root


def ensure_builtin_dataset(
    count: int,
    cache_dir: Path | None = None,
    classes: int = CLASSES,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """``count`` JPEGs under ``cache_dir/images-v2`` in ImageFolder layout
    (``class_07/00042.jpg``), generating only the ones missing. Returns the root."""
    root = (cache_dir or default_cache_dir()) / f"images-{DATASET_VERSION}"
    return _ensure_jpegs(
        root, count, classes, lambda i: encode_jpeg(synthetic_image(i), quality=90), progress
    )


def list_image_folder(root: Path, limit: int | None = None) -> tuple[list[Path], list[int]]:
    """Image files under ``root`` (``root/<class>/<file>``, or files directly in root), sorted,
    and a class index per file."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"--data: {root} is not a directory")
    files = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if limit is not None:
        files = files[:limit]
    if not files:
        raise FileNotFoundError(f"--data: no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    classes = sorted({p.parent.name for p in files})
    index = {c: i for i, c in enumerate(classes)}
    return files, [index[p.parent.name] for p in files]


def sample_image_folder(
    root: Path, count: int | None = None, seed: int = 0
) -> tuple[list[Path], list[int]]:
    """The image files of ``root`` (as :func:`list_image_folder` finds them, with its classes) in
    a fixed shuffled order, the order a training loader that shuffles would give; with
    ``count``, the first ``count`` of that order. So a bench on a user's folder measures a sample
    spread over every class, in batches that mix them, and the same files in the same order in
    every run and every pipeline: the first files by name are one or two classes, whose images
    may all be alike (one camera, one size), and a batch of them lands on one worker."""
    files, labels = list_image_folder(root)
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(seed)).tolist()
    order = order[:count] if count is not None else order
    return [files[i] for i in order], [labels[i] for i in order]


# The large variant: photo-sized files, 2-12 megapixels in the aspect ratios cameras and phones
# write, every fifth one progressive (as many web images are), quality 85-95.
LARGE_VERSION = "v1"
_ASPECTS = ((4, 3), (3, 2), (16, 9), (1, 1))


def synthetic_photo(index: int, seed: int = 0) -> torch.Tensor:
    """A uint8 RGB image [3, H, W] of 2-12 megapixels: the small images' content (colour
    fields, soft shapes) laid out at a quarter of the size and upsampled, with full-resolution
    texture and sensor noise, so its JPEG costs about what a photo of that size costs to decode."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + index + 7_777_777)
    megapixels = 2.0 + 10.0 * float(torch.rand((), generator=g))
    a, b = _ASPECTS[int(torch.randint(len(_ASPECTS), (), generator=g))]
    if bool(torch.randint(2, (), generator=g)):  # portrait
        a, b = b, a
    w = int(math.sqrt(megapixels * 1e6 * a / b))
    h = int(megapixels * 1e6 / w)
    layout = synthetic_image(index, seed + 1).float().unsqueeze(0)
    img = F.interpolate(layout, size=(h, w), mode="bilinear", align_corners=False)
    # detail at two scales (texture, then grain): a photo's JPEG is mostly such coefficients
    detail = torch.randn(1, 3, h // 3 + 1, w // 3 + 1, generator=g)
    img += 14.0 * F.interpolate(detail, size=(h, w), mode="bilinear", align_corners=False)
    img += 5.0 * torch.randn(1, 3, h, w, generator=g)
    return img[0].clamp(0, 255).round().to(torch.uint8)


def photo_encoding(index: int) -> dict:
    return {"quality": 85 + index % 11, "progressive": index % 5 == 0}


def ensure_large_dataset(
    count: int,
    cache_dir: Path | None = None,
    classes: int = CLASSES,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """``count`` photo-sized JPEGs (:func:`synthetic_photo`) under ``cache_dir/photos-v1``, in
    the layout of :func:`ensure_builtin_dataset`, generating only the ones missing."""
    root = (cache_dir or default_cache_dir()) / f"photos-{LARGE_VERSION}"
    return _ensure_jpegs(
        root,
        count,
        classes,
        lambda i: encode_jpeg(synthetic_photo(i), **photo_encoding(i)),
        progress,
    )
