"""The batch transforms (torchvision v2 form): per-image draws, targets, options, buffers."""

from __future__ import annotations

import pickle

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

from torchfeed._output_buffer import OutputBuffer
from torchfeed.ops.crop_flip_normalize import crop_flip_normalize
from torchfeed.transforms import (
    RandomResizedCropFlipNormalize,
    ResizeCenterCropNormalize,
    ResizeRandomFlipNormalize,
)

from helpers import DEVICES
from image_cases import MEAN, STD, boxes_cases, images_of, tv_float


def test_transform_draws_per_image_and_matches_functional():
    sizes = [(300, 400), (480, 333), (224, 224), (120, 150)]
    images = images_of(sizes, seed=12)
    t = RandomResizedCropFlipNormalize(
        64, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(5), return_params=True
    )
    out, params = t(images)
    ref = tv_float(
        images, params["boxes"].tolist(), params["flips"].tolist(), (64, 64), "bilinear", True
    )
    assert (out - ref).abs().max().item() <= 1e-4
    assert len({tuple(b) for b in params["boxes"].tolist()}) == 4  # one draw per image


def test_transform_same_generator_same_output():
    images = images_of([(100, 120)] * 3)
    mk = lambda: RandomResizedCropFlipNormalize(  # noqa: E731
        32, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(9)
    )
    assert torch.equal(mk()(images), mk()(images))


def test_transform_on_dense_batch_and_tv_image():
    dense = torch.stack(images_of([(60, 80)] * 5))
    t = RandomResizedCropFlipNormalize(
        24, mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True
    )
    out = t(tv_tensors.Image(dense))
    assert isinstance(out, tv_tensors.Image) and out.shape == (5, 3, 24, 24)
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    hwc = RandomResizedCropFlipNormalize(24, mean=MEAN, std=STD, image_layout="HWC")
    assert hwc(dense.permute(0, 2, 3, 1)).shape == (5, 3, 24, 24)


def test_transform_in_compose_and_pickled():
    t = v2.Compose(
        [
            RandomResizedCropFlipNormalize(
                16, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(2)
            )
        ]
    )
    images = images_of([(40, 40), (50, 30)])
    first = t(images)
    clone = pickle.loads(pickle.dumps(t))
    assert clone(images).shape == first.shape
    ev = pickle.loads(pickle.dumps(ResizeCenterCropNormalize(20, 16, mean=MEAN, std=STD)))
    assert ev(images).shape == (2, 3, 16, 16)


def test_boxes_and_masks_follow_their_image():
    sizes = [(60, 80), (90, 70)]
    images = images_of(sizes, seed=13)
    targets = []
    for h, w in sizes:
        boxes = tv_tensors.BoundingBoxes(
            [[5, 6, 40, 50], [0, 0, w, h]], format="XYXY", canvas_size=(h, w)
        )
        mask = tv_tensors.Mask(torch.randint(0, 2, (1, h, w), dtype=torch.uint8))
        targets.append({"boxes": boxes, "masks": mask, "label": 3})
    t = RandomResizedCropFlipNormalize(
        32,
        mean=MEAN,
        std=STD,
        p_flip=0.5,
        generator=torch.Generator().manual_seed(1),
        return_params=True,
    )
    (out, new_targets), params = t((images, targets))
    assert out.shape == (2, 3, 32, 32)
    for b, target in enumerate(targets):
        top, left, height, width = params["boxes"][b].tolist()
        want_boxes = TF.resized_crop(target["boxes"], top, left, height, width, [32, 32])
        want_mask = TF.resized_crop(
            target["masks"],
            top,
            left,
            height,
            width,
            [32, 32],
            interpolation=v2.InterpolationMode.NEAREST,
        )
        if bool(params["flips"][b]):
            want_boxes, want_mask = TF.horizontal_flip(want_boxes), TF.horizontal_flip(want_mask)
        got = new_targets[b]
        assert isinstance(got["boxes"], tv_tensors.BoundingBoxes)
        assert torch.equal(got["boxes"], want_boxes) and torch.equal(got["masks"], want_mask)
        assert got["label"] == 3


def test_eval_transform_targets():
    images = images_of([(100, 80)])
    mask = tv_tensors.Mask(torch.randint(0, 2, (1, 100, 80), dtype=torch.uint8))
    out, (target,) = ResizeCenterCropNormalize(64, 48, mean=MEAN, std=STD)((images, [mask]))
    want = TF.center_crop(TF.resize(mask, [64], interpolation=v2.InterpolationMode.NEAREST), [48])
    assert torch.equal(target, want) and out.shape == (1, 3, 48, 48)


@pytest.mark.parametrize("device", DEVICES)
def test_transform_keeps_device(device):
    images = [i.to(device) for i in images_of([(40, 50), (30, 30)])]
    out = RandomResizedCropFlipNormalize(12, mean=MEAN, std=STD)(images)
    assert out.device.type == device


def test_resize_flip_normalize_is_the_crop_transform_on_whole_images(isa):
    """The second half of RandomResizedCropFlipNormalize: on crops already cut out it gives what
    the crop transform gives on the full images (and torchvision's float path)."""
    sizes, boxes = boxes_cases()
    images = images_of(sizes, seed=21)
    crops = [i[:, y : y + h, x : x + w] for i, (y, x, h, w) in zip(images, boxes, strict=True)]
    t = ResizeRandomFlipNormalize(
        (40, 36),
        p_flip=0.5,
        mean=MEAN,
        std=STD,
        return_params=True,
        generator=torch.Generator().manual_seed(1),
    )
    out, params = t(crops)
    flips = params["flips"]
    assert set(params) == {"flips"} and 0 < int(flips.sum()) < len(crops)
    want = crop_flip_normalize(images, torch.tensor(boxes), flips, (40, 36), mean=MEAN, std=STD)
    assert (out - want).abs().max().item() <= 1e-5
    whole = [(0, 0, c.shape[1], c.shape[2]) for c in crops]
    ref = tv_float(crops, whole, flips.tolist(), (40, 36), "bilinear", True)
    assert (out - ref).abs().max().item() <= 1e-4


def test_resize_flip_normalize_targets_and_options():
    images = images_of([(60, 80), (90, 70)], seed=22)
    masks = [
        tv_tensors.Mask(torch.randint(0, 2, (1, h, w), dtype=torch.uint8))
        for h, w in [(60, 80), (90, 70)]
    ]
    t = ResizeRandomFlipNormalize(
        32, p_flip=1.0, mean=MEAN, std=STD, dtype=torch.bfloat16, channels_last=True
    )
    out, targets = t((images, masks))
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.bfloat16
    assert out.is_contiguous(memory_format=torch.channels_last)
    for mask, got in zip(masks, targets, strict=True):
        want = TF.horizontal_flip(
            TF.resize(mask, [32, 32], interpolation=v2.InterpolationMode.NEAREST)
        )
        assert torch.equal(got, want)
    hwc = ResizeRandomFlipNormalize(16, p_flip=0.0, mean=MEAN, std=STD, image_layout="HWC")
    dense = torch.stack(images_of([(20, 30)] * 2))
    chw = ResizeRandomFlipNormalize(16, p_flip=0.0, mean=MEAN, std=STD)
    assert torch.equal(hwc(dense.permute(0, 2, 3, 1)), chw(list(dense)))
    clone = pickle.loads(pickle.dumps(t))
    assert clone.size == (32, 32) and clone.p_flip == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(p_flip=-0.1), ValueError, r"p_flip must be in \[0, 1\]"),
        (dict(generator="seed"), TypeError, "generator must be a torch.Generator"),
        (dict(size=0), ValueError, "size must be positive"),
        (dict(std=(1.0, 1.0, 0.0)), ValueError, r"std\[2\] is 0"),
    ],
)
def test_bad_resize_flip_normalize_configuration(kwargs, error, match):
    base = dict(size=16, mean=MEAN, std=STD)
    base.update(kwargs)
    with pytest.raises(error, match=match):
        ResizeRandomFlipNormalize(**base)


def test_output_buffer_reused_only_when_free():
    pool = OutputBuffer(slots=3)
    args = ((2, 3, 4, 4), torch.float32, torch.device("cpu"), torch.contiguous_format)
    a = pool.get(*args)
    b = pool.get(*args)
    assert a.data_ptr() != b.data_ptr()  # a is still held
    view = b[0]
    del a, b
    c = pool.get(*args)
    assert c.data_ptr() != view.data_ptr()  # b's memory is still seen through a view
    ptr_c = c.data_ptr()
    del c
    d = pool.get(*args)
    assert d.data_ptr() == ptr_c  # free again: reused
    del view, d
    e, f = pool.get(*args), pool.get(*args)
    assert e.data_ptr() != f.data_ptr()


def test_transform_never_overwrites_a_held_output():
    images = images_of([(40, 50)] * 2)
    t = RandomResizedCropFlipNormalize(
        8, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(0)
    )
    outs = [t(images) for _ in range(5)]
    copies = [o.clone() for o in outs]
    t(images)
    assert all(torch.equal(o, c) for o, c in zip(outs, copies, strict=True))
    assert len({o.data_ptr() for o in outs}) == 5


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(scale=(0.9, 0.1)), ValueError, r"scale must be \(min, max\) with min <= max"),
        (dict(ratio=(0.0, 1.0)), ValueError, "ratio values must be > 0"),
        (dict(p_flip=1.5), ValueError, r"p_flip must be in \[0, 1\]"),
        (dict(std=(1.0, 0.0, 1.0)), ValueError, r"std\[1\] is 0"),
        (dict(generator=3), TypeError, "generator must be a torch.Generator"),
        (dict(dtype=torch.int32), TypeError, "dtype must be"),
        (dict(size=-3), ValueError, "size must be positive"),
    ],
)
def test_bad_transform_configuration(kwargs, error, match):
    base = dict(size=16, mean=MEAN, std=STD)
    base.update(kwargs)
    with pytest.raises(error, match=match):
        RandomResizedCropFlipNormalize(**base)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (
            lambda: RandomResizedCropFlipNormalize(16),
            "RandomResizedCropFlipNormalize: mean and std are required",
        ),
        (
            lambda: ResizeRandomFlipNormalize(16, mean=MEAN),
            "ResizeRandomFlipNormalize: std is required",
        ),
        (
            lambda: ResizeCenterCropNormalize(20, 16, std=STD),
            "ResizeCenterCropNormalize: mean is required",
        ),
        (
            lambda: ResizeCenterCropNormalize(20, 16, mean=MEAN, std=STD, p_flip=0.5),
            "ResizeCenterCropNormalize: unexpected keyword argument 'p_flip'; its options are mean, std",
        ),
        (
            lambda: RandomResizedCropFlipNormalize(16, mean=MEAN, std=STD, interpolate="nearest"),
            "unexpected keyword argument 'interpolate'",
        ),
    ],
)
def test_a_missing_or_unknown_option_is_named(make, match):
    """Not Python's "ImageOptions.__init__() missing 2 required positional arguments", which
    names a class the user never wrote."""
    with pytest.raises(TypeError, match=match) as e:
        make()
    assert "ImageOptions" not in str(e.value)


def test_bad_targets():
    t = RandomResizedCropFlipNormalize(8, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match=r"targets must be a list with one entry per image \(2\)"):
        t((images_of([(20, 20)] * 2), [{"a": 1}]))


def test_what_a_call_reads_is_found_once_and_is_not_part_of_the_value():
    """ImageOptions and Plan keep what every call reads (the op's mode, the per-channel lists,
    the steps' roles); equality, hashing, repr and pickling still go by the fields alone, and a
    channel count that does not fit is refused at every call, not remembered."""
    from torchfeed.ops._image_op import ImageOptions
    from torchfeed.transforms._plan import Flip, Plan, RandomCrop

    a, b = ImageOptions(MEAN, STD), ImageOptions(MEAN, STD)
    assert a.per_channel(3) == (list(MEAN), list(STD))
    assert a == b and hash(a) == hash(b) and "_per_channel" not in repr(a)
    copy = pickle.loads(pickle.dumps(a))
    assert copy == a and copy.per_channel(3) == a.per_channel(3) and copy.mode == a.mode == 1
    assert ImageOptions([0.5], [0.25]).per_channel(2) == ([0.5, 0.5], [0.25, 0.25])
    for _ in range(2):
        with pytest.raises(ValueError, match=r"mean must have 1 or 4 values .*got 3"):
            a.per_channel(4)

    crop = RandomCrop((8, 8), (0.08, 1.0), (0.75, 4 / 3))
    plan = Plan((crop, Flip(0.5)))
    assert plan == Plan((crop, Flip(0.5))) and hash(plan) == hash(Plan((crop, Flip(0.5))))
    assert plan != Plan((Flip(0.5), crop)) and "_crop" not in repr(plan)
    assert (plan.flip, plan.random_crop, plan.fixed_size()) == (Flip(0.5), True, (8, 8))
    assert pickle.loads(pickle.dumps(plan)).fixed_size() == (8, 8)
    assert Plan(()).fixed_size() is None and Plan(()).flip is None
