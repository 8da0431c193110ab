"""RaggedImages: packing, views, movement, pickling."""

from __future__ import annotations

import pickle

import pytest
import torch

from torchfeed import RaggedImages


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
        TypeError, match=r"images\[1\] is torch.float32 but images\[0\] is torch.uint8"
    ):
        RaggedImages.from_images([torch.zeros(3, 2, 2, dtype=torch.uint8), torch.zeros(3, 2, 2)])
    # a device mismatch is a ValueError, as in every other check (meta: no GPU needed)
    with pytest.raises(ValueError, match=r"images\[1\] is on meta but images\[0\] is on cpu"):
        RaggedImages.from_images(
            [
                torch.zeros(3, 2, 2, dtype=torch.uint8),
                torch.zeros(3, 2, 2, dtype=torch.uint8, device="meta"),
            ]
        )
    with pytest.raises(ValueError, match="image_layout must be 'CHW' or 'HWC'"):
        RaggedImages.from_images([torch.zeros(3, 2, 2)], "WHC")
    with pytest.raises(ValueError, match="data holds 5 elements but the shapes need 12"):
        RaggedImages(torch.zeros(5, dtype=torch.uint8), [(3, 2, 2)])
    with pytest.raises(ValueError, match=r"shapes\[1\] has 1 channels but shapes\[0\] has 3"):
        RaggedImages(torch.zeros(16, dtype=torch.uint8), [(3, 2, 2), (1, 2, 2)])


def test_channels_last_views_are_packed_without_transposing():
    hwc = images([(5, 7), (3, 4)], layout="HWC")
    views = [im.permute(2, 0, 1) for im in hwc]  # [C, H, W] views of HWC memory, as decoders give
    r = RaggedImages.from_images(views, "CHW")
    assert r.layout == "HWC" and r.shapes == ((3, 5, 7), (3, 3, 4))
    assert torch.equal(r.data, torch.cat([im.reshape(-1) for im in hwc]))  # the bytes as they were
    for got, want in zip(r.images(), views, strict=True):
        assert torch.equal(got, want)
