"""The fused transforms on an encoded image (a loader that returns the file's bytes:
``ImageFolder(root, loader=torchfeed.decode.read_file, transform=...)``): the result is the one
of the decoded image, bit for bit, for every JPEG kind and other formats, the training and the
evaluation transform, both layouts and every form the bytes come in; inputs the op cannot do
exactly take the original steps on the decoded image; errors name what was wrong."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as TF

import torchfeed
import torchfeed.decode as tio
from torchfeed import RandomResizedCropFlipNormalize, ResizeCenterCropNormalize
from torchfeed.decode import read_file, read_image

from image_cases import MEAN, STD
from jpeg_cases import JPEGS, encode, full_decode, needs_window_decoder, picture

TOL = 1e-4  # float rounding, as the op's parity tests

KINDS = {**JPEGS, "png": lambda: encode(picture(90, 71, seed=8), "PNG")}


def train(seed: int, size=(40, 48), **kw) -> RandomResizedCropFlipNormalize:
    g = torch.Generator().manual_seed(seed)
    return RandomResizedCropFlipNormalize(
        size, mean=MEAN, std=STD, generator=g, return_params=True, **kw
    )


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_the_bytes_give_what_the_decoded_image_gives(kind, layout):
    data = KINDS[kind]()
    image = full_decode(data)  # Pillow's decode, [3, H, W]
    if layout == "HWC":
        image = image.permute(1, 2, 0).contiguous()
    for seed in range(12):  # crops anywhere, at the borders, flipped or not
        got, params = train(seed, image_layout=layout)(data)
        want, same = train(seed, image_layout=layout)(image)
        assert torch.equal(params["boxes"], same["boxes"])
        assert torch.equal(params["flips"], same["flips"])
        assert torch.allclose(got, want, rtol=0, atol=1e-5), (kind, seed)
    # and torchvision's steps with the drawn parameters (independent of the op)
    top, left, h, w = params["boxes"][0].tolist()
    ref = TF.resized_crop(TF.to_dtype(full_decode(data), torch.float32, scale=True),
                          top, left, h, w, [40, 48])  # fmt: skip
    ref = TF.horizontal_flip(ref) if bool(params["flips"][0]) else ref
    out = got.permute(2, 0, 1) if layout == "HWC" and got.shape[-1] == 3 else got
    assert (out - TF.normalize(ref, MEAN, STD)).abs().max() < TOL


@needs_window_decoder
def test_only_the_crops_window_is_decoded(monkeypatch):
    """Guards the test above: a JPEG goes through the window decoder with the taps' window, not
    through a whole decode."""
    boxes = []
    decode = tio.decode_jpeg_window
    monkeypatch.setattr(tio, "decode_whole", None)  # any use of the fallback would raise
    monkeypatch.setattr(
        tio, "decode_jpeg_window", lambda d, b, r=1: boxes.append(b) or decode(d, b, r)
    )
    data = JPEGS["progressive"]()  # 200 x 301
    t = RandomResizedCropFlipNormalize(
        32, scale=(0.05, 0.06), mean=MEAN, std=STD, generator=torch.Generator().manual_seed(3)
    )
    t(data)
    ((_, _, h, w),) = boxes
    assert h * w < 0.2 * 200 * 301  # a small crop: a small window (its taps, a pixel or two more)


def test_every_form_of_bytes_gives_the_same_result():
    data = JPEGS["4:2:2"]()
    want, _ = train(5)(data)
    array = np.zeros(2 * len(data), dtype=np.uint8)
    array[::2] = np.frombuffer(data, dtype=np.uint8)
    for form in [
        bytearray(data),
        memoryview(data),
        torch.frombuffer(bytearray(data), dtype=torch.uint8),
        np.frombuffer(data, dtype=np.uint8),
        array[::2],  # non-contiguous
    ]:
        assert torch.equal(train(5)(form)[0], want)


def test_the_evaluation_transform_and_a_fused_compose():
    data = KINDS["png"]()
    image = full_decode(data)
    evaluation = ResizeCenterCropNormalize(64, 56, mean=MEAN, std=STD)
    assert torch.equal(evaluation(data), evaluation(image))
    compose = v2.Compose([v2.RandomResizedCrop(32, antialias=True), v2.RandomHorizontalFlip(),
                          v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize(MEAN, STD)])  # fmt: skip
    fused = torchfeed.fuse(compose)
    for seed in range(6):
        torch.manual_seed(seed)
        got = fused(JPEGS["4:2:0"]())
        torch.manual_seed(seed)
        assert torch.allclose(got, fused(full_decode(JPEGS["4:2:0"]())), rtol=0, atol=1e-5)


def test_what_the_op_cannot_do_exactly_takes_the_original_steps_on_the_decoded_image():
    original = v2.Compose([v2.ToImage(), v2.CenterCrop(300), v2.ToDtype(torch.float32, scale=True),
                           v2.Normalize(MEAN, STD)])  # fmt: skip
    data = JPEGS["4:2:0"]()  # 123 x 157: CenterCrop(300) pads it
    assert torch.equal(torchfeed.fuse(original)(data), original(full_decode(data)))
    # with reduced_decode too: a center crop larger than the resized image, before or after it
    for steps in ([v2.Resize(40), v2.CenterCrop(60)], [v2.CenterCrop(300), v2.Resize(40)]):
        padded = v2.Compose([*steps, v2.ToDtype(torch.float32, scale=True)])
        fused = torchfeed.fuse(padded, reduced_decode=True)
        assert torch.equal(fused(data), padded(full_decode(data)))


@pytest.mark.parametrize(
    ("data", "error", "match"),
    [
        (b"", ValueError, r"the encoded image is empty \(0 bytes\)"),
        (torch.zeros(0, dtype=torch.uint8), ValueError, r"the encoded image is empty"),
        (
            b"not an image at all",
            RuntimeError,
            r"cannot decode the image: its first bytes b'not an i' match no image format Pillow "
            r"reads \(19 bytes in all\)",
        ),
        (JPEGS["4:2:0"]()[:1500], RuntimeError, "Premature end of JPEG file|truncated"),
    ],
)
def test_bad_bytes(data, error, match):
    with pytest.raises(error, match=match):
        train(0)(data)


def test_read_file(tmp_path):
    path = tmp_path / "a.jpg"
    path.write_bytes(JPEGS["4:4:4"]())
    data = read_file(path)
    assert data.dtype == torch.uint8 and data.dim() == 1
    assert bytes(data.numpy()) == JPEGS["4:4:4"]() and torch.equal(read_file(str(path)), data)
    with pytest.raises(TypeError, match="path must be a str or os.PathLike, got bytes"):
        read_file(b"a.jpg")  # type: ignore[arg-type]
    (tmp_path / "empty.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match=r"the file '.*empty\.jpg' is empty \(0 bytes\)"):
        read_file(tmp_path / "empty.jpg")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("loader", [read_file, read_image])
def test_image_folder_with_torchfeeds_loaders(tmp_path, loader):
    """The torchvision habit, an ImageFolder and a v2.Compose, with ``loader=read_file`` (the
    transform gets the bytes) or ``read_image`` (a uint8 tensor): with the same draws, the
    samples of the PIL loader; in workers too."""
    for i in range(6):
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 2}" / f"{i}.jpg").write_bytes(
            encode(picture(60 + 7 * i, 90 - 5 * i, seed=i), quality=88, progressive=i % 3 == 0)
        )
    compose = v2.Compose([v2.RandomResizedCrop(32, antialias=True), v2.RandomHorizontalFlip(),
                          v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize(MEAN, STD)])  # fmt: skip
    # torchvision resizes a PIL image and a tensor with different rounding (a uint8 level apart
    # at most, 1 / 255 / min(std) after Normalize); the fused transform reads both alike
    pairs = [(torchfeed.fuse(compose), 1e-5)]
    if loader is read_image:  # torchvision's own steps take tensors, not bytes
        pairs.append((compose, 1 / 255 / min(STD) + 1e-5))
    for transform, tolerance in pairs:
        with_pil = ImageFolder(str(tmp_path), transform=transform)
        with_ours = ImageFolder(str(tmp_path), loader=loader, transform=transform)
        for i in range(len(with_pil)):
            torch.manual_seed(i)
            want, label = with_pil[i]
            torch.manual_seed(i)
            got, same_label = with_ours[i]
            assert label == same_label and got.shape == (3, 32, 32)
            assert torch.allclose(got, want, rtol=0, atol=tolerance), (transform, i)
    fused = ImageFolder(str(tmp_path), loader=loader, transform=torchfeed.fuse(compose))
    images, labels = next(iter(DataLoader(fused, batch_size=6, num_workers=2)))
    assert images.shape == (6, 3, 32, 32) and labels.tolist() == [0, 0, 0, 1, 1, 1]


# reduced_decode: a random crop of an encoded JPEG decoded at reduced scale. The reference is
# torchfeed.decode's scaled window (tests/test_decode_scaled.py checks it against Pillow's draft
# decode) resized, flipped and normalized by torchvision's functionals.
def scaled_reference(data, box, flip: bool, size) -> torch.Tensor:
    window = tio.decode_window(data, box, size=size)
    out = TF.resize(TF.to_dtype(window, torch.float32, scale=True), list(size), antialias=True)
    return TF.normalize(TF.horizontal_flip(out) if flip else out, MEAN, STD)


SMALL = (20, 24)  # outputs small enough for the test images' crops to reduce, to 1/2 or 1/4


@pytest.mark.parametrize("kind", ["4:2:0", "4:4:4", "progressive", "grayscale", "png"])
def test_reduced_decode_is_the_scaled_window_resized(kind):
    data = KINDS[kind]()
    image = full_decode(data)
    reduced = 0
    for seed in range(16):
        got, params = train(seed, SMALL, reduced_decode=True)(data)
        box, flip = params["boxes"][0].tolist(), bool(params["flips"][0])
        exact, same = train(seed, SMALL)(data)
        assert torch.equal(params["boxes"], same["boxes"])  # the same draws
        window = tio.decode_window(data, box, size=SMALL)
        if window.shape[1:] == (box[2], box[3]):  # too small to reduce (or not a JPEG): exact
            assert torch.allclose(got, exact, rtol=0, atol=1e-5), seed
        else:
            reduced += 1
            assert (got - scaled_reference(data, box, flip, SMALL)).abs().max() < TOL, seed
        # a decoded image is never reduced
        assert torch.equal(
            train(seed, SMALL, reduced_decode=True)(image)[0], train(seed, SMALL)(image)[0]
        )
    assert (reduced > 0) == (kind != "png"), reduced


def test_reduced_decode_with_the_flip_before_the_crop():
    """A flip before the crop: the box was drawn on the mirrored image, so the window decoded
    is its mirror."""
    data = JPEGS["progressive"]()  # 200 x 301
    compose = v2.Compose([v2.RandomHorizontalFlip(), v2.RandomResizedCrop((40, 48)),
                          v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize(MEAN, STD)])  # fmt: skip
    fused = torchfeed.fuse(compose, reduced_decode=True)
    flipped = 0
    for seed in range(12):
        g = torch.Generator().manual_seed(seed)
        step = fused.transforms[0]
        step.generator, step.return_params = g, True
        got, params = step(data)
        (top, left, h, w), flip = params["boxes"][0].tolist(), bool(params["flips"][0])
        if tio.decode_window(data, (top, left, h, w), size=(40, 48)).shape[1:] == (h, w):
            continue  # not reduced: the exact path, tested above
        mirrored_left = 301 - left - w if flip else left
        want = scaled_reference(data, (top, mirrored_left, h, w), flip, (40, 48))
        assert (got - want).abs().max() < TOL, seed
        flipped += flip
    assert flipped > 0


# The evaluation transform (Resize -> CenterCrop) with reduced_decode: the crop's preimage
# (DecodeCenterCrop's window, tests/test_decode_scaled.py) at reduced scale, resized whole.
def evaluation_compose(resize, crop) -> v2.Compose:
    return v2.Compose([v2.Resize(resize), v2.CenterCrop(crop), v2.ToImage(),
                       v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])  # fmt: skip


def resized_reference(window: torch.Tensor, size) -> torch.Tensor:
    out = TF.resize(TF.to_dtype(window, torch.float32, scale=True), list(size), antialias=True)
    return TF.normalize(out, MEAN, STD)


@pytest.mark.parametrize("kind", ["4:2:0", "4:4:4", "progressive", "grayscale", "png"])
def test_reduced_decode_of_the_evaluation_transform(kind):
    data = KINDS[kind]()
    image = full_decode(data)
    reduced = ResizeCenterCropNormalize(20, 16, mean=MEAN, std=STD, reduced_decode=True)
    exact = ResizeCenterCropNormalize(20, 16, mean=MEAN, std=STD)
    got = reduced(data)
    window = tio.DecodeCenterCrop(20, 16)(data)  # the preimage, at the scale 16 px allow
    if kind == "png":  # never scaled: the exact path, bit for bit
        assert torch.equal(got, exact(data))
    else:
        _, _, h, w = tio.DecodeCenterCrop(20, 16).box(*image.shape[1:])
        assert window.shape[1] <= h // 2 and window.shape[2] <= w // 2  # it was reduced
        assert (got - resized_reference(window, (16, 16))).abs().max() < TOL
    # how close that is to full scale on photos: tests/test_decode_scaled.py, README
    assert got.shape == evaluation_compose(20, 16)(image).shape == (3, 16, 16)
    # the fused Compose does the same, and a decoded image is never reduced
    fused = torchfeed.fuse(evaluation_compose(20, 16), reduced_decode=True)
    assert torch.allclose(fused(data), got, rtol=0, atol=1e-5)
    assert torch.equal(reduced(image), exact(image))


def test_reduced_decode_of_a_plain_resize_and_a_crop_then_resize():
    """Resize alone (the whole image is the window) and CenterCrop -> Resize (the crop is)."""
    data = JPEGS["progressive"]()  # 200 x 301
    resize_only = torchfeed.fuse(
        [v2.Resize((30, 40)), v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)],
        reduced_decode=True,
    )
    window = tio.decode_window(data, (0, 0, 200, 301), size=(30, 40))
    assert window.shape[1:] == (50, 75)  # 1/4: the largest scale keeping 30 x 40
    assert (resize_only(data) - resized_reference(window, (30, 40))).abs().max() < TOL
    crop_first = torchfeed.fuse(
        [
            v2.CenterCrop(120),
            v2.Resize(28),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ],
        reduced_decode=True,
    )
    window = tio.decode_window(data, (40, 90, 120, 120), size=(28, 28))  # the center crop
    assert window.shape[1:] == (30, 30)
    assert (crop_first(data) - resized_reference(window, (28, 28))).abs().max() < TOL
    # a flip first mirrors the window; this crop is symmetric (30 resized columns, 16 kept, 7
    # each side), so the result is the unflipped one flipped
    flip_first = torchfeed.fuse(
        [
            v2.RandomHorizontalFlip(1.0),
            v2.Resize(20),
            v2.CenterCrop(16),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ],
        reduced_decode=True,
    )
    unflipped = ResizeCenterCropNormalize(20, 16, mean=MEAN, std=STD, reduced_decode=True)(data)
    assert torch.allclose(flip_first(data), TF.horizontal_flip(unflipped), rtol=0, atol=1e-5)
    assert not torch.allclose(unflipped, TF.horizontal_flip(unflipped), atol=0.1)


def test_reduced_decode_errors():
    with pytest.raises(TypeError, match="reduced_decode must be a bool, got str"):
        train(0, reduced_decode="yes")
    crop_only = v2.Compose([v2.CenterCrop(56), v2.ToDtype(torch.float32, scale=True),
                            v2.Normalize(MEAN, STD)])  # fmt: skip
    with pytest.raises(ValueError, match="fuse: reduced_decode .* first step is Fused\\(Center"):
        torchfeed.fuse(crop_only, reduced_decode=True)  # nothing resized: no scale to reduce
    step = torchfeed.fuse(crop_only).transforms[0]  # the exported FusedSteps, built by hand
    with pytest.raises(ValueError, match=r"FusedSteps: reduced_decode decodes at reduced scale "
                       r"what the steps then resize, and these steps resize nothing "
                       r"\(CenterCrop\(\(56, 56\)\)\): there is no scale to reduce"):  # fmt: skip
        torchfeed.transforms.FusedSteps(
            step.steps, step.plan, step.options, None, crop_only, False, reduced_decode=True
        )
    jitter_first = v2.Compose([v2.ColorJitter(0.4), v2.RandomResizedCrop(32),
                               v2.ToDtype(torch.float32, scale=True)])  # fmt: skip
    with pytest.raises(ValueError, match="first step is ColorJitter"):
        torchfeed.fuse(jitter_first, reduced_decode=True)  # the crop fuses, but sees no bytes
    with pytest.raises(TypeError, match="reduced_decode must be a bool, got int"):
        torchfeed.fuse(evaluation_compose(64, 56), reduced_decode=1)


def test_a_pipeline_whose_first_step_stays_torchvisions_decodes_the_bytes_whole():
    """README's drop-in pipeline: ColorJitter between the crop and ToDtype keeps the crop
    torchvision's, so fuse puts DecodeBytes first; the bytes give what read_image's tensor
    gives, and every other input passes through it."""
    compose = v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip(),
                          v2.ColorJitter(0.4), v2.ToDtype(torch.float32, scale=True),
                          v2.Normalize(MEAN, STD)])  # fmt: skip
    fused = torchfeed.fuse(compose)
    assert repr(fused.transforms[0]) == "DecodeBytes()"
    data = JPEGS["4:2:0"]()
    for seed in range(4):
        torch.manual_seed(seed)
        got = fused(data)
        torch.manual_seed(seed)
        assert torch.equal(got, fused(full_decode(data))), seed
    image = full_decode(data)
    assert fused.transforms[0](image) is image
    assert fused.transforms[0](image, 3) == (image, 3)
    # a pipeline whose first step fuses takes the bytes itself: no DecodeBytes
    crop_first = torchfeed.fuse([*compose.transforms[:2], v2.ToDtype(torch.float32, scale=True)])
    assert [repr(t) for t in crop_first.transforms] == [repr(crop_first.transforms[0])]
    assert type(crop_first.transforms[0]).__name__ == "FusedSteps"
