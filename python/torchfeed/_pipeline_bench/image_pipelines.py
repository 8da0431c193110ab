"""The image pipelines of ``torchfeed bench`` (the agreement checks are in ``agreement``, the stage
timings in ``stages``), on the same files in the same order:

- baseline (the usual practice): workers read, decode and apply torchvision v2
  RandomResizedCrop + flip + ToDtype + Normalize per image; ``default_collate``;
  ``pin_memory=True`` on a GPU machine; ``.to(device)``;
- the one-line change: the baseline with its Compose passed through ``torchfeed.fuse`` (the same
  steps, one fused pass per sample in the workers);
- the second line: the same, with the file's bytes handed to the fused Compose (an
  ``ImageFolder``'s ``loader=torchfeed.decode.read_file``), which decodes only the pixels its
  crop reads: the same output as on the decoded image; and the same at reduced scale
  (``fuse(..., reduced_decode=True)``: the crop decoded as ``DecodeRandomCrop(size=224)`` does);
  and that with ``collate_fn=torchfeed.DefaultCollate()`` (the third line: ``default_collate``'s
  batches, which the workers write into memory they reuse);
- torchfeed: workers only read and decode (uint8, any size; ``torchfeed.decode.decode_image``,
  libjpeg-turbo straight into the tensor); a ragged uint8 collate in an ordinary DataLoader
  (``ImageCollate``: one buffer in shared memory each worker reuses); ``DevicePrefetcher`` with
  the pinned ring; the fused per-image crop/flip/resize/normalize on the device (on a CPU-only
  machine, in the prefetcher's thread);
- torchfeed with crop-window decoding: the workers draw each image's crop from the JPEG header
  and decode only that window (``torchfeed.decode.DecodeRandomCrop``, libjpeg-turbo), collate into
  the shared ring; the prefetcher resizes, flips and normalizes (``ResizeRandomFlipNormalize``):
  the same result as RandomResizedCrop on the full image, with less decoding;
- the same at reduced scale: each window decoded at the largest of 1/2, 1/4, 1/8 that still
  gives 224 pixels each way (``DecodeRandomCrop(size=224)``): large photos decode several times
  faster, and the result differs slightly from the full-scale one (the report measures by how
  much).

The baseline and the one-line change decode with Pillow, as an ``ImageFolder`` does (torchvision
0.29 deprecates its own decoder); the torchfeed pipelines decode with ``torchfeed.decode`` (Pillow
for what libjpeg-turbo does not decode: other formats, CMYK JPEGs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from torchfeed._pil import decode_rgb, read_bytes
from torchfeed._pipeline_bench.runner import PipelineResult, run_bracketed, run_epochs
from torchfeed.collate import DefaultCollate, ImageCollate
from torchfeed.data import SkipCorrupt
from torchfeed.decode import DecodeRandomCrop, decode_image
from torchfeed.loaders import loader as zc_loader
from torchfeed.prefetch import DevicePrefetcher
from torchfeed.transforms import RandomResizedCropFlipNormalize, ResizeRandomFlipNormalize, fuse

__all__ = [
    "BASELINE",
    "FileDataset",
    "SkippedLog",
    "fused_transform",
    "make_pipelines",
    "run",
    "torchvision_transform",
]

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SIZE = 224
WINDOW_BOUND = 1e-5  # the same pixels and geometry: only float evaluation order may differ

BASELINE = "images: baseline (torchvision per image)"
TORCHFEED = "images: torchfeed (uint8 collate, ring, fused)"
ZERO_COPY = "images: torchfeed zero-copy (fused in prefetcher)"
ZERO_COPY_WORKERS = "images: torchfeed zero-copy, fused in workers"
WINDOW = "images: torchfeed zero-copy + crop-window decode"
WINDOW_WORKERS = WINDOW + ", fused in workers"
SCALED = "images: torchfeed zero-copy + crop-window decode at reduced scale"
SCALED_WORKERS = SCALED + ", fused in workers"
FUSED_COMPOSE = "images: your torchvision pipeline fused (torchfeed.fuse, per sample)"
FUSED_BYTES = FUSED_COMPOSE[:-1] + ", on the file's bytes: loader=read_file)"
FUSED_REDUCED = FUSED_BYTES[:-1] + ", reduced_decode=True)"
FUSED_RECYCLED = FUSED_REDUCED[:-1] + ", collate_fn=DefaultCollate())"


def torchvision_transform() -> v2.Compose:
    return v2.Compose(
        [
            v2.RandomResizedCrop(SIZE, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def fused_transform(seed: int = 0) -> RandomResizedCropFlipNormalize:
    return RandomResizedCropFlipNormalize(
        SIZE, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(seed)
    )


class FileDataset(Dataset):
    """Reads image files; decodes them to uint8 [3, H, W] (``decode=False``: the encoded
    bytes; a callable: ``decode(encoded)`` gives the image); applies ``transform`` per image if
    given."""

    def __init__(
        self,
        files: Sequence[Path],
        labels: Sequence[int],
        transform: Callable | None = None,
        decode: bool | Callable[[torch.Tensor], torch.Tensor] = True,
    ) -> None:
        self.files = [str(f) for f in files]
        self.labels = list(labels)
        self.transform = transform
        self.decode = decode

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        data = read_bytes(self.files[i])
        if not self.decode:
            if self.transform is not None:  # a transform that takes the file's bytes
                return self.transform(data), self.labels[i]
            return data.numpy(), self.labels[i]  # numpy: stays on the host through prefetching
        image = self.decode(data) if callable(self.decode) else decode_rgb(data)
        if self.transform is not None:
            image = self.transform(image)
        return image, self.labels[i]


def step(batch) -> int:
    """The training step's use of a batch: it reads the images once."""
    images, labels = batch
    float(images.sum())
    return int(labels.shape[0])


def loader(dataset: Dataset, batch_size: int, workers: int, **kw) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=workers,
        persistent_workers=workers > 0,
        **kw,
    )


class SkippedLog:
    """The unreadable files the pipelines skipped (every pipeline reads through SkipCorrupt, so
    all of them see the same substitutes)."""

    def __init__(self) -> None:
        self.datasets: list[SkipCorrupt] = []

    def track(self, dataset: Dataset) -> SkipCorrupt:
        wrapped = SkipCorrupt(dataset)
        self.datasets.append(wrapped)
        return wrapped

    def indices(self) -> list[int]:
        return sorted({i for d in self.datasets for i in d.skipped_indices})


def make_pipelines(
    files, labels, batch_size: int, workers: int, device: torch.device, skipped: SkippedLog
):
    """name -> a function making the iterable of device batches; and the batches per epoch."""
    gpu = device.type == "cuda"
    n_batches = -(-len(files) // batch_size)
    pipelines: dict[str, Callable[[], Any]] = {}

    def baseline():
        ds = skipped.track(FileDataset(files, labels, torchvision_transform()))
        dl = loader(ds, batch_size, workers, pin_memory=gpu)
        return _Moved(dl, device)

    def fused_compose():
        # the one-line change: the baseline's own torchvision Compose, fused, per sample in the
        # workers, everything else as the baseline has it
        ds = skipped.track(FileDataset(files, labels, fuse(torchvision_transform())))
        dl = loader(ds, batch_size, workers, pin_memory=gpu)
        return _Moved(dl, device)

    def fused_bytes(reduced_decode=False, collate_fn=None):
        # the second line: the loader hands the fused Compose the file's bytes, and it decodes
        # only the pixels its crop reads (the same output as on the decoded image); with
        # reduced_decode, at the scale DecodeRandomCrop(size=224) picks; with DefaultCollate,
        # the workers write default_collate's batches into memory they reuse
        t = fuse(torchvision_transform(), reduced_decode=reduced_decode)
        ds = skipped.track(FileDataset(files, labels, t, decode=False))
        dl = loader(ds, batch_size, workers, pin_memory=gpu, collate_fn=collate_fn)
        return _Moved(dl, device)

    def prefetched(dl, t):  # the fused transform in the prefetcher
        return DevicePrefetcher(dl, device, transform=lambda b: (t(b[0]), b[1]))

    def shared(decode=decode_image, transform=None, zero_copy=True):
        # workers collate straight into the shared ring; with `transform`, the fused kernel
        # writes there (each worker draws from its own generator: the DataLoader seeds them apart)
        return zc_loader(
            skipped.track(FileDataset(files, labels, decode=decode)),
            zero_copy=zero_copy,
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=workers > 0,
            collate_fn=ImageCollate(0, transform=transform),
        )

    def ours():
        ds = skipped.track(FileDataset(files, labels, decode=decode_image))
        dl = loader(ds, batch_size, workers, collate_fn=ImageCollate(0))
        return prefetched(dl, fused_transform())

    def zero_copy():
        return prefetched(shared(), fused_transform())

    def zero_copy_in_workers():
        return shared(transform=RandomResizedCropFlipNormalize(SIZE, mean=MEAN, std=STD))

    def window(size=None):
        # workers draw each crop from the JPEG header and decode only that window
        dl = shared(decode=DecodeRandomCrop(size=size), zero_copy=workers > 0)
        t = ResizeRandomFlipNormalize(
            SIZE, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(0)
        )
        return prefetched(dl, t)

    def window_in_workers(size=None):
        return shared(
            decode=DecodeRandomCrop(size=size),
            transform=ResizeRandomFlipNormalize(SIZE, mean=MEAN, std=STD),
        )

    pipelines[BASELINE] = baseline
    pipelines[FUSED_COMPOSE] = fused_compose
    pipelines[FUSED_BYTES] = fused_bytes
    pipelines[FUSED_REDUCED] = lambda: fused_bytes(reduced_decode=True)
    pipelines[FUSED_RECYCLED] = lambda: fused_bytes(True, DefaultCollate())
    pipelines[TORCHFEED] = ours
    if workers > 0:
        pipelines[ZERO_COPY] = zero_copy
        if not gpu:  # on a GPU machine the transform belongs on the GPU
            pipelines[ZERO_COPY_WORKERS] = zero_copy_in_workers
    pipelines[WINDOW] = window
    if workers > 0 and not gpu:
        pipelines[WINDOW_WORKERS] = window_in_workers
    pipelines[SCALED] = lambda: window(SIZE)
    if workers > 0 and not gpu:
        pipelines[SCALED_WORKERS] = lambda: window_in_workers(SIZE)
    return pipelines, n_batches


class _Moved:
    """The baseline's ``.to(device)`` after the loader."""

    def __init__(self, dl: DataLoader, device: torch.device) -> None:
        self.dl, self.device = dl, device

    def __iter__(self):
        for images, labels in self.dl:
            yield images.to(self.device, non_blocking=True), labels.to(self.device)


def run(
    files,
    labels,
    *,
    batch_size: int,
    workers: Sequence[int],
    epochs: int,
    device: torch.device,
    show_progress: bool,
    skipped: SkippedLog | None = None,
) -> list[PipelineResult]:
    skipped = SkippedLog() if skipped is None else skipped
    results = []
    for num_workers in workers:
        pipelines, n_batches = make_pipelines(
            files, labels, batch_size, num_workers, device, skipped
        )

        # (the loop's values bound as defaults: timed runs within this iteration)
        def timed(name, pipelines=pipelines, config=f"workers={num_workers}", n_batches=n_batches):
            return run_epochs(name, config, pipelines[name], step, epochs, n_batches, show_progress)

        results += run_bracketed(pipelines, timed, BASELINE)
    return results
