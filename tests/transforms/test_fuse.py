"""fuse(): an existing torchvision pipeline, every maximal run of steps the op does exactly fused,
everything else left as it was. What is fused and what is not (the README's semantics table), the
result against torchvision's functionals applied with the fused step's own parameters in the
pipeline's order (float path, 1e-4), the result against the original pipeline (within one
uint8 level where the original resizes uint8), the fallback to the original steps, v1
pipelines, distributions, pickling for spawned workers."""

from __future__ import annotations

import math
import pickle

import numpy as np
import PIL.Image
import pytest
import torch
import torchvision.transforms as v1
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

import torchfeed
from test_sampling import ks_statistic
from torchfeed.transforms import FusedSteps

from image_cases import MEAN, STD

TOL = 1e-4
LEVEL = 1 / 255 / min(STD)  # one uint8 level after normalization


def photo(h: int, w: int, seed: int = 0) -> PIL.Image.Image:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(3 * x + y) % 256, (5 * y) % 256, (x * y // 7) % 256], -1)
    return PIL.Image.fromarray((rgb + rng.integers(0, 40, rgb.shape)).clip(0, 255).astype(np.uint8))


def to_float():
    return v2.ToDtype(torch.float32, scale=True)


def steps_of(pipeline) -> list:
    """The steps of a fused pipeline, without the DecodeBytes fuse puts before a first step that
    stays torchvision's (tests/transforms/test_encoded_input.py)."""
    return [t for t in pipeline.transforms if repr(t) != "DecodeBytes()"]


def kinds(pipeline) -> list[str]:
    return ["fused" if isinstance(t, FusedSteps) else type(t).__name__ for t in steps_of(pipeline)]


@pytest.mark.parametrize(
    ("steps", "want"),
    [
        ([v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), to_float(), v2.Normalize(MEAN, STD)], ["fused"]),
        ([v2.ToImage(), v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), to_float(), v2.Normalize(MEAN, STD)], ["fused"]),
        ([v2.ToImage(), to_float(), v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), v2.Normalize(MEAN, STD)], ["fused"]),
        ([v2.Resize(256), v2.CenterCrop(224), v2.ToImage(), to_float(), v2.Normalize(MEAN, STD)], ["fused"]),
        ([v2.CenterCrop(178), v2.Resize(128), v2.ToImage(), to_float()], ["fused"]),
        ([v2.RandomHorizontalFlip(), v2.RandomResizedCrop(64), v2.ToImage(), to_float()], ["fused"]),
        ([v2.ToImage(), to_float(), v2.Normalize(MEAN, STD)], ["fused"]),
        # a step in the middle splits the runs; a run that ends on uint8 stays torchvision's
        ([v2.RandomResizedCrop(224), v2.ColorJitter(0.4), v2.RandomHorizontalFlip(), to_float(), v2.Normalize(MEAN, STD)],
         ["RandomResizedCrop", "ColorJitter", "fused"]),
        ([v2.ToImage(), v2.RandomResizedCrop(224), to_float(), v2.Normalize(MEAN, STD), v2.RandomErasing()], ["fused", "RandomErasing"]),
        ([v2.RandAugment(), v2.RandomResizedCrop(224), to_float()], ["RandAugment", "fused"]),
        # arguments the op cannot honour exactly: left as torchvision's
        ([v2.Resize(256, max_size=300), v2.CenterCrop(224), to_float()], ["Resize", "fused"]),
        ([v2.RandomResizedCrop(224, interpolation=v2.InterpolationMode.BICUBIC), to_float()], ["RandomResizedCrop", "fused"]),
        ([v2.RandomResizedCrop(224), v2.ToDtype(torch.float64, scale=True)], ["RandomResizedCrop", "ToDtype"]),
        ([v2.RandomResizedCrop(224), v2.ToDtype(torch.float32)], ["RandomResizedCrop", "ToDtype"]),
        ([v2.Resize(256), v2.RandomHorizontalFlip(), v2.CenterCrop(224), to_float()], ["Resize", "fused"]),
        ([v2.RandomResizedCrop(224), v2.RandomResizedCrop(112), to_float()], ["RandomResizedCrop", "fused"]),
        ([v2.Normalize(MEAN, STD)], ["Normalize"]),
        # the v1 classics
        ([v1.RandomResizedCrop(224), v1.RandomHorizontalFlip(), v1.ToTensor(), v1.Normalize(MEAN, STD)], ["fused"]),
        ([v1.Resize(256), v1.CenterCrop(224), v1.ToTensor(), v1.Normalize(MEAN, STD)], ["fused"]),
        ([v1.ToTensor(), v1.Normalize((0.5,), (0.5,))], ["fused"]),
    ],
)  # fmt: skip
def test_what_is_fused(steps, want):
    compose = (
        v1.Compose
        if isinstance(steps[0], v1.RandomResizedCrop | v1.Resize | v1.ToTensor)
        else v2.Compose
    )
    fused = torchfeed.fuse(compose(steps))
    assert type(fused) is compose and kinds(fused) == want
    left = [t for t in steps_of(fused) if not isinstance(t, FusedSteps)]
    assert all(any(t is s for s in steps) for t in left)  # the very same objects, in order
    assert sum(len(t.steps) for t in fused.transforms if isinstance(t, FusedSteps)) + len(
        left
    ) == len(steps)
    # a first step that stays torchvision's gets DecodeBytes before it, and only then
    assert (repr(fused.transforms[0]) == "DecodeBytes()") == (want[0] != "fused")


def test_nested_composes_and_lists():
    inner = v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip()])
    assert kinds(torchfeed.fuse(v2.Compose([v2.ToImage(), inner, to_float()]))) == ["fused"]
    assert kinds(torchfeed.fuse([v2.RandomResizedCrop(64), to_float()])) == ["fused"]
    with pytest.raises(TypeError, match="fuse takes a torchvision pipeline"):
        torchfeed.fuse(v2.RandomResizedCrop(64))


def test_repr_says_what_was_fused():
    fused = torchfeed.fuse(
        v2.Compose(
            [v2.RandomResizedCrop(224), v2.ColorJitter(0.4), to_float(), v2.Normalize(MEAN, STD)]
        )
    )
    text = repr(fused)
    assert "Fused(ToDtype(scale=True), Normalize(mean=[0.485" in text
    assert "ColorJitter" in text and text.index("RandomResizedCrop") < text.index("ColorJitter")


def reference(steps, image: torch.Tensor, params: dict) -> torch.Tensor:
    """The steps with torchvision's functionals and these parameters, in the pipeline's order,
    on the float path (the image converted to float first)."""
    x = TF.to_dtype(image, torch.float32, scale=True)
    for s in steps:
        if isinstance(s, v1.RandomResizedCrop | v2.RandomResizedCrop):
            x = TF.resized_crop(x, *params["boxes"][0].tolist(), list(s.size),
                                interpolation=s.interpolation, antialias=s.antialias)  # fmt: skip
        elif isinstance(s, v1.Resize | v2.Resize):
            x = TF.resize(x, s.size, interpolation=s.interpolation, antialias=s.antialias)
        elif isinstance(s, v1.CenterCrop | v2.CenterCrop):
            x = TF.center_crop(x, list(s.size))
        elif isinstance(s, v1.RandomHorizontalFlip | v2.RandomHorizontalFlip):
            x = TF.horizontal_flip(x) if bool(params["flips"][0]) else x
        elif isinstance(s, v1.Normalize | v2.Normalize):
            x = TF.normalize(x, s.mean, s.std)
    return x


PIPELINES = {
    "train": [v2.RandomResizedCrop(224), v2.RandomHorizontalFlip(), to_float(), v2.Normalize(MEAN, STD)],
    "train, float first": [v2.ToImage(), to_float(), v2.RandomResizedCrop((96, 128)), v2.RandomHorizontalFlip(p=0.7), v2.Normalize(MEAN, STD)],
    "train, nearest": [v2.RandomResizedCrop(64, scale=(0.2, 0.9), interpolation=v2.InterpolationMode.NEAREST), to_float()],
    "flip first": [v2.RandomHorizontalFlip(), v2.RandomResizedCrop(80, antialias=False), to_float(), v2.Normalize(MEAN, STD)],
    "eval": [v2.Resize(256), v2.CenterCrop(224), to_float(), v2.Normalize(MEAN, STD)],
    "eval, pair": [v2.Resize((200, 150)), v2.CenterCrop((120, 100)), to_float()],
    "eval, flip": [v2.Resize(100), v2.CenterCrop(90), v2.RandomHorizontalFlip(p=1.0), to_float()],
    "celeba": [v2.CenterCrop(140), v2.Resize(64), to_float(), v2.Normalize(MEAN, STD)],
    "celeba, flip first": [v2.RandomHorizontalFlip(p=1.0), v2.CenterCrop((141, 99)), v2.Resize(64), to_float()],
    "center crop": [v2.CenterCrop(77), to_float()],
    "resize": [v2.Resize((64, 90)), v2.RandomHorizontalFlip(), to_float()],
    "resize short side": [v2.Resize(70), to_float(), v2.Normalize(MEAN, STD)],
    "no geometry": [to_float(), v2.Normalize(MEAN, STD)],
    "v1 train": [v1.RandomResizedCrop(112), v1.RandomHorizontalFlip(), v1.ToTensor(), v1.Normalize(MEAN, STD)],
}  # fmt: skip


@pytest.mark.parametrize("name", list(PIPELINES))
def test_the_fused_step_is_torchvisions_steps_with_its_parameters(name):
    steps = PIPELINES[name]
    compose = v1.Compose if isinstance(steps[0], v1.RandomResizedCrop) else v2.Compose
    for seed, (h, w) in enumerate([(240, 320), (333, 201), (150, 150)]):
        g = torch.Generator().manual_seed(seed)
        fused = torchfeed.fuse(compose(steps), generator=g)
        (step,) = fused.transforms
        image = TF.pil_to_tensor(photo(h, w, seed))
        inputs = photo(h, w, seed) if compose is v1.Compose else image
        out = fused(inputs)
        params = step.plan.draw(
            torch.tensor([[h, w]]), torch.Generator().manual_seed(seed)
        )  # the same draws again
        want = reference(steps, image, params)
        assert out.shape == want.shape and out.dtype == torch.float32
        assert (out - want).abs().max() < TOL, (name, seed)


@pytest.mark.parametrize(
    "steps",
    [
        [v2.Resize(256), v2.CenterCrop(224), to_float(), v2.Normalize(MEAN, STD)],
        [v2.CenterCrop(150), v2.Resize(64), to_float(), v2.Normalize(MEAN, STD)],
        [v2.Resize((100, 80)), to_float()],
    ],
)
def test_against_the_original_pipeline_within_one_level(steps):
    """Deterministic pipelines: the original resizes the uint8 image (rounding after the resize),
    the fused step does not; they differ by less than one level."""
    original = v2.Compose(steps)
    fused = torchfeed.fuse(original)
    for seed, (h, w) in enumerate([(300, 451), (257, 256)]):
        image = TF.pil_to_tensor(photo(h, w, seed))
        assert (fused(image) - original(image)).abs().max() <= LEVEL * 1.01
    v1_eval = v1.Compose(
        [v1.Resize(256), v1.CenterCrop(224), v1.ToTensor(), v1.Normalize(MEAN, STD)]
    )
    pil = photo(300, 451)  # PIL's own resize (the v1 pipeline on a PIL image): within 1.5 levels
    assert (torchfeed.fuse(v1_eval)(pil) - v1_eval(pil)).abs().max() <= LEVEL * 1.5


def test_inputs_the_op_cannot_do_exactly_take_the_original_steps():
    original = v2.Compose([v2.ToImage(), v2.CenterCrop(300), to_float(), v2.Normalize(MEAN, STD)])
    fused = torchfeed.fuse(original)
    small = photo(100, 120)  # CenterCrop pads it: the original steps, bit for bit
    assert torch.equal(fused(small), original(small))
    floats = torch.rand(3, 400, 350)  # not 8-bit: the original steps too
    assert torch.equal(fused(floats), original(floats))
    big = photo(400, 350)
    assert (fused(big) - original(big)).abs().max() <= LEVEL  # the fused op (exact crop)


def test_the_fused_step_keeps_v2_types_and_targets():
    fused = torchfeed.fuse(
        v2.Compose([v2.ToImage(), v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), to_float()])
    )
    out = fused(photo(100, 120))
    assert isinstance(out, tv_tensors.Image)  # as v2's ToImage makes it
    boxes = tv_tensors.BoundingBoxes([[5, 5, 50, 60]], format="XYXY", canvas_size=(100, 120))
    image, target = fused((photo(100, 120), {"boxes": boxes, "label": 2}))
    assert image.shape == (3, 64, 64) and target["boxes"].canvas_size == (64, 64)
    assert target["label"] == 2


def test_random_parameters_follow_torchvisions_distributions():
    n = 3000
    fused = torchfeed.fuse(
        [
            v2.RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.5, 2.0)),
            v2.RandomHorizontalFlip(0.3),
            to_float(),
        ]
    )
    (step,) = fused.transforms
    sizes = torch.tensor([[300, 400]] * n)
    ours = step.plan.draw(sizes, torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    rrc = v2.RandomResizedCrop(32, scale=(0.2, 0.9), ratio=(0.5, 2.0))
    image = torch.empty(3, 300, 400, dtype=torch.uint8)
    theirs = torch.tensor([list(rrc.make_params([image]).values()) for _ in range(n)])
    critical = 1.95 * math.sqrt(2 / n)  # alpha = 0.001
    for fn in (
        lambda p: p[:, 2] * p[:, 3],
        lambda p: p[:, 3] / p[:, 2],
        lambda p: p[:, 0],
        lambda p: p[:, 1],
    ):
        assert ks_statistic(fn(ours["boxes"]).double(), fn(theirs).double()) < critical
    assert abs(ours["flips"].double().mean().item() - 0.3) < 4 * math.sqrt(0.3 * 0.7 / n)


class Photos(Dataset):
    def __init__(self, transform):
        self.transform = transform

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return self.transform(photo(90 + 7 * i, 120 - 5 * i, seed=i)), i


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_fused_pipeline_in_spawned_workers():
    fused = torchfeed.fuse(
        v2.Compose(
            [
                v2.ToImage(),
                v2.RandomResizedCrop(48),
                v2.RandomHorizontalFlip(),
                to_float(),
                v2.Normalize(MEAN, STD),
            ]
        )
    )
    assert kinds(pickle.loads(pickle.dumps(fused))) == ["fused"]
    loader = DataLoader(Photos(fused), batch_size=3, num_workers=2, multiprocessing_context="spawn")
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(3, 3, 48, 48)] * 2
    assert sorted(i for b in batches for i in b[1].tolist()) == list(range(6))
