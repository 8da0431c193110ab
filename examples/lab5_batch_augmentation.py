"""Lab 5, with torchfeed: per-image random augmentation of a whole batch.

The course applied ``torchvision.transforms.v2`` to a batch tensor: v2 draws ONE set of random
parameters per call, so all 32 images got the same crop and the same flip (torchvision issue
#8484). ``RandomResizedCropFlipNormalize`` draws per image, as torchvision would draw for each
image alone, and crops, resizes, flips and normalizes the uint8 batch in one fused pass (the C++
CPU kernel here; the CUDA kernel on a GPU).
"""

from __future__ import annotations

import torch
from _common import parse, rate
from torchvision.transforms import v2

from torchfeed.transforms import RandomResizedCropFlipNormalize

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, 256, (32, 3, 256, 256), dtype=torch.uint8, generator=g).to(device)
    course = v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )
    ours = RandomResizedCropFlipNormalize(224, mean=MEAN, std=STD, return_params=True)
    _, params = ours(batch)
    distinct = len({tuple(b) for b in params["boxes"].tolist()})
    print(
        f"lab 5: v2 on the batch draws 1 crop for 32 images; torchfeed drew {distinct} "
        f"distinct crops and {int(params['flips'].sum())} flips"
    )
    ours.return_params = False
    repeat = 2 if args.quick else 10
    r_ours = rate(lambda: sum(len(ours(batch)) for _ in range(repeat)))
    r_course = rate(lambda: sum(len(course(batch)) for _ in range(repeat)))
    print(
        f"lab 5 ({device}): {r_ours:,.0f} images/s per-image crops with torchfeed, "
        f"{r_course:,.0f} with v2's one crop per batch ({r_ours / r_course:.2f}x)"
    )


if __name__ == "__main__":
    main()
