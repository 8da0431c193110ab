"""The image pipelines of ``torchfeed bench``, on the same files in the same order:

- baseline (the usual practice): workers read, decode and apply torchvision v2
  RandomResizedCrop + flip + ToDtype + Normalize per image; ``default_collate``;
  ``pin_memory=True`` on a GPU machine; ``.to(device)``;
- torchfeed: workers only read and decode (uint8, any size); a ragged uint8 collate
  (``ImageCollate``, one shared-memory buffer); ``DevicePrefetcher`` with the pinned ring; the
  fused per-image crop/flip/resize/normalize on the device (on a CPU-only machine, in the
  prefetcher's thread);
- torchfeed with crop-window decoding: the workers draw each image's crop from the JPEG header
  and decode only that window (``torchfeed.io.DecodeRandomCrop``, libjpeg-turbo), collate into
  the shared ring; the prefetcher resizes, flips and normalizes (``ResizeFlipNormalize``): the
  same result as RandomResizedCrop on the full image, with less decoding;
- on a GPU machine, torchfeed with GPU decoding: workers only read the files, and
  ``torchvision.io.decode_jpeg(..., device="cuda")`` decodes the batch on the GPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms import v2

from torchfeed.bench.runner import PipelineResult, run_epochs
from torchfeed.data import SkipCorrupt
from torchfeed.images import ImageCollate, RaggedImages
from torchfeed.io import DecodeRandomCrop, decode_window
from torchfeed.prefetch import DevicePrefetcher
from torchfeed.shared import SharedRing
from torchfeed.shared import loader as zc_loader
from torchfeed.transforms import (
    RandomResizedCropFlipNormalize,
    ResizeFlipNormalize,
    crop_flip_normalize,
    sample_flips,
    sample_resized_crop_params,
)

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
GPU_DECODE = "images: torchfeed + GPU decode"


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
        data = read_file(self.files[i])
        if not self.decode:
            return data.numpy(), self.labels[i]  # numpy: stays on the host through prefetching
        if callable(self.decode):
            image = self.decode(data)
        else:
            image = decode_image(data, mode=ImageReadMode.RGB)
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

    def prefetched(dl, t):  # the fused transform in the prefetcher
        return DevicePrefetcher(dl, device, transform=lambda b: (t(b[0]), b[1]))

    def shared(decode=True, transform=None, zero_copy=True):
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
        ds = skipped.track(FileDataset(files, labels))
        dl = loader(ds, batch_size, workers, collate_fn=ImageCollate(0))
        return prefetched(dl, fused_transform())

    def zero_copy():
        return prefetched(shared(), fused_transform())

    def zero_copy_in_workers():
        return shared(transform=RandomResizedCropFlipNormalize(SIZE, mean=MEAN, std=STD))

    def window():
        # workers draw each crop from the JPEG header and decode only that window
        dl = shared(decode=DecodeRandomCrop(), zero_copy=workers > 0)
        t = ResizeFlipNormalize(
            SIZE, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(0)
        )
        return prefetched(dl, t)

    def window_in_workers():
        return shared(
            decode=DecodeRandomCrop(), transform=ResizeFlipNormalize(SIZE, mean=MEAN, std=STD)
        )

    pipelines[BASELINE] = baseline
    pipelines[TORCHFEED] = ours
    if workers > 0:
        pipelines[ZERO_COPY] = zero_copy
        if not gpu:  # on a GPU machine the transform belongs on the GPU
            pipelines[ZERO_COPY_WORKERS] = zero_copy_in_workers
    pipelines[WINDOW] = window
    if workers > 0 and not gpu:
        pipelines[WINDOW_WORKERS] = window_in_workers
    if gpu:

        def gpu_decode():
            ds = skipped.track(FileDataset(files, labels, decode=False))
            dl = loader(ds, batch_size, workers, collate_fn=_bytes_collate)
            t = fused_transform()

            def decode_and_transform(batch):
                encoded, labels_ = batch
                images = decode_jpeg([torch.from_numpy(e) for e in encoded], device=device)
                return t(images), labels_

            return DevicePrefetcher(dl, device, ring=False, transform=decode_and_transform)

        pipelines[GPU_DECODE] = gpu_decode
    return pipelines, n_batches


def _bytes_collate(batch):
    return [b[0] for b in batch], torch.tensor([b[1] for b in batch])


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
        for name, make in pipelines.items():
            result = run_epochs(
                name, f"workers={num_workers}", make, step, epochs, n_batches, show_progress
            )
            results.append(result)
    return results


# --- the pipelines check each other ---------------------------------------------------------------


def decodable(files: Sequence[Path], count: int) -> list[tuple[Path, torch.Tensor, torch.Tensor]]:
    """The first ``count`` files that decode: (path, encoded bytes, uint8 image)."""
    out = []
    for f in files:
        encoded = read_file(str(f))
        try:
            out.append((f, encoded, decode_image(encoded, mode=ImageReadMode.RGB)))
        except RuntimeError:
            continue  # unreadable: the pipelines skip it too
        if len(out) == count:
            break
    return out


def check_agreement(files: Sequence[Path], count: int = 8) -> dict[str, float]:
    """The same images with the same drawn parameters through torchvision (uint8, the
    baseline's path) and through the fused kernel give the same tensors within 1 level/std, so a
    speedup can never come from doing less work."""
    readable = decodable(files, count)
    images = [image for _, _, image in readable]
    g = torch.Generator().manual_seed(0)
    boxes = sample_resized_crop_params([tuple(i.shape[1:]) for i in images], generator=g)
    flips = sample_flips(len(images), 0.5, g)
    ours = crop_flip_normalize(images, boxes, flips, SIZE, mean=MEAN, std=STD)
    from torchfeed.reference import crop_flip_normalize_torchvision

    theirs = crop_flip_normalize_torchvision(
        images, boxes.tolist(), flips.tolist(), (SIZE, SIZE), MEAN, STD, float_path=False
    )
    diff = float((ours - theirs).abs().max())
    bound = 1.01 / 255 / min(STD) + 1e-4
    if diff > bound:
        raise AssertionError(f"the image pipelines disagree: max |diff| {diff:.5f} > {bound:.5f}")
    # crop-window decoding: the same boxes decoded alone, then resized whole, give the fused
    # kernel's result on the full images (the windows' pixels are identical)
    windows = [decode_window(e, box) for (_, e, _), box in zip(readable, boxes, strict=True)]
    whole = torch.tensor([[0, 0, w.shape[1], w.shape[2]] for w in windows])
    from_windows = crop_flip_normalize(windows, whole, flips, SIZE, mean=MEAN, std=STD)
    window_diff = float((from_windows - ours).abs().max())
    if window_diff > WINDOW_BOUND:
        raise AssertionError(
            f"crop-window decoding disagrees with full decoding: max |diff| {window_diff:.2e}"
        )
    return {
        "images": len(images),
        "max_abs_diff": diff,
        "bound": bound,
        "window_max_abs_diff": window_diff,
        "window_bound": WINDOW_BOUND,
    }


# --- where the time goes -------------------------------------------------------------------------


def _median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


class _Samples(Dataset):
    """Hands out the same decoded samples again and again: through a 1-worker DataLoader with
    the pipeline's own collate, the main process then waits for collate + worker-to-main
    transfer only (the worker allocates the batch in shared memory, as in the real run)."""

    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return 1 << 20

    def __getitem__(self, i):
        return self.samples[i % len(self.samples)]


def _collate_transfer_ms(
    samples, collate, batch_size: int, repeat: int, zero_copy: bool = False
) -> float:
    dl = zc_loader(
        _Samples(samples),
        zero_copy=zero_copy,
        batch_size=batch_size,
        num_workers=1,
        collate_fn=collate,
        prefetch_factor=1,
    )
    it = iter(dl)
    next(it)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        out = next(it)
        times.append(time.perf_counter() - start)
        del out
    del it
    return statistics.median(times) * 1e3


def stage_breakdown(
    files: Sequence[Path], batch_size: int, device: torch.device, repeat: int = 5
) -> list[dict[str, Any]]:
    """Milliseconds per batch for each stage, measured one at a time in this process (the
    transfer through a real 1-worker DataLoader): what bounds each pipeline."""
    readable = decodable(files, batch_size)
    files = [f for f, _, _ in readable]
    decoded = [image for _, _, image in readable]
    tv = torchvision_transform()
    fused = fused_transform()
    transformed = [tv(i) for i in decoded]
    float_batch = torch.stack(transformed)
    ragged = RaggedImages.from_images(decoded)
    read_decode = _median_ms(
        lambda: [decode_image(read_file(str(f)), mode=ImageReadMode.RGB) for f in files], repeat
    )
    crop_decode = DecodeRandomCrop(generator=torch.Generator().manual_seed(0))
    read_window = _median_ms(lambda: [crop_decode(read_file(str(f))) for f in files], repeat)
    windows = [crop_decode(read_file(str(f))) for f in files]
    ragged_windows = RaggedImages.from_images(windows)
    resize = ResizeFlipNormalize(SIZE, mean=MEAN, std=STD)
    fused_ms = _median_ms(lambda: fused(ragged), repeat)
    images_with_labels = [(d, 0) for d in decoded]
    rows = [
        {
            "stage": "read + decode (workers)",
            "baseline_ms": read_decode,
            "torchfeed_ms": read_decode,
            "zero_copy_ms": read_decode,
            "window_ms": read_window,
        },
        {
            "stage": "transform (baseline: in workers)",
            "baseline_ms": _median_ms(lambda: [tv(i) for i in decoded], repeat),
            "torchfeed_ms": fused_ms,
            "zero_copy_ms": fused_ms,
            "window_ms": _median_ms(lambda: resize(ragged_windows), repeat),
        },
        {
            "stage": "collate + worker -> main transfer",
            "baseline_ms": _collate_transfer_ms(
                [(t, 0) for t in transformed], None, len(files), repeat
            ),
            "torchfeed_ms": _collate_transfer_ms(
                images_with_labels, ImageCollate(0), len(files), repeat
            ),
            "zero_copy_ms": _collate_transfer_ms(
                images_with_labels, ImageCollate(0), len(files), repeat, zero_copy=True
            ),
            "window_ms": _collate_transfer_ms(
                [(w, 0) for w in windows], ImageCollate(0), len(files), repeat, zero_copy=True
            ),
        },
    ]
    if device.type == "cuda":
        from torchfeed.ring import PinnedRing

        ring = PinnedRing(4 * float_batch.nbytes)

        def pinned_copy():
            float_batch.pin_memory().to(device, non_blocking=True)
            torch.cuda.synchronize()

        def ring_copy():
            ring.to_device(ring.stage(ragged), device)
            torch.cuda.synchronize()

        shared = SharedRing(4 * ragged.data.nbytes)

        def registered_copy(batch):  # straight from the page-locked shared memory
            registered = shared.unpack(shared.pack(batch))  # as the workers leave a batch

            def copy():
                registered.data.to(device, non_blocking=True)
                torch.cuda.synchronize()

            return _median_ms(copy, repeat)

        rows.append(
            {
                "stage": "host -> device",
                "baseline_ms": _median_ms(pinned_copy, repeat),
                "torchfeed_ms": _median_ms(ring_copy, repeat),
                "zero_copy_ms": registered_copy(ragged),
                "window_ms": registered_copy(ragged_windows),
            }
        )
    else:
        rows.append({"stage": "host -> device"})
    rows.append(
        {
            "stage": "MB per batch, worker -> main",
            "baseline_ms": float_batch.nbytes / 1e6,
            "torchfeed_ms": ragged.data.nbytes / 1e6,
            "zero_copy_ms": ragged.data.nbytes / 1e6,
            "window_ms": ragged_windows.data.nbytes / 1e6,
        }
    )
    return rows
