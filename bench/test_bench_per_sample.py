"""Per sample, one thread, as ``ImageFolder(transform=...)`` runs in a worker: torchvision v2's
``RandomResizedCrop(224) -> RandomHorizontalFlip -> ToDtype(scale=True) -> Normalize``
(baseline) against RandomResizedCropFlipNormalize and the same torchvision pipeline fused
(``torchfeed.fuse``), one image at a time, on the same images: decoded JPEGs of 300-600 px
(the built-in dataset's) and 4-megapixel ones, as PIL images and as decoded tensors (each
against torchvision on the same input type; for PIL, torchvision's faster order, ToImage
first, is the baseline, and PIL's own resize is shown too). Goal: 2x torchvision on 300-600 px,
never slower on large photos; the fused pipeline as fast as the hand-written transform. Last,
the host side of a one-image call (16 px images, where the kernel does almost nothing) against
the op calls alone.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import PIL.Image
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

import torchfeed
from torchfeed._pipeline_bench.dataset import synthetic_image
from torchfeed.ops._image_op import ImageOptions

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
COUNT = 16


def jpeg_roundtrip(image: torch.Tensor) -> PIL.Image.Image:
    buf = io.BytesIO()
    PIL.Image.fromarray(image.permute(1, 2, 0).numpy()).save(buf, "JPEG", quality=90)
    buf.seek(0)
    return PIL.Image.open(buf).convert("RGB")


def photos(large: bool) -> list[PIL.Image.Image]:
    out = []
    for i in range(COUNT if not large else 4):
        image = synthetic_image(i, seed=3)
        if large:  # about 4 megapixels: the synthetic content upsampled, with fresh texture
            image = TF.resize(image, [1700 + 37 * i, 2300 - 29 * i], antialias=False)
            image = (image.int() + torch.randint(-6, 7, image.shape)).clamp(0, 255).to(torch.uint8)
        out.append(jpeg_roundtrip(image))
    return out


@pytest.fixture(scope="module", params=["300-600 px", "4 MP"])
def images(request):
    pils = photos(request.param == "4 MP")
    return request.param, pils, [TF.pil_to_tensor(p) for p in pils]  # decoders' HWC memory


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tail() -> list:
    return [
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(MEAN, STD),
    ]


def rrc():
    return v2.RandomResizedCrop(224)


PIPELINES = {
    "torchvision, ToImage first": lambda: v2.Compose([v2.ToImage(), rrc(), *tail()]),
    "torchvision, PIL resize": lambda: v2.Compose(
        [rrc(), v2.RandomHorizontalFlip(), v2.ToImage(), *tail()[1:]]
    ),
    "torchvision": lambda: v2.Compose([rrc(), *tail()]),
    "torchfeed": lambda: torchfeed.RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD),
    "torchfeed fused Compose": lambda: torchfeed.fuse(v2.Compose([rrc(), *tail()])),
    "torchfeed fused Compose, reduced_decode": lambda: torchfeed.fuse(
        v2.Compose([rrc(), *tail()]), reduced_decode=True
    ),
}
ROLES = {"torchvision, ToImage first": "baseline", "torchvision": "baseline"}


def run(benchmark, role, inputs, name: str, group: str) -> None:
    benchmark.group = group
    role(ROLES.get(name, "torchfeed" if name.startswith("torchfeed") else "other"))
    transform = PIPELINES[name]()
    torch.manual_seed(0)

    def each():
        for x in inputs:
            transform(x)

    benchmark.pedantic(each, rounds=5 if len(inputs) < COUNT else 10, warmup_rounds=1)
    benchmark.extra_info["images"] = len(inputs)


@pytest.mark.parametrize(
    "name",
    [
        "torchvision, ToImage first",
        "torchvision, PIL resize",
        "torchfeed",
        "torchfeed fused Compose",
    ],
)
def test_per_sample_pil(benchmark, role, images, name):
    kind, pils, _ = images
    run(benchmark, role, pils, name, f"per sample, PIL {kind}")


@pytest.mark.parametrize("name", ["torchvision", "torchfeed", "torchfeed fused Compose"])
def test_per_sample_tensor(benchmark, role, images, name):
    kind, _, tensors = images
    run(benchmark, role, tensors, name, f"per sample, tensor {kind}")


# From the file, as ImageFolder's worker runs it: the loader, then the transform, per sample.
# Baseline: Pillow's loader (open, convert to RGB, as torchvision's default_loader) and
# torchvision (ToImage first); torchfeed: the same Compose fused, after Pillow's loader, and on
# the file's bytes (``loader=torchfeed.decode.read_file``: only the crop's pixels are decoded;
# the same output as on the PIL image, tests/transforms/test_encoded_input.py), and with
# ``reduced_decode=True`` (the crop decoded at reduced scale: not bit-identical, see README).
def encoded(image: PIL.Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def pil_loader(data: bytes) -> PIL.Image.Image:
    with PIL.Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


FROM_FILE = {
    "torchvision, PIL loader": (pil_loader, "torchvision, ToImage first"),
    "torchfeed fused Compose, PIL loader": (pil_loader, "torchfeed fused Compose"),
    "torchfeed fused Compose, read_file": (lambda data: data, "torchfeed fused Compose"),
    "torchfeed fused Compose, read_file, reduced_decode": (
        lambda data: data,
        "torchfeed fused Compose, reduced_decode",
    ),
}


def from_the_file(benchmark, role, images, name: str, load, transform, group: str) -> None:
    """Times ``transform(load(data))`` over the images as JPEG files' bytes."""
    kind, pils, _ = images
    files = [encoded(p) for p in pils]
    benchmark.group = f"{group} (loader + transform), JPEG {kind}"
    role("baseline" if name.startswith("torchvision") else "torchfeed")
    torch.manual_seed(0)

    def each():
        for data in files:
            transform(load(data))

    benchmark.pedantic(each, rounds=5 if len(files) < COUNT else 10, warmup_rounds=1)
    benchmark.extra_info["images"] = len(files)


@pytest.mark.parametrize("name", list(FROM_FILE))
def test_per_sample_from_the_file(benchmark, role, images, name):
    load, pipeline = FROM_FILE[name]
    transform = PIPELINES[pipeline]()
    from_the_file(benchmark, role, images, name, load, transform, "per sample from the file")


# The evaluation transform from the file: Pillow's loader + torchvision's Resize(256) ->
# CenterCrop(224) -> ToDtype -> Normalize (baseline) against the same Compose fused on the file's
# bytes (only the crop's preimage decoded; the same output as on the decoded image) and with
# ``reduced_decode=True`` (that preimage at the largest scale keeping 224 px: not bit-identical,
# the bench's agreement check measures by how much).
def evaluation() -> v2.Compose:
    return v2.Compose([v2.ToImage(), v2.Resize(256), v2.CenterCrop(224), *tail()[1:]])


EVAL_FROM_FILE = {
    "torchvision, PIL loader": (pil_loader, evaluation),
    "torchfeed fused Compose, read_file": (lambda data: data, lambda: torchfeed.fuse(evaluation())),
    "torchfeed fused Compose, read_file, reduced_decode": (
        lambda data: data,
        lambda: torchfeed.fuse(evaluation(), reduced_decode=True),
    ),
}


@pytest.mark.parametrize("name", list(EVAL_FROM_FILE))
def test_evaluation_from_the_file(benchmark, role, images, name):
    load, make = EVAL_FROM_FILE[name]
    group = "evaluation transform from the file"
    from_the_file(benchmark, role, images, name, load, make(), group)


# The host side of a one-image call, where the kernel does almost nothing (16 x 16 images, 8 x 8
# crops): torchvision, the hand-written transform and the fused Compose against their op calls
# alone (draw, plan, kernel, with the size table made once: what a call from Python cannot beat).
def op_calls_alone() -> Callable[[torch.Tensor], torch.Tensor]:
    ops = torch.ops.torchfeed
    sizes = torch.tensor([[16, 16]])
    mode = ImageOptions(MEAN, STD).mode  # the op's code for bilinear
    generator = torch.Generator().manual_seed(0)

    def call(image: torch.Tensor) -> torch.Tensor:
        boxes, flips = ops.sample_crops_and_flips(sizes, 0.08, 1.0, 3 / 4, 4 / 3, 0.5, generator)
        grid = ops.resized_crop_grid(sizes, boxes, 8, 8)
        out = torch.empty(1, 3, 8, 8)
        ops.crop_flip_normalize_list_out([image], grid, flips, mode, True, MEAN, STD, out, False)
        return out[0]

    return call


HOST_SIDE = {
    "torchvision": lambda: v2.Compose([v2.RandomResizedCrop(8), *tail()]),
    "torchfeed": lambda: torchfeed.RandomResizedCropFlipNormalize(8, mean=MEAN, std=STD),
    "torchfeed fused Compose": lambda: torchfeed.fuse(
        v2.Compose([v2.RandomResizedCrop(8), *tail()])
    ),
    "op calls alone": op_calls_alone,
}
HOST_ROLES = {"torchvision": "baseline", "op calls alone": "floor"}


@pytest.mark.parametrize("name", list(HOST_SIDE))
def test_per_sample_host_side(benchmark, role, name):
    generator = torch.Generator().manual_seed(1)
    small = [torch.randint(0, 256, (3, 16, 16), dtype=torch.uint8, generator=generator)] * COUNT
    benchmark.group = "per sample, host side: 16 x 16 tensors -> 8 x 8"
    role(HOST_ROLES.get(name, "torchfeed"))
    transform = HOST_SIDE[name]()
    torch.manual_seed(0)
    assert transform(small[0]).shape == (3, 8, 8)

    def each():
        for x in small:
            transform(x)

    benchmark.pedantic(each, rounds=100, warmup_rounds=5)
    benchmark.extra_info["images"] = len(small)
