"""The fused transforms take what a torchvision v2 transform takes, as a user brings it: a PIL
image per sample in ImageFolder workers (fork and spawn), one image tensor, inside v2.Compose,
the evaluation transform on PIL images, dict and tuple samples with tv_tensors targets, v2's rule
for which leaf is the image, HWC tensors and numpy arrays, and torch.compile through a transform.
Every result is checked against torchvision's functionals with the parameters the transform
drew, on the float path (the op's semantics)."""

from __future__ import annotations

import pickle

import numpy as np
import PIL.Image
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision import tv_tensors
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

import torchfeed
from torchfeed import RandomResizedCropFlipNormalize, ResizeCenterCropNormalize

from image_cases import MEAN, STD

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
TOL = 1e-4  # float rounding, as the op's parity tests


def photo(h: int, w: int, seed: int = 0, mode: str = "RGB") -> PIL.Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(3 * x + y) % 256, (5 * y) % 256, (x * y // 7) % 256], -1)
    rgb = (rgb + rng.integers(0, 40, rgb.shape)).clip(0, 255).astype(np.uint8)
    return PIL.Image.fromarray(rgb).convert(mode)


def expected(image: torch.Tensor, box, flip: bool, size=(224, 224)) -> torch.Tensor:
    """torchvision's RandomResizedCrop -> RandomHorizontalFlip -> ToDtype -> Normalize with
    these parameters, on the float path."""
    out = TF.resized_crop(TF.to_dtype(image, torch.float32, scale=True), *box, list(size))
    out = TF.horizontal_flip(out) if flip else out
    return TF.normalize(out, MEAN, STD)


def train(**kw) -> RandomResizedCropFlipNormalize:
    kw = {"mean": MEAN, "std": STD, "return_params": True, **kw}
    return RandomResizedCropFlipNormalize(224, **kw)


def test_a_pil_image_gives_one_image():
    image = photo(300, 401)
    out, params = train()(image)
    assert out.shape == (3, 224, 224) and type(out) is torch.Tensor
    want = expected(TF.pil_to_tensor(image), params["boxes"][0].tolist(), bool(params["flips"][0]))
    assert (out - want).abs().max() < TOL


def test_one_image_tensor_gives_one_image():
    image = TF.pil_to_tensor(photo(257, 199, seed=1))
    out, params = train()(image)
    assert out.shape == (3, 224, 224)
    want = expected(image, params["boxes"][0].tolist(), bool(params["flips"][0]))
    assert (out - want).abs().max() < TOL
    hwc, params = train(image_layout="HWC")(image.permute(1, 2, 0).contiguous())
    want = expected(image, params["boxes"][0].tolist(), bool(params["flips"][0]))
    assert (hwc - want).abs().max() < TOL


def test_numpy_and_gray_and_rgba_pil_images():
    array = np.asarray(photo(100, 120, seed=2))
    out, params = train()(array)
    want = expected(torch.from_numpy(array.copy()).permute(2, 0, 1), params["boxes"][0].tolist(),
                    bool(params["flips"][0]))  # fmt: skip
    assert (out - want).abs().max() < TOL
    gray = train(mean=[0.5], std=[0.25])
    for mode, channels in [("L", 1), ("RGBA", 4), ("P", 1)]:
        t = (
            gray
            if channels == 1
            else train(mean=[0.5] * 4, std=[0.25] * 4)
            if channels == 4
            else gray
        )
        out, _ = t(photo(64, 80, mode=mode))
        assert out.shape == (channels, 224, 224)


def test_inside_v2_compose_before_and_after_torchvision_steps():
    image = photo(320, 240, seed=3)
    t = train()
    out, params = v2.Compose([v2.ToImage(), v2.RandomGrayscale(p=1.0), t])(image)
    assert isinstance(out, tv_tensors.Image) and out.shape == (3, 224, 224)
    gray = TF.rgb_to_grayscale(TF.to_image(image), num_output_channels=3)
    want = expected(gray, params["boxes"][0].tolist(), bool(params["flips"][0]))
    assert (out - want).abs().max() < TOL
    erased = v2.Compose(
        [RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD), v2.RandomErasing(p=1.0)]
    )
    assert erased(TF.pil_to_tensor(image)).shape == (3, 224, 224)


def test_the_evaluation_transform_on_a_pil_image():
    image = photo(300, 451, seed=4)
    out = ResizeCenterCropNormalize(256, 224, mean=MEAN, std=STD)(image)
    ref = TF.to_dtype(TF.pil_to_tensor(image), torch.float32, scale=True)
    want = TF.normalize(TF.center_crop(TF.resize(ref, [256]), [224]), MEAN, STD)
    assert out.shape == (3, 224, 224) and (out - want).abs().max() < TOL


def test_a_dict_sample_with_targets_follows_torchvisions_joint_transform():
    image = tv_tensors.Image(TF.pil_to_tensor(photo(240, 320, seed=5)))
    boxes = tv_tensors.BoundingBoxes([[10, 20, 200, 180], [0, 0, 320, 240]], format="XYXY",
                                     canvas_size=(240, 320))  # fmt: skip
    mask = tv_tensors.Mask(torch.arange(240 * 320, dtype=torch.int64).reshape(240, 320) % 7)
    sample = {"image": image, "boxes": boxes, "mask": mask, "label": 3, "path": "a/b.jpg",
              "extra": torch.tensor([1.5, 2.5])}  # fmt: skip
    out, params = train()(sample)
    box, flip = params["boxes"][0].tolist(), bool(params["flips"][0])
    assert isinstance(out["image"], tv_tensors.Image)
    assert (out["image"] - expected(image, box, flip)).abs().max() < TOL
    want_boxes = TF.resized_crop(boxes, *box, [224, 224])
    want_mask = TF.resized_crop(mask, *box, [224, 224], interpolation=v2.InterpolationMode.NEAREST)
    if flip:
        want_boxes, want_mask = TF.horizontal_flip(want_boxes), TF.horizontal_flip(want_mask)
    assert isinstance(out["boxes"], tv_tensors.BoundingBoxes) and torch.equal(
        out["boxes"], want_boxes
    )
    assert out["boxes"].canvas_size == (224, 224)
    assert isinstance(out["mask"], tv_tensors.Mask) and torch.equal(out["mask"], want_mask)
    assert out["label"] == 3 and out["path"] == "a/b.jpg"  # passed through untouched
    assert out["extra"] is sample["extra"]  # a pure tensor next to a tv_tensors.Image: kept


def test_a_tuple_sample_and_v2s_rule_for_the_image():
    image = TF.pil_to_tensor(photo(200, 300, seed=6))
    other = torch.randint(0, 256, (3, 50, 50), dtype=torch.uint8)
    # no explicit image: the first pure tensor is the image, the rest passes through (v2's rule)
    (out, label, second), params = train()((image, 7, other))
    assert out.shape == (3, 224, 224) and label == 7 and second is other
    assert (
        out - expected(image, params["boxes"][0].tolist(), bool(params["flips"][0]))
    ).abs().max() < TOL
    # a PIL image with a target dict, the torchvision detection habit
    pil = photo(200, 300, seed=6)
    boxes = tv_tensors.BoundingBoxes([[0, 0, 30, 40]], format="XYWH", canvas_size=(200, 300))
    (img, target), _ = train()((pil, {"boxes": boxes, "labels": torch.tensor([1])}))
    assert img.shape == (3, 224, 224) and target["boxes"].canvas_size == (224, 224)
    assert target["labels"].tolist() == [1]


def test_two_images_in_one_sample_get_one_crop():
    a = tv_tensors.Image(TF.pil_to_tensor(photo(150, 170, seed=7)))
    b = tv_tensors.Image(TF.pil_to_tensor(photo(150, 170, seed=8)))
    (oa, ob, name), params = train()([a, b, "name"])
    assert name == "name"
    box, flip = params["boxes"][0].tolist(), bool(params["flips"][0])
    assert (oa - expected(a, box, flip)).abs().max() < TOL
    assert (ob - expected(b, box, flip)).abs().max() < TOL
    with pytest.raises(ValueError, match=r"the images of one sample must have one size"):
        train()([a, tv_tensors.Image(torch.zeros(3, 10, 10, dtype=torch.uint8)), "name"])


def test_batches_still_draw_per_image():
    batch = torch.randint(0, 256, (6, 3, 90, 120), dtype=torch.uint8)
    out, params = train()(batch)
    assert out.shape == (6, 3, 224, 224) and len({tuple(b) for b in params["boxes"].tolist()}) > 1
    for i in range(6):
        want = expected(batch[i], params["boxes"][i].tolist(), bool(params["flips"][i]))
        assert (out[i] - want).abs().max() < TOL
    pils = [photo(90 + i, 120, seed=i) for i in range(3)]
    out, params = train()(pils)  # a list of PIL images is a batch too
    for i, p in enumerate(pils):
        want = expected(TF.pil_to_tensor(p), params["boxes"][i].tolist(), bool(params["flips"][i]))
        assert (out[i] - want).abs().max() < TOL


@pytest.fixture(scope="module")
def image_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    for c in ("cat", "dog"):
        (root / c).mkdir()
        for i in range(5):
            photo(180 + 17 * i, 240 - 11 * i, seed=i + (c == "dog") * 10).save(
                root / c / f"{i}.jpg", quality=92
            )
    return root


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_imagefolder_transform_in_dataloader_workers(image_folder, context):
    ds = ImageFolder(str(image_folder), transform=train())
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context=context)
    seen = 0
    for (images, params), labels in loader:
        assert images.shape[1:] == (3, 224, 224) and images.dtype == torch.float32
        for j in range(len(labels)):
            path, label = ds.samples[seen + j]
            assert label == labels[j]
            image = TF.pil_to_tensor(PIL.Image.open(path).convert("RGB"))
            want = expected(image, params["boxes"][j, 0].tolist(), bool(params["flips"][j, 0]))
            assert (images[j] - want).abs().max() < TOL
        seen += len(labels)
    assert seen == 10


def test_pickled_transform_draws_from_its_own_generator():
    t = RandomResizedCropFlipNormalize(
        224, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(3)
    )
    clone = pickle.loads(pickle.dumps(t))
    image = photo(120, 160)
    assert torch.equal(t(image), clone(image))


def test_torch_compile_through_the_transform():
    """A step that calls a transform compiles with fullgraph=True, for one image, a batch, and a
    batch whose size changes (a symbolic batch size)."""
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD)
    e = ResizeCenterCropNormalize(128, 112, mean=MEAN, std=STD)

    def step(images):
        return t(images).sum() + e(images).sum()

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for shape in [(3, 120, 160), (4, 3, 120, 160), (6, 3, 120, 160), (5, 3, 120, 160)]:
        x = torch.randint(0, 256, shape, dtype=torch.uint8)
        torch.manual_seed(0)
        got = compiled(x)
        torch.manual_seed(0)
        assert torch.allclose(got, step(x), rtol=1e-5), shape


def test_bad_inputs():
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD)
    with pytest.raises(TypeError, match=r"PIL image of mode 'I;16' has no 8-bit channels"):
        t(PIL.Image.new("I;16", (10, 10)))
    with pytest.raises(TypeError, match="the sample holds no image"):
        t({"label": 3, "name": "x"})
    with pytest.raises(TypeError, match=r"images\[0\] must be uint8, got torch.float32"):
        t(torch.rand(3, 10, 10))
    with pytest.raises(
        ValueError, match=r"mean must have 1 or 3 values \(one per channel\), got 2"
    ):
        RandomResizedCropFlipNormalize(224, mean=[0.5, 0.5], std=[0.5])(photo(10, 10))


@pytest.mark.parametrize("batched", [False, True])
def test_an_image_in_hwc_order_is_told_how_to_say_so(batched):
    # the numpy / PIL / Hugging Face datasets habit: a [H, W, 3] tensor, taken as [C, H, W]
    hwc = torch.randint(0, 256, (48, 64, 3), dtype=torch.uint8)
    t = RandomResizedCropFlipNormalize(16, mean=MEAN, std=STD)
    with pytest.raises(ValueError) as e:
        t([hwc, hwc] if batched else hwc)
    assert str(e.value) == (
        "mean must have 1 or 48 values (one per channel), got 3: the images were taken as "
        "[C, H, W] (image_layout='CHW'), so 48 channels. An image in [H, W, C] order (numpy, "
        "PIL, Hugging Face datasets) takes image_layout='HWC', or image.permute(2, 0, 1)"
    )
    # which is what it says: the same output as the [C, H, W] image
    hwc_t = RandomResizedCropFlipNormalize(
        16, mean=MEAN, std=STD, image_layout="HWC", generator=torch.Generator().manual_seed(0)
    )
    chw_t = RandomResizedCropFlipNormalize(
        16, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(0)
    )
    assert torch.equal(hwc_t(hwc), chw_t(hwc.permute(2, 0, 1)))
    # four channels or fewer, as [C, H, W], keep the plain message
    with pytest.raises(ValueError, match=r"got 3\Z"):
        t(torch.zeros(4, 8, 8, dtype=torch.uint8))


def test_the_top_level_names_the_transforms():
    assert torchfeed.RandomResizedCropFlipNormalize is RandomResizedCropFlipNormalize
    assert torchfeed.transforms.ResizeCenterCropNormalize is ResizeCenterCropNormalize
