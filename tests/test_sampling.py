"""The random parameters: torchvision's distribution, reproducibility, the scalar sampler."""

from __future__ import annotations

import math

import pytest
import torch
from torchvision.transforms import v2

from torchfeed import sampling
from torchfeed.sampling import resized_crop_box, sample_flips, sample_resized_crop_params
from torchfeed.transforms import RandomResizedCropFlipNormalize

from image_cases import MEAN, STD


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
    ours = sample_resized_crop_params(
        [size], scale=(0.99, 1.0), ratio=(1.0, 1.0), generator=torch.Generator().manual_seed(0)
    )
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


@pytest.mark.parametrize("scale", [(0.08, 1.0), (0.5, 0.5), (1.0, 2.0), (0.0, 0.01)])
@pytest.mark.parametrize("ratio", [(3 / 4, 4 / 3), (1.0, 1.0), (0.1, 10.0)])
def test_the_batch_op_draws_what_the_python_sampler_draws(scale, ratio):
    """The transforms draw with the C++ op (one call per batch); it must give exactly the
    boxes of sample_resized_crop_params (same generator state in, same numbers out), fallback
    included."""
    g = torch.Generator().manual_seed(7)
    sizes = [(int(h), int(w)) for h, w in torch.randint(1, 700, (300, 2), generator=g)]
    sizes += [(1, 1), (1, 500), (500, 1), (10, 1000)]
    sizes_t = torch.tensor(sizes, dtype=torch.int64)
    for seed in range(3):
        ours = torch.ops.torchfeed.sample_resized_crop(
            sizes_t, *scale, *ratio, torch.Generator().manual_seed(seed)
        )
        ref = sample_resized_crop_params(sizes, scale, ratio, torch.Generator().manual_seed(seed))
        assert torch.equal(ours, ref)
        # boxes and flips in one op and one draw: 22 uniforms per image for the box, then one
        # for the flip (u < p)
        for p in (0.0, 0.3, 1.0):
            boxes, flips = torch.ops.torchfeed.sample_crops_and_flips(
                sizes_t, *scale, *ratio, p, torch.Generator().manual_seed(seed)
            )
            u = torch.rand(
                len(sizes), 23, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)
            )
            hw = sizes_t.to(torch.float64)
            assert torch.equal(boxes, sampling._crops_from_uniforms(hw, u, scale, ratio))
            assert torch.equal(flips, u[:, 22] < p)


def test_the_combined_op_checks_p_flip():
    with pytest.raises(
        ValueError, match=r"sample_crops_and_flips: p_flip must be in \[0, 1\], got 1.5"
    ):
        torch.ops.torchfeed.sample_crops_and_flips(torch.tensor([[4, 4]]), 0.1, 1.0, 0.5, 2.0, 1.5)
    torch.library.opcheck(
        torch.ops.torchfeed.sample_crops_and_flips.default,
        (
            torch.tensor([[40, 50], [3, 7]]),
            0.08,
            1.0,
            0.75,
            4 / 3,
            0.5,
            torch.Generator().manual_seed(0),
        ),
        test_utils=("test_schema", "test_faketensor"),
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(scale=(float("nan"), float("nan"))), r"scale values must be >= 0"),
        (dict(scale=(-0.1, 1.0)), r"scale values must be >= 0"),
        (dict(ratio=(1.0, float("inf"))), r"ratio values must be > 0"),
        (dict(scale=(0.5, 0.1)), r"scale must be \(min, max\) with min <= max"),
    ],
)
def test_non_finite_or_negative_ranges_are_refused(kwargs, match):
    """torchvision raises for nan scales too (its int(round(nan)) fails); nothing here gives a
    silent full-image crop."""
    with pytest.raises(ValueError, match=match):
        sample_resized_crop_params([(10, 10)], **kwargs)
    with pytest.raises(ValueError, match=match):
        resized_crop_box(10, 10, **kwargs)
    with pytest.raises(ValueError, match=match):
        RandomResizedCropFlipNormalize(8, mean=MEAN, std=STD, **kwargs)


def test_the_ops_take_the_uniforms_they_are_given():
    """A DevicePrefetcher that knows a batch's samples gives the ops each image's uniforms,
    drawn for its sample (sample_uniforms), in place of one draw from a generator."""
    g = torch.Generator().manual_seed(5)
    sizes = torch.randint(1, 700, (64, 2), generator=g)
    hw = sizes.to(torch.float64)
    u = torch.rand(64, 23, dtype=torch.float64, generator=g)
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    boxes = torch.ops.torchfeed.sample_resized_crop(sizes, *scale, *ratio, None, u[:, :22])
    assert torch.equal(boxes, sampling._crops_from_uniforms(hw, u[:, :22], scale, ratio))
    boxes, flips = torch.ops.torchfeed.sample_crops_and_flips(sizes, *scale, *ratio, 0.3, None, u)
    assert torch.equal(boxes, sampling._crops_from_uniforms(hw, u, scale, ratio))
    assert torch.equal(flips, u[:, 22] < 0.3)
    for bad in (u[:, :22], u.float(), u[:10]):
        with pytest.raises(ValueError, match=r"sample_crops_and_flips: uniforms must be a float64"):
            torch.ops.torchfeed.sample_crops_and_flips(sizes, *scale, *ratio, 0.3, None, bad)
    for op, args in (
        (torch.ops.torchfeed.sample_resized_crop, (sizes, *scale, *ratio, None, u[:, :22])),
        (torch.ops.torchfeed.sample_crops_and_flips, (sizes, *scale, *ratio, 0.3, None, u)),
        (torch.ops.torchfeed.sample_uniforms, (torch.tensor([3, -1, 2**62]), -5, 1, 23)),
    ):
        torch.library.opcheck(op.default, args, test_utils=("test_schema", "test_faketensor"))


def test_sample_uniforms_follow_the_sample():
    """Row j depends on (base, keys[j], stream) only: the same sample gives the same row in any
    batch and position, another stream or base another; the rows are uniform on [0, 1)."""
    uniforms = torch.ops.torchfeed.sample_uniforms
    keys = torch.arange(4000)
    u = uniforms(keys, 7, 0, 23)
    assert u.shape == (4000, 23) and u.dtype == torch.float64
    part = torch.tensor([3999, 17, 17, 0])
    assert torch.equal(uniforms(part, 7, 0, 23), u[part])
    assert not torch.equal(uniforms(part, 7, 1, 23), u[part])
    assert not torch.equal(uniforms(part, 8, 0, 23), u[part])
    assert torch.equal(uniforms(part, 7, 0, 5), u[part, :5])  # (a narrower draw: its start)
    flat = u.reshape(-1)
    assert bool((flat >= 0).all() and (flat < 1).all())
    reference = torch.rand(flat.numel(), dtype=torch.float64, generator=torch.Generator())
    assert ks_statistic(flat, reference) < 0.01
    assert ks_statistic(u[:, 0], u[:, 1]) < 0.05  # (columns alike: no pattern across keys)
    assert uniforms(keys[:0], 7, 0, 23).shape == (0, 23)
    assert uniforms(keys[:3], 7, 0, 0).shape == (3, 0)
    with pytest.raises(ValueError, match="sample_uniforms: keys must be a 1-D int64 CPU tensor"):
        uniforms(keys.float(), 7, 0, 23)
    for count in (-1, 2**40):
        with pytest.raises(
            ValueError, match=rf"sample_uniforms: count must be in \[0, 65536\] .*, got {count}"
        ):
            uniforms(keys, 7, 0, count)
