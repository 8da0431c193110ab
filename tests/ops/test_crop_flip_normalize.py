"""crop_flip_normalize / resize_center_crop_normalize, the parameter sampler and the batch
transforms, against torchvision's functional ops and an independent float64 reference."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

import torchfeed
from torchfeed import RaggedImages, reference
from torchfeed._output_buffer import OutputBuffer
from torchfeed.ops.crop_flip_normalize import grid_from_boxes
from torchfeed.transforms import (
    RandomResizedCropFlipNormalize,
    ResizeCenterCropNormalize,
    ResizeFlipNormalize,
    crop_flip_normalize,
    resized_crop_box,
    sample_flips,
    sample_resized_crop_params,
)

from helpers import DEVICES

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
MODES = [("bilinear", True), ("bilinear", False), ("nearest", False)]


@pytest.fixture(params=["avx2", "baseline"])
def isa(request):
    """Runs a test with each instruction set of the CPU kernel (where the machine has it)."""
    before = torchfeed._C.cpu_isa()
    now = torchfeed._C._testing.limit_cpu_isa(request.param)
    if now != request.param:
        torchfeed._C._testing.limit_cpu_isa(before)
        pytest.skip(f"this CPU has no {request.param}")
    yield now
    torchfeed._C._testing.limit_cpu_isa("avx2")


def images_of(sizes, channels=3, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, 256, (channels, h, w), generator=g, dtype=torch.uint8).to(device)
        for h, w in sizes
    ]


def boxes_cases():
    """(sizes, boxes, out size): down- and upscaling, every border, 1x1 and 1xN crops, odd
    sizes, the whole image."""
    sizes = [(57, 83), (40, 31), (9, 7), (64, 64), (33, 100), (5, 120)]
    boxes = [
        (0, 0, 57, 83),  # whole image, downscale
        (39, 30, 1, 1),  # 1x1 crop in the bottom-right corner, upscale
        (0, 2, 9, 5),  # touches top and bottom
        (10, 0, 54, 64),  # touches left, bottom, right
        (32, 1, 1, 99),  # a 1xN crop at the bottom border
        (0, 100, 5, 20),  # touches top, right, bottom
    ]
    return sizes, boxes


def tv_float(images, boxes, flips, size, interpolation, antialias):
    return reference.crop_flip_normalize_torchvision(
        images, boxes, flips, size, MEAN, STD, interpolation, antialias
    )


# --- parity -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("interpolation", "antialias"), MODES)
@pytest.mark.parametrize("size", [(32, 32), (97, 61), (1, 1), (224, 224)])
def test_matches_torchvision_float_path(isa, interpolation, antialias, size):
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    flips = [False, True, True, False, True, False]
    out = torchfeed.crop_flip_normalize(images, boxes, flips, size, mean=MEAN, std=STD,
                                        interpolation=interpolation, antialias=antialias)  # fmt: skip
    ref = tv_float(images, boxes, flips, size, interpolation, antialias)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize(("interpolation", "antialias"), MODES)
def test_within_one_level_of_torchvision_uint8_path(interpolation, antialias):
    # torchvision resizes uint8 images with fixed-point weights and rounds; measured here, it
    # lands up to 1.0 level (not 0.5) from the exact value, so the bound is 1 level / std.
    sizes = [(300, 400), (480, 333), (224, 224), (120, 150)]
    images = images_of(sizes, seed=3)
    g = torch.Generator().manual_seed(4)
    boxes = sample_resized_crop_params(sizes, generator=g)
    flips = sample_flips(len(sizes), generator=g)
    out = torchfeed.crop_flip_normalize(images, boxes, flips, 224, mean=MEAN, std=STD,
                                        interpolation=interpolation, antialias=antialias)  # fmt: skip
    ref = reference.crop_flip_normalize_torchvision(
        images, boxes.tolist(), flips.tolist(), (224, 224), MEAN, STD, interpolation, antialias,
        float_path=False,
    )  # fmt: skip
    bound = torch.tensor([1.01 / 255 / s + 1e-4 for s in STD]).view(1, 3, 1, 1)
    assert bool(((out - ref).abs() <= bound).all())


@pytest.mark.parametrize(("interpolation", "antialias"), MODES)
def test_float_boxes_match_float64_reference(isa, interpolation, antialias):
    sizes = [(57, 83), (40, 31), (12, 200)]
    images = images_of(sizes, seed=5)
    boxes = [(3.25, 7.5, 40.5, 60.1), (0.0, 0.4, 39.9, 30.6), (1.7, 0.0, 10.3, 200.0)]
    flips = [True, False, True]
    size = (29, 47)
    out = torchfeed.crop_flip_normalize(images, boxes, flips, size, mean=MEAN, std=STD,
                                        interpolation=interpolation, antialias=antialias)  # fmt: skip
    for b in range(3):
        ref = reference.crop_flip_normalize_float64(
            images[b], boxes[b], flips[b], size, MEAN, STD, interpolation, antialias
        )
        assert (out[b].double() - ref).abs().max().item() <= 1e-4, b


def test_integer_valued_float_boxes_equal_int_boxes():
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    a = torchfeed.crop_flip_normalize(images, boxes, None, 24, mean=MEAN, std=STD)
    b = torchfeed.crop_flip_normalize(
        images, torch.tensor(boxes, dtype=torch.float32), None, 24, mean=MEAN, std=STD
    )
    assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_layouts_and_memory_formats(isa, layout, channels_last, channels):
    sizes = [(50, 61), (50, 61), (50, 61)]
    images = images_of(sizes, channels=channels, seed=7)
    boxes = [(0, 0, 50, 61), (5, 6, 30, 40), (49, 0, 1, 61)]
    flips = [False, True, False]
    mean, std = [0.5] * channels, [0.25] * channels
    dense = torch.stack(images)
    inputs = dense if layout == "CHW" else dense.permute(0, 2, 3, 1).contiguous()
    out = torchfeed.crop_flip_normalize(inputs, boxes, flips, (33, 35), mean=mean, std=std,
                                        channels_last=channels_last, image_layout=layout)  # fmt: skip
    assert out.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    ref = reference.crop_flip_normalize_torchvision(images, boxes, flips, (33, 35), mean, std)
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("channels", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_interleaved_and_planar_sources_give_identical_outputs(isa, channels, dtype, channels_last):
    """HWC memory (what decoders return) takes a pixel-wise horizontal pass, CHW memory a
    gathering one: the same products in the same order, so the same bits. Odd widths, 1-pixel
    crops, flips and up- and downscaling."""
    sizes, boxes = boxes_cases()
    planar = images_of(sizes, channels=channels, seed=30)
    interleaved = [i.permute(1, 2, 0).contiguous().permute(2, 0, 1) for i in planar]
    flips = [True, False, True, True, False, False]
    mean, std = [0.4] * channels, [0.3] * channels
    for size in [(33, 35), (1, 1), (224, 97)]:
        a, b = (
            torchfeed.crop_flip_normalize(
                src,
                boxes,
                flips,
                size,
                mean=mean,
                std=std,
                dtype=dtype,
                channels_last=channels_last,
            )
            for src in (planar, interleaved)
        )
        assert torch.equal(a, b), size


def test_ragged_dense_and_packed_inputs_agree(isa):
    sizes = [(40, 50)] * 4
    images = images_of(sizes, seed=8)
    boxes = [(1, 2, 30, 40), (0, 0, 40, 50), (10, 10, 3, 5), (39, 49, 1, 1)]
    flips = [True, False, True, False]
    kw = dict(mean=MEAN, std=STD)
    dense = torchfeed.crop_flip_normalize(torch.stack(images), boxes, flips, 21, **kw)
    listed = torchfeed.crop_flip_normalize(images, boxes, flips, 21, **kw)
    packed = torchfeed.crop_flip_normalize(RaggedImages.from_images(images), boxes, flips, 21, **kw)
    hwc = RaggedImages.from_images([i.permute(1, 2, 0).contiguous() for i in images], "HWC")
    packed_hwc = torchfeed.crop_flip_normalize(hwc, boxes, flips, 21, **kw)
    assert torch.equal(dense, listed) and torch.equal(dense, packed)
    assert (dense - packed_hwc).abs().max().item() <= 1e-5


def test_non_contiguous_inputs():
    base = images_of([(80, 90)] * 3, seed=9)
    views = [im[:, ::2, 1::3] for im in base]  # strided views, no copy
    boxes = [(0, 0, 40, 30), (3, 4, 20, 20), (39, 29, 1, 1)]
    out = torchfeed.crop_flip_normalize(views, boxes, [True, False, True], 16, mean=MEAN, std=STD)
    ref = tv_float([v.contiguous() for v in views], boxes, [True, False, True], (16, 16),
                   "bilinear", True)  # fmt: skip
    assert (out - ref).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_outputs_are_the_float32_output_rounded(dtype):
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    kw = dict(mean=MEAN, std=STD)
    ref = torchfeed.crop_flip_normalize(images, boxes, None, 40, **kw)
    out = torchfeed.crop_flip_normalize(images, boxes, None, 40, dtype=dtype, **kw)
    assert out.dtype == dtype
    # within one unit in the last place of the low-precision format
    ulp = torch.finfo(dtype).eps * ref.abs().clamp_min(torch.finfo(dtype).tiny)
    assert bool(((out.float() - ref).abs() <= ulp).all())


def test_batch_of_one_and_of_zero():
    images = images_of([(30, 40)])
    out = torchfeed.crop_flip_normalize(images, [(0, 0, 30, 40)], [True], 8, mean=MEAN, std=STD)
    assert out.shape == (1, 3, 8, 8)
    empty = torchfeed.crop_flip_normalize(torch.empty(0, 3, 30, 40, dtype=torch.uint8),
                                          torch.empty(0, 4), None, 8, mean=MEAN, std=STD)  # fmt: skip
    assert empty.shape == (0, 3, 8, 8)


def test_out_argument_is_written_and_returned():
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    out = torch.full((6, 3, 17, 19), float("nan"))
    got = torchfeed.crop_flip_normalize(images, boxes, None, (17, 19), mean=MEAN, std=STD, out=out)
    assert got is out and not bool(out.isnan().any())
    assert torch.equal(out, torchfeed.crop_flip_normalize(images, boxes, None, (17, 19),
                                                          mean=MEAN, std=STD))  # fmt: skip


def test_inputs_not_modified():
    images = images_of([(30, 40), (20, 20)])
    before = [i.clone() for i in images]
    boxes = torch.tensor([[0, 0, 30, 40], [1, 1, 5, 5]])
    flips = torch.tensor([True, False])
    torchfeed.crop_flip_normalize(images, boxes, flips, 8, mean=MEAN, std=STD)
    assert all(torch.equal(a, b) for a, b in zip(images, before, strict=True))
    assert boxes.tolist() == [[0, 0, 30, 40], [1, 1, 5, 5]] and flips.tolist() == [True, False]


def test_every_output_element_written():
    # NaN-filled outputs: any element the kernel skips stays NaN
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    for channels_last in (False, True):
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        out = torch.full((6, 3, 13, 222), float("nan")).contiguous(memory_format=fmt)
        torchfeed.crop_flip_normalize(images, boxes, [True] * 6, (13, 222), mean=MEAN, std=STD,
                                      out=out)  # fmt: skip
        assert not bool(out.isnan().any())


# --- the CUDA kernels' thread bodies, emulated on the CPU -----------------------------------------


@pytest.mark.parametrize(("interpolation", "antialias"), MODES)
def test_cuda_thread_bodies_match_cpu_kernel(interpolation, antialias):
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    images[1] = images[1].permute(1, 2, 0).contiguous().permute(2, 0, 1)  # an HWC image
    flips = torch.tensor([True, False, True, True, False, True])
    grid = grid_from_boxes(torch.tensor(boxes, dtype=torch.float64), [i.shape[1:] for i in images],
                           (23, 45))  # fmt: skip
    mode = 0 if interpolation == "nearest" else 1
    for fmt in (torch.contiguous_format, torch.channels_last):
        a = torch.empty(6, 3, 23, 45).contiguous(memory_format=fmt)
        b = torch.full((6, 3, 23, 45), float("nan")).contiguous(memory_format=fmt)
        torch.ops.torchfeed.crop_flip_normalize_list_out(images, grid, flips, mode, antialias,
                                                         MEAN, STD, a)  # fmt: skip
        torch.ops.torchfeed_testing.emulate_cuda_crop_flip_normalize_list_out(
            images, grid, flips, mode, antialias, MEAN, STD, b
        )
        assert (a - b).abs().max().item() <= 1e-5


# --- the eval transform ---------------------------------------------------------------------------


@pytest.mark.parametrize(("interpolation", "antialias"), MODES)
@pytest.mark.parametrize(
    ("resize", "crop"), [(256, 224), (64, 64), ([50, 70], 33), (300, (224, 200))]
)
def test_resize_center_crop_matches_torchvision(interpolation, antialias, resize, crop):
    sizes = [(375, 500), (500, 333), (64, 64), (201, 99)]
    images = images_of(sizes, seed=11)
    out = torchfeed.resize_center_crop_normalize(images, resize, crop, mean=MEAN, std=STD,
                                                 interpolation=interpolation,
                                                 antialias=antialias)  # fmt: skip
    mode = v2.InterpolationMode(interpolation)
    for b, image in enumerate(images):
        x = TF.resize(image.float(), resize if isinstance(resize, list) else [resize],
                      interpolation=mode, antialias=antialias)  # fmt: skip
        x = TF.center_crop(x, list(crop) if isinstance(crop, tuple) else [crop])
        ref = TF.normalize(x / 255.0, MEAN, STD)
        assert (out[b] - ref).abs().max().item() <= 1e-4, b


def test_resize_center_crop_errors():
    with pytest.raises(
        ValueError,
        match=r"crop \(300, 300\) is larger than image \(64, 64\) resized to \(256, 256\)",
    ):
        torchfeed.resize_center_crop_normalize(images_of([(64, 64)]), 256, 300, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match="resize must be positive"):
        torchfeed.resize_center_crop_normalize(images_of([(64, 64)]), 0, 3, mean=MEAN, std=STD)


# --- random parameters ----------------------------------------------------------------------------


def ks_statistic(a: torch.Tensor, b: torch.Tensor) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    a, b = a.double().sort().values, b.double().sort().values
    grid = torch.cat([a, b]).sort().values
    fa = torch.searchsorted(a, grid, right=True).double() / len(a)
    fb = torch.searchsorted(b, grid, right=True).double() / len(b)
    return (fa - fb).abs().max().item()


@pytest.mark.parametrize("size", [(375, 500), (500, 281), (224, 224)])
def test_sampler_matches_torchvision_distribution(size):
    n = 4000
    ours = sample_resized_crop_params([size] * n, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    rrc = v2.RandomResizedCrop(224)
    image = torch.empty(3, *size, dtype=torch.uint8)
    theirs = torch.tensor([list(rrc.make_params([image]).values()) for _ in range(n)])
    area = size[0] * size[1]
    critical = 1.95 * math.sqrt(2 / n)  # alpha = 0.001
    for name, fn in [
        ("area fraction", lambda p: p[:, 2] * p[:, 3] / area),
        ("log aspect ratio", lambda p: torch.log(p[:, 3].double() / p[:, 2])),
        ("top", lambda p: p[:, 0].double()),
        ("left", lambda p: p[:, 1].double()),
    ]:
        d = ks_statistic(fn(ours), fn(theirs))
        assert d < critical, f"{name}: KS statistic {d:.4f} >= {critical:.4f}"


def test_sampler_boxes_fit_and_reproduce():
    sizes = [(375, 500), (10, 400), (1, 1), (600, 30)]
    a = sample_resized_crop_params(sizes * 100, generator=torch.Generator().manual_seed(3))
    b = sample_resized_crop_params(sizes * 100, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and a.dtype == torch.int64
    hw = torch.tensor(sizes * 100)
    assert bool((a[:, 2:] > 0).all())
    assert bool((a[:, 0] + a[:, 2] <= hw[:, 0]).all() and (a[:, 1] + a[:, 3] <= hw[:, 1]).all())


@pytest.mark.parametrize("size", [(10, 1000), (1000, 12), (50, 50)])
def test_sampler_fallback_is_torchvisions_center_crop(size):
    # scale (0.99, 1) with ratio (1, 1) only fits square images: others take the fallback
    ours = sample_resized_crop_params([size], scale=(0.99, 1.0), ratio=(1.0, 1.0),
                                      generator=torch.Generator().manual_seed(0))  # fmt: skip
    rrc = v2.RandomResizedCrop(8, scale=(0.99, 1.0), ratio=(1.0, 1.0))
    theirs = rrc.make_params([torch.empty(3, *size)])
    if size[0] != size[1]:
        assert ours[0].tolist() == [
            theirs["top"],
            theirs["left"],
            theirs["height"],
            theirs["width"],
        ]
    else:  # a square image fits at the first attempt: the whole image
        assert ours[0].tolist() == [0, 0, 50, 50]


@pytest.mark.parametrize(
    ("scale", "ratio"),
    [((0.08, 1.0), (3 / 4, 4 / 3)), ((0.99, 1.0), (1.0, 1.0)), ((0.5, 0.5), (2.0, 3.0))],
)
def test_scalar_sampler_draws_what_the_batch_sampler_draws(scale, ratio):
    """The same generator state gives the same box, fallback included (the second and third
    cases never fit most images)."""
    g = torch.Generator().manual_seed(0)
    sizes = [*torch.randint(1, 700, (400, 2), generator=g).tolist(), [1, 1], [1, 500], [500, 1]]
    a, b = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    for h, w in sizes:
        want = sample_resized_crop_params([(h, w)], scale, ratio, generator=a)[0].tolist()
        assert list(resized_crop_box(h, w, scale, ratio, generator=b)) == want, (h, w)


def test_scalar_sampler_errors():
    with pytest.raises(ValueError, match=r"the image must be at least 1 x 1, got 0 x 5"):
        resized_crop_box(0, 5)
    with pytest.raises(ValueError, match=r"scale must be \(min, max\) with min <= max"):
        resized_crop_box(5, 5, scale=(1.0, 0.5))
    with pytest.raises(ValueError, match="ratio values must be > 0"):
        resized_crop_box(5, 5, ratio=(-1.0, 1.0))


def test_flip_probability():
    flips = sample_flips(20000, 0.3, torch.Generator().manual_seed(0))
    assert abs(flips.double().mean().item() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 20000)
    assert not bool(sample_flips(100, 0.0).any()) and bool(sample_flips(100, 1.0).all())


# --- the batch transforms --------------------------------------------------------------------------


def test_transform_draws_per_image_and_matches_functional():
    sizes = [(300, 400), (480, 333), (224, 224), (120, 150)]
    images = images_of(sizes, seed=12)
    t = RandomResizedCropFlipNormalize(64, mean=MEAN, std=STD,
                                       generator=torch.Generator().manual_seed(5),
                                       return_params=True)  # fmt: skip
    out, params = t(images)
    ref = tv_float(images, params["boxes"].tolist(), params["flips"].tolist(), (64, 64),
                   "bilinear", True)  # fmt: skip
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
    t = RandomResizedCropFlipNormalize(24, mean=MEAN, std=STD, dtype=torch.bfloat16,
                                       channels_last=True)  # fmt: skip
    out = t(tv_tensors.Image(dense))
    assert isinstance(out, tv_tensors.Image) and out.shape == (5, 3, 24, 24)
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    hwc = RandomResizedCropFlipNormalize(24, mean=MEAN, std=STD, image_layout="HWC")
    assert hwc(dense.permute(0, 2, 3, 1)).shape == (5, 3, 24, 24)


def test_transform_in_compose_and_pickled():
    t = v2.Compose([RandomResizedCropFlipNormalize(16, mean=MEAN, std=STD,
                                                   generator=torch.Generator().manual_seed(2))])  # fmt: skip
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
        boxes = tv_tensors.BoundingBoxes([[5, 6, 40, 50], [0, 0, w, h]], format="XYXY",
                                         canvas_size=(h, w))  # fmt: skip
        mask = tv_tensors.Mask(torch.randint(0, 2, (1, h, w), dtype=torch.uint8))
        targets.append({"boxes": boxes, "masks": mask, "label": 3})
    t = RandomResizedCropFlipNormalize(32, mean=MEAN, std=STD, p_flip=0.5,
                                       generator=torch.Generator().manual_seed(1),
                                       return_params=True)  # fmt: skip
    (out, new_targets), params = t((images, targets))
    assert out.shape == (2, 3, 32, 32)
    for b, target in enumerate(targets):
        top, left, height, width = params["boxes"][b].tolist()
        want_boxes = TF.resized_crop(target["boxes"], top, left, height, width, [32, 32])
        want_mask = TF.resized_crop(target["masks"], top, left, height, width, [32, 32],
                                    interpolation=v2.InterpolationMode.NEAREST)  # fmt: skip
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
    t = ResizeFlipNormalize((40, 36), p_flip=0.5, mean=MEAN, std=STD, return_params=True,
                            generator=torch.Generator().manual_seed(1))  # fmt: skip
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
    masks = [tv_tensors.Mask(torch.randint(0, 2, (1, h, w), dtype=torch.uint8))
             for h, w in [(60, 80), (90, 70)]]  # fmt: skip
    t = ResizeFlipNormalize(32, p_flip=1.0, mean=MEAN, std=STD, dtype=torch.bfloat16,
                            channels_last=True)  # fmt: skip
    out, targets = t((images, masks))
    assert out.shape == (2, 3, 32, 32) and out.dtype == torch.bfloat16
    assert out.is_contiguous(memory_format=torch.channels_last)
    for mask, got in zip(masks, targets, strict=True):
        want = TF.horizontal_flip(
            TF.resize(mask, [32, 32], interpolation=v2.InterpolationMode.NEAREST)
        )
        assert torch.equal(got, want)
    hwc = ResizeFlipNormalize(16, p_flip=0.0, mean=MEAN, std=STD, image_layout="HWC")
    dense = torch.stack(images_of([(20, 30)] * 2))
    chw = ResizeFlipNormalize(16, p_flip=0.0, mean=MEAN, std=STD)
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
        ResizeFlipNormalize(**base)


# --- output buffer reuse --------------------------------------------------------------------------


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


# --- opcheck and torch.compile --------------------------------------------------------------------


def op_samples():
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    grid = grid_from_boxes(torch.tensor(boxes, dtype=torch.float64), sizes, (9, 11))
    flips = torch.tensor([True, False] * 3)
    dense = torch.stack(images_of([(20, 30)] * 2))
    dgrid = grid_from_boxes(torch.tensor([[0, 0, 20, 30], [3, 3, 5, 7]], dtype=torch.float64),
                            [(20, 30)] * 2, (9, 11))  # fmt: skip
    return images, grid, flips, dense, dgrid


@pytest.mark.parametrize(("interpolation", "antialias"), [(1, True), (1, False), (0, False)])
def test_opcheck(interpolation, antialias):
    images, grid, flips, dense, dgrid = op_samples()
    out = torch.empty(6, 3, 9, 11)
    torch.library.opcheck(torch.ops.torchfeed.crop_flip_normalize_list_out.default,
                          (images, grid, flips, interpolation, antialias, MEAN, STD, out))  # fmt: skip
    out2 = torch.empty(2, 3, 9, 11, dtype=torch.float16)
    torch.library.opcheck(torch.ops.torchfeed.crop_flip_normalize_out.default,
                          (dense, dgrid, flips[:2], interpolation, antialias, MEAN, STD, out2))  # fmt: skip


def test_torch_compile_fullgraph():
    _, _, flips, dense, dgrid = op_samples()

    def fn(dense, grid, flips):
        out = torch.empty(2, 3, 9, 11)
        torch.ops.torchfeed.crop_flip_normalize_out(dense, grid, flips, 1, True, MEAN, STD, out)
        return out * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(dense, dgrid, flips[:2]), fn(dense, dgrid, flips[:2]))


# --- bad input ------------------------------------------------------------------------------------


def call(images=None, boxes=None, flips=None, size=8, **kw):
    images = images_of([(20, 30), (20, 30)]) if images is None else images
    boxes = [(0, 0, 20, 30), (1, 1, 5, 5)] if boxes is None else boxes
    kw.setdefault("mean", MEAN)
    kw.setdefault("std", STD)
    return torchfeed.crop_flip_normalize(images, boxes, flips, size, **kw)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(images=[torch.zeros(3, 4, 4)]), TypeError, r"images\[0\] must be uint8, got torch.float32"),
        (dict(images=torch.zeros(2, 3, 4, 4)), TypeError, "images must be uint8, got torch.float32"),
        (dict(images=images_of([(20, 30)] * 2, channels=5), mean=[0] * 5, std=[1] * 5), ValueError, "must have 1 to 4 channels, got 5"),
        (dict(images=[torch.zeros(3, 4, 4, dtype=torch.uint8), torch.zeros(1, 4, 4, dtype=torch.uint8)]), ValueError, r"images\[1\] has 1 channels but images\[0\] has 3"),
        (dict(images=torch.zeros(3, 4, 4, dtype=torch.uint8)), ValueError, r"images must be a \[B, C, H, W\] batch"),
        (dict(images="x"), TypeError, "images must be a uint8 tensor batch"),
        (dict(boxes=[(0, 0, 21, 30), (1, 1, 5, 5)]), ValueError, r"boxes\[0\] = \[0.0, 0.0, 21.0, 30.0\] .* inside image 0 of size \(H, W\) = \(20, 30\)"),
        (dict(boxes=[(0, 0, 20, 30), (-1, 1, 5, 5)]), ValueError, r"boxes\[1\] .* must have a positive size and lie inside"),
        (dict(boxes=[(0, 0, 20, 30), (1, 1, 0, 5)]), ValueError, r"boxes\[1\] .* must have a positive size"),
        (dict(boxes=[(0, 0, 20, 30), (1, 1, 5, float("nan"))]), ValueError, r"boxes\[1\]"),
        (dict(boxes=[(0, 0, 20, 30)]), ValueError, r"boxes must have shape \[2, 4\]"),
        (dict(flips=[True]), ValueError, r"flips must have shape \[2\], got \[1\]"),
        (dict(flips=[1, 0]), TypeError, "flips must be bool, got torch.int64"),
        (dict(size=0), ValueError, r"size must be positive, got \(0, 0\)"),
        (dict(size=(8, -1)), ValueError, "size must be positive"),
        (dict(size=2.5), TypeError, "size must be an int or"),
        (dict(mean=[0.5, 0.5]), ValueError, "mean must have 1 or 3 values"),
        (dict(std=[1, 1, 1, 1]), ValueError, "std must have 1 or 3 values"),
        (dict(std=[0.2, 0.0, 0.2]), ValueError, r"std\[1\] is 0"),
        (dict(dtype=torch.float64), TypeError, "dtype must be torch.float32, torch.float16 or torch.bfloat16"),
        (dict(dtype=torch.uint8), TypeError, "dtype must be"),
        (dict(interpolation="bicubic"), ValueError, "interpolation must be 'bilinear' or 'nearest'"),
        (dict(image_layout="CWH"), ValueError, "image_layout must be 'CHW' or 'HWC'"),
        (dict(out=torch.empty(2, 3, 8, 9)), ValueError, r"out must be a float32/float16/bfloat16 tensor of shape \[2, 3, 8, 8\]"),
    ],
)  # fmt: skip
def test_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        call(**kwargs)


def test_parameters_on_another_device():
    # the meta device stands in for "another device" on a machine without a GPU
    with pytest.raises(ValueError, match="boxes are on meta but the images are on cpu"):
        call(boxes=torch.zeros(2, 4, device="meta"))
    with pytest.raises(ValueError, match="flips are on meta but the images are on cpu"):
        call(flips=torch.zeros(2, dtype=torch.bool, device="meta"))


@pytest.mark.cuda
def test_parameters_on_cpu_with_cuda_images():
    images = [i.cuda() for i in images_of([(20, 30)] * 2)]
    with pytest.raises(ValueError, match="boxes are on cpu but the images are on cuda:0"):
        call(images=images, boxes=torch.tensor([[0, 0, 20, 30], [1, 1, 5, 5]]))


def test_raw_op_errors():
    images, grid, flips, _, _ = op_samples()
    out = torch.empty(6, 3, 9, 11)
    op = torch.ops.torchfeed.crop_flip_normalize_list_out
    with pytest.raises(ValueError, match=r"grid\[0\] describes taps outside image 0"):
        bad = grid.clone()
        bad[0, 4] = 1000
        op(images, bad, flips, 1, True, MEAN, STD, out)
    with pytest.raises(
        ValueError, match="interpolation must be 0 .nearest. or 1 .bilinear., got 7"
    ):
        op(images, grid, flips, 7, True, MEAN, STD, out)
    with pytest.raises(TypeError, match="grid must be float64"):
        op(images, grid.float(), flips, 1, True, MEAN, STD, out)
    with pytest.raises(ValueError, match=r"out must have shape \[6, 3, H_out, W_out\]"):
        op(images, grid, flips, 1, True, MEAN, STD, torch.empty(6, 2, 9, 11))
    with pytest.raises(ValueError, match="out must be a dense tensor"):
        op(images, grid, flips, 1, True, MEAN, STD, torch.empty(6, 3, 9, 22)[..., ::2])


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


def test_bad_targets():
    t = RandomResizedCropFlipNormalize(8, mean=MEAN, std=STD)
    with pytest.raises(ValueError, match=r"targets must be a list with one entry per image \(2\)"):
        t((images_of([(20, 20)] * 2), [{"a": 1}]))


# --- CUDA ----------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize(("interpolation", "antialias"), MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cuda_matches_cpu(interpolation, antialias, dtype, channels_last):
    sizes, boxes = boxes_cases()
    images = images_of(sizes)
    images[2] = images[2].permute(1, 2, 0).contiguous().permute(2, 0, 1)
    flips = [True, False, True, True, False, True]
    kw = dict(mean=MEAN, std=STD, interpolation=interpolation, antialias=antialias, dtype=dtype,
              channels_last=channels_last)  # fmt: skip
    cpu = torchfeed.crop_flip_normalize(images, boxes, flips, (29, 37), **kw)
    gpu_images = [i.cuda() for i in images]
    gpu = torchfeed.crop_flip_normalize(gpu_images, torch.tensor(boxes).cuda(),
                                        torch.tensor(flips).cuda(), (29, 37), **kw)  # fmt: skip
    tol = 1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps * 10
    assert gpu.is_cuda and (gpu.cpu().float() - cpu.float()).abs().max().item() <= tol
    dense = torchfeed.crop_flip_normalize(torch.stack([i.contiguous() for i in gpu_images[3:4]] * 2),
                                          torch.tensor([boxes[3]] * 2).cuda(),
                                          torch.tensor([True, False]).cuda(), (29, 37), **kw)  # fmt: skip
    assert dense.shape == (2, 3, 29, 37)


@pytest.mark.cuda
def test_cuda_transform_and_opcheck():
    images = [i.cuda() for i in images_of([(60, 80), (90, 70)])]
    t = RandomResizedCropFlipNormalize(32, mean=MEAN, std=STD, return_params=True)
    out, params = t(images)
    ref = tv_float([i.cpu() for i in images], params["boxes"].tolist(), params["flips"].tolist(),
                   (32, 32), "bilinear", True)  # fmt: skip
    assert (out.cpu() - ref).abs().max().item() <= 1e-4
    grid = grid_from_boxes(params["boxes"].double(), [(60, 80), (90, 70)], (32, 32)).cuda()
    torch.library.opcheck(torch.ops.torchfeed.crop_flip_normalize_list_out.default,
                          (images, grid, params["flips"].cuda(), 1, True, MEAN, STD,
                           torch.empty(2, 3, 32, 32, device="cuda")))  # fmt: skip
