"""End-to-end DataLoader throughput with 2 workers: batches collated straight into the shared
ring (zero copy) against the ordinary path (workers return tensors; pin_memory off on the CPU),
on precomputed samples so that moving batches is what is measured. Goal: 1.5x the batches/s for
64x3x224x224 uint8 images. On a GPU machine (scripts/gpu_check.sh): against pin_memory=True,
end to end to device memory. And in an ordinary DataLoader, ImageCollate's recycled worker
memory against a fresh shared-memory file per batch (``recycle=False``) on photo-sized images,
read through by the consumer as a training step reads them."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import Dataset, default_collate

import torchfeed
from torchfeed import ImageCollate, PadCollate

BATCHES = 16


class Precomputed(Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


@pytest.fixture(scope="module")
def image_samples():
    g = torch.Generator().manual_seed(0)
    base = [torch.randint(0, 256, (3, 224, 224), generator=g, dtype=torch.uint8) for _ in range(64)]
    return Precomputed([(base[i % 64], i) for i in range(64 * BATCHES)])


@pytest.fixture(scope="module")
def token_samples():
    g = torch.Generator().manual_seed(1)
    seqs = [
        torch.randint(0, 32000, (int(n),), generator=g)
        for n in torch.randint(8, 513, (256,), generator=g)
    ]
    return Precomputed([{"input_ids": seqs[i % 256], "label": i} for i in range(64 * BATCHES)])


def epoch(dl, read=False):
    """One pass over the loader; ``read``: the consumer reads each image batch through (a byte of
    every page), as a training step's transform does."""

    def run():
        n = 0
        for batch in dl:
            if read:  # RaggedImages' buffer, or a dense batch tensor
                images = batch["pixel_values"] if isinstance(batch, dict) else batch[0]
                flat = images.data.reshape(-1)
                flat[:: 4096 // flat.element_size()].sum()
            n += 1
            del batch
        return n

    return run


def make(ds, collate, zero_copy, **kw):
    # seed_samples=False: what is timed is moving batches. Per-sample seeding (the loader's
    # default) reseeds three generators before every sample, about 10 us, on both sides alike:
    # on these precomputed samples it would be most of a worker's time besides the collate.
    dl = torchfeed.loader(
        ds,
        zero_copy=zero_copy,
        batch_size=64,
        num_workers=2,
        persistent_workers=True,
        collate_fn=collate,
        seed_samples=False,
        **kw,
    )
    epoch(dl)()  # start-up: workers, the ring's first pages
    return dl


def test_images_zero_copy(benchmark, role, image_samples):
    benchmark.group = "loader 16 batches of 64x3x224x224 uint8 (CPU, 2 workers)"
    role("torchfeed")
    assert (
        benchmark.pedantic(epoch(make(image_samples, ImageCollate(0), True)), rounds=5) == BATCHES
    )


def test_images_ordinary_path(benchmark, role, image_samples):
    benchmark.group = "loader 16 batches of 64x3x224x224 uint8 (CPU, 2 workers)"
    role("baseline")
    # the usual collate of same-size images: stack them (default_collate, named: a
    # torchfeed.loader given no collate_fn recycles its workers' memory)
    assert (
        benchmark.pedantic(epoch(make(image_samples, default_collate, False)), rounds=5) == BATCHES
    )


PHOTO_BATCHES = 6


@pytest.fixture(scope="module")
def photo_samples():
    # 64 photo-sized images (1.2-1.8 MP, about 290 MB a batch), each sample one of them
    g = torch.Generator().manual_seed(2)
    base = [
        torch.randint(0, 256, (int(h), int(w), 3), generator=g, dtype=torch.uint8)
        for h, w in torch.randint(900, 1100, (64, 2), generator=g) * torch.tensor([2, 3]) // 2
    ]
    return Precomputed([(base[i % 64], i) for i in range(64 * PHOTO_BATCHES)])


PHOTOS = "DataLoader, 6 batches of 64 photo-sized uint8 images, each read (CPU, 2 workers)"


def test_photos_recycled(benchmark, role, photo_samples):
    benchmark.group = PHOTOS
    role("torchfeed")
    dl = make(photo_samples, ImageCollate(0, layout="HWC", recycle=True), False)
    assert benchmark.pedantic(epoch(dl, read=True), rounds=5) == PHOTO_BATCHES


def test_photos_fresh_shared_memory(benchmark, role, photo_samples):
    benchmark.group = PHOTOS
    role("baseline")
    dl = make(photo_samples, ImageCollate(0, layout="HWC", recycle=False), False)
    assert benchmark.pedantic(epoch(dl, read=True), rounds=5) == PHOTO_BATCHES


@pytest.fixture(scope="module")
def ragged_samples():
    # 64 images of 300-600 px (ImageNet-sized, as the built-in dataset's), each sample one of them
    g = torch.Generator().manual_seed(3)
    base = [
        torch.randint(0, 256, (3, int(h), int(w)), generator=g, dtype=torch.uint8)
        for h, w in torch.randint(300, 601, (64, 2), generator=g)
    ]
    return Precomputed([(base[i % 64], i) for i in range(64 * BATCHES)])


IN_WORKERS = (
    "DataLoader, 16 batches of 64 300-600 px images, the fused transform in the workers, "
    "each batch read (CPU, 2 workers)"
)


def transform_in_workers(recycle):
    t = torchfeed.RandomResizedCropFlipNormalize(224, mean=[0.485, 0.456, 0.406],
                                                 std=[0.229, 0.224, 0.225])  # fmt: skip
    return ImageCollate(0, transform=t, recycle=recycle)


def test_transform_in_workers_recycled(benchmark, role, ragged_samples):
    benchmark.group = IN_WORKERS
    role("torchfeed")
    # an ordinary DataLoader: the kernel writes each [64, 3, 224, 224] float batch straight into
    # the worker's reused memory, the labels beside it
    dl = make(ragged_samples, transform_in_workers(True), False)
    assert benchmark.pedantic(epoch(dl, read=True), rounds=5) == BATCHES


def test_transform_in_workers_fresh_shared_memory(benchmark, role, ragged_samples):
    benchmark.group = IN_WORKERS
    role("baseline")
    # recycle=False: a fresh shared-memory file per tensor of every batch, as default_collate's
    dl = make(ragged_samples, transform_in_workers(False), False)
    assert benchmark.pedantic(epoch(dl, read=True), rounds=5) == BATCHES


def test_tokens_zero_copy(benchmark, role, token_samples):
    benchmark.group = "loader 16 padded token batches of 64 (CPU, 2 workers)"
    role("torchfeed")
    collate = PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"})
    assert benchmark.pedantic(epoch(make(token_samples, collate, True)), rounds=5) == BATCHES


def test_tokens_recycled(benchmark, role, token_samples):
    benchmark.group = "loader 16 padded token batches of 64 (CPU, 2 workers)"
    role("torchfeed")
    # an ordinary DataLoader: PadCollate writes each batch into its worker's reused memory
    collate = PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"})
    assert benchmark.pedantic(epoch(make(token_samples, collate, False)), rounds=5) == BATCHES


def test_tokens_ordinary_path(benchmark, role, token_samples):
    benchmark.group = "loader 16 padded token batches of 64 (CPU, 2 workers)"
    role("baseline")
    # a fresh shared-memory file per tensor of every batch, as default_collate's
    collate = PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"}, recycle=False)
    assert benchmark.pedantic(epoch(make(token_samples, collate, False)), rounds=5) == BATCHES


MULTIMODAL = (
    "loader 16 multimodal batches of 64: padded tokens, a 3x224x224 float image and a label "
    "(CPU, 2 workers)"
)


@pytest.fixture(scope="module")
def multimodal_samples(token_samples):
    g = torch.Generator().manual_seed(2)
    images = [torch.rand(3, 224, 224, generator=g) for _ in range(16)]
    return Precomputed(
        [{**s, "pixel_values": images[i % 16]} for i, s in enumerate(token_samples.samples)]
    )


def test_multimodal_recycled(benchmark, role, multimodal_samples):
    benchmark.group = MULTIMODAL
    role("torchfeed")
    # the image is a field PadCollate does not pad: stacked straight into the worker's reused
    # memory beside the padded tokens, never in memory of its own first
    collate = PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"})
    dl = make(multimodal_samples, collate, False)
    assert benchmark.pedantic(epoch(dl, read=True), rounds=5) == BATCHES


def test_multimodal_ordinary_path(benchmark, role, multimodal_samples):
    benchmark.group = MULTIMODAL
    role("baseline")
    collate = PadCollate({"input_ids": 0}, masks={"input_ids": "attention_mask"}, recycle=False)
    dl = make(multimodal_samples, collate, False)
    assert benchmark.pedantic(epoch(dl, read=True), rounds=5) == BATCHES


TUPLES = "loader 16 padded token batches of 64, (tokens, label) tuple samples (CPU, 2 workers)"


def test_token_tuples_recycled(benchmark, role, token_samples):
    benchmark.group = TUPLES
    role("torchfeed")
    # the plain-PyTorch habit: a Dataset returning (tokens, label); a tuple batch of a Padded
    # (padded, mask, lengths) and the labels, written into the worker's reused memory
    tuples = Precomputed([(s["input_ids"], s["label"]) for s in token_samples.samples])
    collate = PadCollate([0])
    assert benchmark.pedantic(epoch(make(tuples, collate, False)), rounds=5) == BATCHES


def test_token_tuples_ordinary_path(benchmark, role, token_samples):
    benchmark.group = TUPLES
    role("baseline")
    tuples = Precomputed([(s["input_ids"], s["label"]) for s in token_samples.samples])
    collate = PadCollate([0], recycle=False)
    assert benchmark.pedantic(epoch(make(tuples, collate, False)), rounds=5) == BATCHES


def to_device_epoch(dl, prefetch: bool):
    def run():
        n = 0
        source = torchfeed.DevicePrefetcher(dl, "cuda") if prefetch else dl
        for batch in source:
            images = batch[0].data if hasattr(batch[0], "data") else batch[0]
            images = images.to("cuda", non_blocking=True)
            n += 1
        torch.cuda.synchronize()
        return n

    return run


@pytest.mark.cuda
def test_images_to_device_zero_copy(benchmark, role, image_samples):
    benchmark.group = "loader to GPU, 16 batches of 64x3x224x224 uint8"
    role("torchfeed")
    dl = make(image_samples, ImageCollate(0), True)
    assert benchmark.pedantic(to_device_epoch(dl, True), rounds=5) == BATCHES


@pytest.mark.cuda
def test_images_to_device_pin_memory(benchmark, role, image_samples):
    benchmark.group = "loader to GPU, 16 batches of 64x3x224x224 uint8"
    role("baseline")
    dl = make(image_samples, default_collate, False, pin_memory=True)
    assert benchmark.pedantic(to_device_epoch(dl, False), rounds=5) == BATCHES
