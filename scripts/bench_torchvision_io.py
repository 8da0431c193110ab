"""``torchfeed bench`` with torchvision's own decoder where a whole file is decoded.

torchfeed decodes whole files through Pillow (torchvision 0.29 deprecates ``torchvision.io``'s
codec), so the bench's baseline is what an ``ImageFolder`` user runs today. Earlier measurements
(issue 21's 2.17x on the 300-600 px set) had the baseline decode with
``torchvision.io.decode_jpeg``, which is faster on small files. This script reruns the bench with
that decoder swapped back in for every whole-file decode (the baseline, the whole-image
torchfeed pipelines, the stage timings and the agreement checks), so both ratios can be read
from runs on the same machine. The 1/8-scale floor and the crop-window decoders are unchanged.

    .venv/bin/python scripts/bench_torchvision_io.py --workers 2 --suite images

Arguments are ``torchfeed bench``'s. The deprecation warning of the swapped decoder is silenced
here, in this script only: the package itself never calls it.
"""

from __future__ import annotations

import sys
import warnings

import torch
import torchvision.io

import torchfeed._pipeline_bench.agreement as agreement
import torchfeed._pipeline_bench.image_pipelines as image_pipelines
import torchfeed._pipeline_bench.stages as stages
from torchfeed import _pil, cli


def decode_rgb(data: torch.Tensor, reduce: int = 1) -> torch.Tensor:
    if reduce != 1:  # no scaled decode in torchvision.io: the floor stays libjpeg-turbo's draft
        return _pil.decode_rgb(data, reduce)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torchvision.io.decode_image(data, mode=torchvision.io.ImageReadMode.RGB)


def main() -> int:
    for module in (agreement, image_pipelines, stages):
        module.decode_rgb = decode_rgb  # type: ignore[attr-defined]
    return cli.main(["bench", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
