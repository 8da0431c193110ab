"""A bounded fuzz run of torchfeed's untrusted-input paths under AddressSanitizer and
UndefinedBehaviorSanitizer (``make fuzz``; CI runs it). Any sanitizer report aborts the process,
so the run fails; a Python exception is a refusal, which is what hostile input should get.

Inputs: JPEGs of every kind libjpeg writes (baseline, progressive, restart markers, 4:2:0,
4:2:2, 4:4:4, grayscale, odd sizes), mutated by random byte flips, deletions, insertions, chunk
duplication, truncation and edits of the frame header's size fields, decoded through the window
decoder with random boxes (including boxes near the int64 limits) at random scales (a progressive
file goes through the filter that cuts its rows below the box and, at 1/8, drops its unread
scans). A share of the time also goes
to the image op's raw entry points with random geometry rows and to the ring's requests.

    python scripts/fuzz.py [--seconds 60] [--seed 0]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import sys
import time

import numpy as np
import torch
from PIL import Image


def load_torchfeed(site: str | None):
    """torchfeed from `site` (the sanitized build), never from an editable install of the
    checkout, whose import hook would otherwise take precedence over sys.path."""
    if site is not None:
        sys.meta_path[:] = [f for f in sys.meta_path if "_editable" not in type(f).__module__]
        sys.path.insert(0, site)
    import torchfeed

    where = torchfeed._C.__file__
    if site is not None and not where.startswith(os.path.abspath(site)):
        raise SystemExit(f"fuzz: loaded torchfeed from {where}, not from {site}")
    print(f"fuzz: torchfeed from {where}", flush=True)
    return torchfeed


torchfeed = None  # loaded in main(), from --site when given

BIG = [2**63 - 1, 2**63 - 4, 2**62, 2**31 - 1, 2**31, -(2**63), -1, 0, 1]


def corpus(rng: random.Random) -> list[bytes]:
    out = []
    for i, (h, w, mode, options) in enumerate(
        [
            (64, 80, "RGB", {}),
            (37, 101, "RGB", {"progressive": True}),
            (50, 50, "RGB", {"restart_marker_rows": 1}),
            (33, 47, "RGB", {"subsampling": 0}),
            (40, 61, "RGB", {"subsampling": 1}),
            (29, 31, "L", {}),
            (1, 1, "RGB", {}),
            (1, 70, "RGB", {"progressive": True}),
            # progressive files whose 1/8-scale decode drops scans (4:4:4: all AC; 4:2:0: luma's)
            (45, 66, "RGB", {"progressive": True, "subsampling": 0}),
            (41, 52, "L", {"progressive": True, "restart_marker_rows": 1}),
            # tall enough that most boxes leave rows below them for the decoder to cut
            (150, 23, "RGB", {"progressive": True, "restart_marker_blocks": 5}),
        ]
    ):
        g = np.random.default_rng(i)
        pixels = g.integers(0, 256, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(
            buf, "JPEG", quality=rng.choice([50, 90]), **options
        )
        out.append(buf.getvalue())
    return out


def mutate(data: bytes, rng: random.Random) -> bytes:
    d = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        kind = rng.randrange(7)
        i = rng.randrange(max(1, len(d)))
        if kind == 0:
            d[i % len(d)] = rng.randrange(256)
        elif kind == 1:
            del d[i : i + rng.randint(1, 64)]
        elif kind == 2:
            d[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif kind == 3:
            j = rng.randrange(max(1, len(d)))
            d[i:i] = d[j : j + rng.randint(1, 256)]
        elif kind == 4:
            del d[rng.randrange(max(1, len(d))) :]
        elif kind == 5:
            d[i % len(d)] = 0xFF
        else:  # the frame header's height and width
            k = bytes(d).find(b"\xff\xc0")
            if k < 0:
                k = bytes(d).find(b"\xff\xc2")
            if k >= 0 and k + 9 <= len(d):
                d[k + 5 : k + 9] = rng.randrange(1 << 32).to_bytes(4, "big")
        if not d:
            d = bytearray(b"\xff\xd8\xff")
    return bytes(d)


def box(rng: random.Random) -> tuple[int, int, int, int]:
    pick = lambda: rng.choice(BIG) if rng.random() < 0.1 else rng.randint(-2, 120)  # noqa: E731
    return pick(), pick(), pick(), pick()


def fuzz_jpeg(data: bytes, rng: random.Random) -> None:
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    with contextlib.suppress(RuntimeError, ValueError):
        torchfeed._C.jpeg_info(t)
    # small pixel limits keep each run short (a mutated header may declare millions of pixels,
    # which a progressive decode would buffer); the limit's own check is among what is fuzzed
    limit = rng.choice([1 << 12, 1 << 16, 1 << 20])
    # at 1/8, progressive files lose their unread scans; at every scale, their rows below the box
    scale = rng.choice([1, 2, 4, 8])
    with contextlib.suppress(RuntimeError, ValueError):
        torch.ops.torchfeed.decode_jpeg_window(t, *box(rng), limit, scale)
    with contextlib.suppress(RuntimeError, ValueError):
        torchfeed._C._testing.jpeg_scans_filtered(t, scale, rng.choice([0, *box(rng)]))


def fuzz_crop(rng: random.Random) -> None:
    images = [
        torch.randint(0, 256, (3, rng.randint(1, 40), rng.randint(1, 40)), dtype=torch.uint8)
        for _ in range(rng.randint(1, 3))
    ]
    grid = torch.tensor(
        [
            [
                rng.choice([*map(float, BIG), float("nan"), float("inf"), rng.uniform(-5, 50)])
                for _ in range(10)
            ]
            for _ in images
        ],
        dtype=torch.float64,
    )
    out = torch.empty(len(images), 3, rng.randint(1, 16), rng.randint(1, 16))
    with contextlib.suppress(RuntimeError, ValueError):
        torch.ops.torchfeed.crop_flip_normalize_list_out(
            images,
            grid,
            torch.zeros(len(images), dtype=torch.bool),
            rng.randint(0, 1),
            rng.random() < 0.5,
            [0.5] * 3,
            [0.2] * 3,
            out,
        )


def fuzz_ring(rng: random.Random, ring) -> None:
    with contextlib.suppress(ValueError, TimeoutError):
        ring.allocate(rng.choice([*BIG, rng.randint(0, 5000)]), timeout=0.001)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--site", default=None, help="where the sanitized build is installed")
    args = parser.parse_args()
    global torchfeed
    torchfeed = load_torchfeed(args.site)
    rng = random.Random(args.seed)
    seeds = corpus(rng)
    ring = torchfeed.PinnedRing(4096, pinned=False)
    end = time.monotonic() + args.seconds
    runs = 0
    while time.monotonic() < end:
        r = rng.random()
        if r < 0.8:
            fuzz_jpeg(mutate(rng.choice(seeds), rng), rng)
        elif r < 0.95:
            fuzz_crop(rng)
        else:
            fuzz_ring(rng, ring)
        runs += 1
    print(f"fuzz: {runs} inputs in {args.seconds:.0f} s, no sanitizer report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
