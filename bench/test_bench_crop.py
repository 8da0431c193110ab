"""Fused crop/flip/resize/normalize against torchvision v2 (per image, and on a dense batch with
one parameter set), DALI's CPU pipeline and kornia, on the same 64 uint8 images -> float32
[64, 3, 224, 224]. Goal: 4x torchvision per image and 2x DALI, with the output reused.

DALI and kornia are optional (``pip install -r requirements-bench.txt``); their cases skip
without them.
"""

from __future__ import annotations

import pytest
import torch
from torchvision.transforms import v2

import torchfeed
from torchfeed.transforms import RandomResizedCropFlipNormalize

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
BATCH = 64


def make_images(seed: int = 0) -> list[torch.Tensor]:
    """64 RGB uint8 images, sizes in [300, 500] x [300, 600], smooth random content."""
    g = torch.Generator().manual_seed(seed)
    images = []
    for _ in range(BATCH):
        h = int(torch.randint(300, 501, (1,), generator=g))
        w = int(torch.randint(300, 601, (1,), generator=g))
        coarse = torch.rand(1, 3, h // 16 + 2, w // 16 + 2, generator=g)
        smooth = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear")[0]
        noise = torch.rand(3, h, w, generator=g) * 0.1
        images.append(((smooth * 0.9 + noise) * 255).to(torch.uint8))
    return images


@pytest.fixture(scope="module")
def images():
    return make_images()


@pytest.fixture(scope="module")
def dense():
    # one common size, for the baselines that need a dense batch
    return torch.stack([im[:, :300, :300] for im in make_images(1)])


def torchvision_pipeline():
    return v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def test_crop_torchfeed_reused_output(benchmark, role, images):
    benchmark.group = "crop 64 ragged -> 224 (CPU)"
    role("torchfeed")
    t = RandomResizedCropFlipNormalize(
        224, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(0)
    )
    out = benchmark(t, images)
    assert out.shape == (BATCH, 3, 224, 224)


def test_crop_torchfeed_fresh_output(benchmark, role, images):
    benchmark.group = "crop 64 ragged -> 224 (CPU)"
    role("torchfeed")
    g = torch.Generator().manual_seed(0)
    sizes = [tuple(im.shape[1:]) for im in images]

    def fresh():
        boxes = torchfeed.sampling.sample_resized_crop_params(sizes, generator=g)
        flips = torchfeed.sampling.sample_flips(BATCH, 0.5, g)
        return torchfeed.crop_flip_normalize(images, boxes, flips, 224, mean=MEAN, std=STD)

    benchmark(fresh)


def test_crop_torchvision_per_image(benchmark, role, images):
    benchmark.group = "crop 64 ragged -> 224 (CPU)"
    role("baseline")
    t = torchvision_pipeline()
    benchmark(lambda: torch.stack([t(im) for im in images]))


def test_crop_dali_cpu(benchmark, role, images):
    benchmark.group = "crop 64 ragged -> 224 (CPU)"
    role("baseline")
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import feed_ndarray

    hwc = [im.permute(1, 2, 0).contiguous().numpy() for im in images]

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None, seed=0, prefetch_queue_depth=1)
    def pipe():
        x = fn.external_source(source=lambda: hwc, batch=True, layout="HWC")
        x = fn.random_resized_crop(
            x,
            size=(224, 224),
            random_area=(0.08, 1.0),
            random_aspect_ratio=(3 / 4, 4 / 3),
            antialias=True,
        )
        return fn.crop_mirror_normalize(
            x,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[m * 255 for m in MEAN],
            std=[s * 255 for s in STD],
            mirror=fn.random.coin_flip(probability=0.5),
        )

    p = pipe()
    p.build()
    out = torch.empty(BATCH, 3, 224, 224)

    def run():
        (batch,) = p.run()
        feed_ndarray(batch.as_tensor(), out)  # into a torch tensor, as DALI's iterators do
        return out

    benchmark(run)


def test_crop_floor_write_output_once(benchmark, role):
    benchmark.group = "crop 64 ragged -> 224 (CPU)"
    role("floor")
    src = torch.rand(BATCH, 3, 224, 224)
    out = torch.empty_like(src)
    benchmark(out.copy_, src)


DECODED = "crop 64 decoded (HWC memory) -> 224 (CPU)"


@pytest.fixture(scope="module")
def decoded(images):
    return [im.permute(1, 2, 0).contiguous().permute(2, 0, 1) for im in images]


def test_decoded_torchfeed_reused_output(benchmark, role, decoded):
    benchmark.group = DECODED
    role("torchfeed")
    t = RandomResizedCropFlipNormalize(
        224, mean=MEAN, std=STD, generator=torch.Generator().manual_seed(0)
    )
    benchmark(t, decoded)


def test_decoded_torchvision_per_image(benchmark, role, decoded):
    benchmark.group = DECODED
    role("baseline")
    t = torchvision_pipeline()
    benchmark(lambda: torch.stack([t(im) for im in decoded]))


def test_dense_torchfeed(benchmark, role, dense):
    benchmark.group = "crop 64 dense 300x300 -> 224 (CPU)"
    role("torchfeed")
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD)
    benchmark(t, dense)


def test_dense_torchvision_one_param_set(benchmark, role, dense):
    # torchvision v2 draws ONE crop and ONE flip for the whole batch (its issue #8484): less
    # work than per-image parameters, and not the same augmentation.
    benchmark.group = "crop 64 dense 300x300 -> 224 (CPU)"
    role("baseline")
    benchmark(torchvision_pipeline(), dense)


def test_dense_kornia(benchmark, role, dense):
    benchmark.group = "crop 64 dense 300x300 -> 224 (CPU)"
    role("baseline")
    kornia = pytest.importorskip("kornia")
    aug = torch.nn.Sequential(
        kornia.augmentation.RandomResizedCrop((224, 224), scale=(0.08, 1.0)),
        kornia.augmentation.RandomHorizontalFlip(),
        kornia.augmentation.Normalize(torch.tensor(MEAN), torch.tensor(STD)),
    )
    benchmark(lambda: aug(dense.float() / 255))


def cuda_sync(fn):
    def run():
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


@pytest.mark.cuda
def test_crop_cuda_torchfeed(benchmark, role, images):
    benchmark.group = "crop 64 ragged -> 224 (CUDA)"
    role("torchfeed")
    gpu = [im.cuda() for im in images]
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD)
    benchmark(cuda_sync(lambda: t(gpu)))


@pytest.mark.cuda
def test_crop_cuda_torchvision_per_image(benchmark, role, images):
    benchmark.group = "crop 64 ragged -> 224 (CUDA)"
    role("baseline")
    gpu = [im.cuda() for im in images]
    t = torchvision_pipeline()
    benchmark(cuda_sync(lambda: torch.stack([t(im) for im in gpu])))


@pytest.mark.cuda
def test_crop_cuda_floor_write_output_once(benchmark, role):
    benchmark.group = "crop 64 ragged -> 224 (CUDA)"
    role("floor")
    src = torch.rand(BATCH, 3, 224, 224, device="cuda")
    out = torch.empty_like(src)
    benchmark(cuda_sync(lambda: out.copy_(src)))


# 64 tiny images through the whole transform (the kernel does almost nothing) against the CPU
# kernel on 64 real images to 224 in the same session. Goal: at most 1.5%.


def tiny_images(seed: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, 8, 9), dtype=torch.uint8, generator=g) for _ in range(BATCH)]


def test_host_overhead_list(benchmark, role):
    benchmark.group = "host overhead, 64 images (CPU)"
    role("overhead")
    t = RandomResizedCropFlipNormalize(4, mean=MEAN, std=STD)
    tiny = tiny_images()
    benchmark(t, tiny)


def test_host_overhead_dense(benchmark, role):
    benchmark.group = "host overhead, 64 images (CPU)"
    role("overhead")
    t = RandomResizedCropFlipNormalize(4, mean=MEAN, std=STD)
    tiny = torch.stack(tiny_images())
    benchmark(t, tiny)


def test_host_overhead_ragged(benchmark, role):
    benchmark.group = "host overhead, 64 images (CPU)"
    role("overhead")
    t = RandomResizedCropFlipNormalize(4, mean=MEAN, std=STD)
    tiny = torchfeed.RaggedImages.from_images(tiny_images())
    benchmark(t, tiny)


def test_host_overhead_work_64_real_images(benchmark, role, images):
    benchmark.group = "host overhead, 64 images (CPU)"
    role("work")
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD)
    benchmark(t, images)


@pytest.fixture(scope="module")
def images_256():
    return make_images(3) + make_images(4) + make_images(5) + make_images(6)


def hbm_bytes(boxes: torch.Tensor, out: torch.Tensor) -> int:
    """The floor's traffic: each crop window read once (uint8) and the output written once."""
    return int((boxes[:, 2] * boxes[:, 3]).sum()) * 3 + out.numel() * out.element_size()


@pytest.mark.cuda
def test_crop_cuda_256_torchfeed(benchmark, role, images_256):
    benchmark.group = "crop 256 ragged -> 224 (CUDA)"
    role("torchfeed")
    gpu = [im.cuda() for im in images_256]
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD, return_params=True)
    out, params = t(gpu)
    benchmark.extra_info["images"] = len(gpu)
    benchmark.extra_info["hbm_bytes"] = hbm_bytes(params["boxes"], out)
    benchmark(cuda_sync(lambda: t(gpu)))


@pytest.mark.cuda
def test_crop_cuda_256_torchvision_per_image(benchmark, role, images_256):
    benchmark.group = "crop 256 ragged -> 224 (CUDA)"
    role("baseline")
    gpu = [im.cuda() for im in images_256]
    t = torchvision_pipeline()
    benchmark.extra_info["images"] = len(gpu)
    benchmark(cuda_sync(lambda: torch.stack([t(im) for im in gpu])))


@pytest.fixture(scope="module")
def dense_512():
    g = torch.Generator().manual_seed(9)
    return torch.randint(0, 256, (256, 3, 512, 512), dtype=torch.uint8, generator=g)


@pytest.mark.cuda
def test_dense_cuda_per_image_crops_torchfeed(benchmark, role, dense_512):
    benchmark.group = "dense 256x3x512x512 -> 224 (CUDA)"
    role("torchfeed")
    gpu = dense_512.cuda()
    t = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD)
    benchmark.extra_info["images"] = gpu.shape[0]
    benchmark(cuda_sync(lambda: t(gpu)))


@pytest.mark.cuda
def test_dense_cuda_torchvision_one_crop_per_batch(benchmark, role, dense_512):
    benchmark.group = "dense 256x3x512x512 -> 224 (CUDA)"
    role("baseline")
    gpu = dense_512.cuda()
    t = torchvision_pipeline()  # v2 draws ONE crop for the whole batch tensor
    benchmark.extra_info["images"] = gpu.shape[0]
    benchmark(cuda_sync(lambda: t(gpu)))
