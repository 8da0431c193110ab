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
    with pytest.raises(KeyError, match=r"keys \['image'\], and image_key='img' is not one"):
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
    fields = r"Samples of 2 fields, and image_key={} is none of them: image_key must be a "
    fields += r"position, 0 to 1, or a field name of \('label', 'image'\)"
    with pytest.raises(KeyError, match=fields.format("'img'")):
        ImageCollate("img")(data)
    with pytest.raises(KeyError, match=fields.format("2")):
        ImageCollate(2)(data)
    with pytest.raises(KeyError, match="tuples of 2 fields, and image_key='image' is none"):
        ImageCollate("image")([(im, 0) for im in ims])


def test_a_dict_sample_with_the_default_key_is_told_which_key_holds_the_image():
    # the Hugging Face habit: dict samples, the image under a name; ImageCollate() reads field 0
    sample = {"pixel_values": images([(4, 5)])[0], "labels": 3}
    with pytest.raises(KeyError) as e:
        ImageCollate()([sample])
    assert e.value.args[0] == (
        "ImageCollate: samples are dicts with the keys ['pixel_values', 'labels'], and "
        "image_key=0 is not one of them; the image is under 'pixel_values': pass "
        "image_key='pixel_values'"
    )
    with pytest.raises(KeyError) as e:
        ImageCollate()([{"ids": torch.zeros(4), "labels": 3}])
    assert e.value.args[0].endswith("is not one of them")  # no image to point at


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_pil_images_and_numpy_arrays_are_packed_as_a_transform_takes_them(workers, layout):
    # datasets that yield PIL images (an ImageFolder's default loader, Hugging Face's image
    # column) or numpy arrays [H, W, C]: the pixels torchvision's pil_to_tensor gives
    PIL = pytest.importorskip("PIL.Image")
    from torchvision.transforms.v2.functional import pil_to_tensor

    chw = images([(5, 7), (3, 2), (1, 1), (6, 4)], seed=3)
    data = []
    for i, im in enumerate(chw):
        hwc = im.permute(1, 2, 0).numpy()
        data.append({"image": PIL.fromarray(hwc) if i % 2 else hwc.copy(), "label": i})
    data.append({"image": PIL.fromarray(chw[0][0].numpy(), mode="L"), "label": 4})  # grey
    loader = DataLoader(
        data[:4], batch_size=4, num_workers=workers, collate_fn=ImageCollate("image", layout)
    )
    (batch,) = list(loader)
    assert isinstance(batch["image"], RaggedImages) and batch["label"].tolist() == [0, 1, 2, 3]
    for j, im in enumerate(chw):
        assert torch.equal(batch["image"][j], im)
    grey = ImageCollate("image", layout)([data[4]])["image"]
    assert torch.equal(grey[0], pil_to_tensor(data[4]["image"]))
    with pytest.raises(TypeError, match="mode 'I;16' has no 8-bit channels"):
        ImageCollate("image")([{"image": PIL.new("I;16", (3, 3)), "label": 0}])


@pytest.mark.parametrize("workers", [0, 2])
def test_pil_samples_through_a_collate_transform_in_workers(workers):
    # ImageFolder's PIL images, the batch transform run by the collate (in the workers: where
    # it writes into the batch's shared memory)
    PIL = pytest.importorskip("PIL.Image")
    from torchfeed.transforms import ResizeCenterCropNormalize

    chw = images([(9, 12), (16, 10), (7, 7)], seed=5)
    data = [(PIL.fromarray(im.permute(1, 2, 0).numpy()), i) for i, im in enumerate(chw)]
    t = ResizeCenterCropNormalize(6, 5, mean=0.5, std=0.25)
    loader = DataLoader(
        data, batch_size=3, num_workers=workers, collate_fn=ImageCollate(0, transform=t)
    )
    ((out, labels),) = list(loader)
    assert labels.tolist() == [0, 1, 2]
    assert torch.equal(out, t(chw))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_fused_compose_is_the_collates_batch_transform(workers):
    # the habit: the torchvision Compose one has, given to the collate; fused whole, it runs on
    # the batch as it runs per sample
    from torchvision.transforms import v2

    import torchfeed

    compose = v2.Compose(
        [
            v2.Resize(12, antialias=True),
            v2.CenterCrop(10),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3]),
        ]
    )
    fused = torchfeed.fuse(compose)
    ims = images([(20, 30), (16, 16), (31, 13)], seed=7)
    loader = DataLoader(
        [(im, i) for i, im in enumerate(ims)],
        batch_size=3,
        num_workers=workers,
        collate_fn=ImageCollate(0, transform=fused),
    )
    ((out, labels),) = list(loader)
    assert labels.tolist() == [0, 1, 2] and out.shape == (3, 3, 10, 10)
    for j, im in enumerate(ims):
        assert torch.equal(out[j], fused(im))
    with pytest.raises(TypeError, match="a torchvision Compose runs per sample: give it to"):
        ImageCollate(0, transform=compose)
    partly = torchfeed.fuse(v2.Compose([v2.ColorJitter(0.4), *compose.transforms]))
    with pytest.raises(TypeError, match="of which torchfeed runs only the fused ones on a batch"):
        ImageCollate(0, transform=partly)
    with pytest.raises(TypeError, match=r"torchfeed.fuse of a Compose that fuses whole\), got"):
        ImageCollate(0, transform=lambda x: x)
