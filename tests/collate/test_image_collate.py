"""ImageCollate: images of any size into one RaggedImages buffer, in DataLoader workers, for
dict, tuple and bare samples."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchfeed import ImageCollate, RaggedImages


def images(sizes, channels=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (channels, h, w), generator=g, dtype=torch.uint8) for h, w in sizes
    ]


class ImageDataset(Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        h, w = (int(v) for v in torch.randint(5, 40, (2,), generator=g))
        return {
            "image": torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8),
            "label": i,
        }


@pytest.mark.parametrize("workers", [0, 2])
def test_image_collate_in_dataloader(workers):
    ds = ImageDataset()
    loader = DataLoader(
        ds, batch_size=5, num_workers=workers, collate_fn=ImageCollate("image", layout="HWC")
    )
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


Sample = collections.namedtuple("Sample", "label image")


@pytest.mark.parametrize("workers", [0, 2])
def test_image_collate_namedtuples_by_position_or_name(workers):
    ims = images([(4 + i, 3 + 2 * i) for i in range(6)])
    data = [Sample(i, im) for i, im in enumerate(ims)]
    for key in ("image", 1):
        loader = DataLoader(data, batch_size=3, num_workers=workers, collate_fn=ImageCollate(key))
        for b, batch in enumerate(loader):
            assert type(batch) is Sample and isinstance(batch.image, RaggedImages)
            assert batch.label.tolist() == [3 * b, 3 * b + 1, 3 * b + 2]
            for j, label in enumerate(batch.label.tolist()):
                assert torch.equal(batch.image[j], ims[label])
    with pytest.raises(KeyError, match="no position 'img'"):
        ImageCollate("img")(data)
    with pytest.raises(KeyError, match="no position 2"):
        ImageCollate(2)(data)
