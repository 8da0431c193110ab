"""RaggedImages and ImageCollate: packing, views, movement, DataLoader workers."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchfeed import ImageCollate, RaggedImages


def images(sizes, channels=3, layout="CHW", seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for h, w in sizes:
        shape = (channels, h, w) if layout == "CHW" else (h, w, channels)
        out.append(torch.randint(0, 256, shape, generator=g, dtype=torch.uint8))
    return out


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_pack_and_view(layout):
    ims = images([(5, 7), (1, 1), (9, 3)], layout=layout)
    r = RaggedImages.from_images(ims, layout)
    assert len(r) == 3 and r.channels == 3 and r.sizes == [(5, 7), (1, 1), (9, 3)]
    assert r.shapes == ((3, 5, 7), (3, 1, 1), (3, 9, 3))
    assert r.data.numel() == sum(i.numel() for i in ims)
    for got, want in zip(r.images(), ims, strict=True):
        assert torch.equal(got, want if layout == "CHW" else want.permute(2, 0, 1))


def test_pickle_and_to():
    r = RaggedImages.from_images(images([(4, 6), (2, 2)]))
    back = pickle.loads(pickle.dumps(r))
    assert back.shapes == r.shapes and torch.equal(back.data, r.data)
    moved = r.to(torch.float32)
    assert moved.data.dtype == torch.float32 and moved.shapes == r.shapes


@pytest.mark.cuda
def test_pin_and_cuda():
    r = RaggedImages.from_images(images([(4, 6), (2, 2)]))
    gpu = r.pin_memory().to("cuda", non_blocking=True)
    assert gpu.device.type == "cuda" and torch.equal(gpu[1].cpu(), r[1])


def test_bad_input():
    with pytest.raises(ValueError, match="at least one image"):
        RaggedImages.from_images([])
    with pytest.raises(ValueError, match=r"images\[1\] must be 3-D"):
        RaggedImages.from_images([torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(2, 2)])
    with pytest.raises(
        TypeError, match=r"images\[1\] is torch.float32 on cpu but images\[0\] is torch.uint8"
    ):
        RaggedImages.from_images([torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(3, 2, 2)])
    with pytest.raises(ValueError, match="image_layout must be 'CHW' or 'HWC'"):
        RaggedImages.from_images([torch.zeros(3, 2, 2)], "WHC")
    with pytest.raises(ValueError, match="data holds 5 elements but the shapes need 12"):
        RaggedImages(torch.zeros(5, dtype=torch.uint8), [(3, 2, 2)])
    with pytest.raises(ValueError, match=r"shapes\[1\] has 1 channels but shapes\[0\] has 3"):
        RaggedImages(torch.zeros(16, dtype=torch.uint8), [(3, 2, 2), (1, 2, 2)])


class ImageDataset(Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        h, w = (int(v) for v in torch.randint(5, 40, (2,), generator=g))
        return {"image": torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8),
                "label": i}  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_image_collate_in_dataloader(workers):
    ds = ImageDataset()
    loader = DataLoader(ds, batch_size=5, num_workers=workers,
                        collate_fn=ImageCollate("image", layout="HWC"))  # fmt: skip
    seen = 0
    for batch in loader:
        assert list(batch) == ["image", "label"]
        r = batch["image"]
        assert isinstance(r, RaggedImages)
        for j, label in enumerate(batch["label"].tolist()):
            assert torch.equal(r[j], ds[label]["image"].permute(2, 0, 1))
        seen += len(r)
    assert seen == 23


def test_image_collate_tuples_and_bare():
    ims = images([(4, 4), (6, 2)])
    out = ImageCollate(0)([(ims[0], 1), (ims[1], 2)])
    assert isinstance(out[0], RaggedImages) and out[1].tolist() == [1, 2]
    assert isinstance(ImageCollate()(ims), RaggedImages)
    with pytest.raises(KeyError, match="no field 'img'"):
        ImageCollate("img")([{"image": ims[0]}])
    with pytest.raises(ValueError, match="batch is empty"):
        ImageCollate()([])


def test_channels_last_views_are_packed_without_transposing():
    hwc = images([(5, 7), (3, 4)], layout="HWC")
    views = [im.permute(2, 0, 1) for im in hwc]  # [C, H, W] views of HWC memory, as decoders give
    r = RaggedImages.from_images(views, "CHW")
    assert r.layout == "HWC" and r.shapes == ((3, 5, 7), (3, 3, 4))
    assert torch.equal(r.data, torch.cat([im.reshape(-1) for im in hwc]))  # the bytes as they were
    for got, want in zip(r.images(), views, strict=True):
        assert torch.equal(got, want)
