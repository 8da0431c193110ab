"""Small tensors of a ring's batch (labels, lengths: at most SMALL_FIELD_BYTES) arrive as copies
of their own, large ones as views of the region. A kept label then holds no region: not in an
evaluation loop that collects its targets, and not in a CPU prefetcher whose transform makes new
images and passes the labels through (with labels as views, each prepared batch held its whole
region: whole photos took a third 1.4 GB region in the second epoch of `torchfeed bench --large`).
The recycled route (memory/_recycled.py) has the same rule, tested in collate/test_pad_recycled.py.
"""

from __future__ import annotations

import gc

import pytest
import torch
from torch.utils.data import Dataset

import torchfeed
from torchfeed import ImageCollate
from torchfeed.memory import SharedRing
from torchfeed.memory._ring_base import SMALL_FIELD_BYTES


def test_small_fields_arrive_as_copies_and_large_ones_as_views():
    ring = SharedRing(1 << 20)
    large = torch.arange(SMALL_FIELD_BYTES // 8 + 1)  # one int64 past the bound
    edge = torch.arange(SMALL_FIELD_BYTES // 8)  # exactly the bound
    labels = torch.tensor([3, 1, 4])
    batch = ring.unpack(ring.pack({"large": large, "edge": edge, "labels": labels}))
    assert ring.contains(batch["large"])  # (a RingTensor where the ring is page-locked)
    for key in ("edge", "labels"):
        assert type(batch[key]) is torch.Tensor and not ring.contains(batch[key]), key
    assert torch.equal(batch["large"], large)
    assert torch.equal(batch["edge"], edge) and torch.equal(batch["labels"], labels)


def test_a_kept_label_holds_no_region():
    ring = SharedRing(1 << 20)
    batch = ring.unpack(
        ring.pack({"images": torch.ones(200_000, dtype=torch.uint8), "y": torch.ones(4)})
    )
    kept = batch["y"]
    assert ring.stats()["bytes_in_use"] > 0
    del batch
    assert ring.stats()["bytes_in_use"] == 0  # the images' region went back with the images
    assert kept.tolist() == [1.0] * 4


def test_permuted_small_fields_arrive_whole():
    ring = SharedRing(1 << 20)
    small = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # not contiguous
    batch = ring.unpack(ring.pack({"small": small}))
    assert torch.equal(batch["small"], small) and ring.stats()["bytes_in_use"] == 0


class Photos(Dataset):
    """Images past SMALL_FIELD_BYTES, each with its label."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, 120, 160 + i), dtype=torch.uint8, generator=g), i


def test_labels_an_evaluation_loop_keeps_hold_no_ring_memory():
    # a ring with room for 5 batches of 4 images (2 queued, the one the consumer holds, slack):
    # with labels as views, the labels kept here held every region and the workers waited for
    # room until ring_timeout
    dl = torchfeed.loader(Photos(), zero_copy=True, batch_size=4, num_workers=2, prefetch_factor=1,
                          collate_fn=ImageCollate(0), ring_capacity=5 * 4 * 3 * 120 * 184,
                          ring_timeout=5.0, persistent_workers=True)  # fmt: skip
    targets = []
    for _ in range(3):
        for images, labels in dl:
            assert dl.shared_ring.contains(images.data) and not dl.shared_ring.contains(labels)
            targets.append(labels)
    assert torch.cat(targets).tolist() == list(range(24)) * 3
    del images
    gc.collect()
    assert dl.shared_ring.stats()["bytes_in_use"] == 0


def test_a_cpu_prefetcher_transform_frees_each_region_when_it_is_done():
    # the CPU path of DevicePrefetcher(zero-copy loader, transform=...): the transform's output
    # is new memory and the labels are copies, so a prepared batch holds no region and the ring
    # needs no more than the batches the workers are writing
    dl = torchfeed.loader(Photos(), zero_copy=True, batch_size=4, num_workers=2, prefetch_factor=1,
                          collate_fn=ImageCollate(0), persistent_workers=True)  # fmt: skip
    crop = torchfeed.RandomResizedCropFlipNormalize(
        32, mean=0.5, std=0.25, generator=torch.Generator().manual_seed(0)
    )
    prefetcher = torchfeed.DevicePrefetcher(dl, "cpu", transform=lambda b: (crop(b[0]), b[1]))
    for _ in range(2):
        for images, labels in prefetcher:
            assert images.shape == (4, 3, 32, 32) and not dl.shared_ring.contains(labels)
    # still holding the last batch (a loop variable outlives its loop)
    assert dl.shared_ring.stats()["bytes_in_use"] == 0


@pytest.mark.cuda
def test_cuda_small_fields_are_page_locked_copies():
    ring = SharedRing(1 << 20)
    assert ring.pinned
    batch = ring.unpack(
        ring.pack({"images": torch.ones(200_000, dtype=torch.uint8), "y": torch.ones(4)})
    )
    assert ring.contains(batch["images"]) and batch["images"].is_pinned()
    assert (
        not ring.contains(batch["y"]) and batch["y"].is_pinned()
    )  # the batch stays all page-locked
    y = batch["y"].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert y.tolist() == [1.0] * 4
