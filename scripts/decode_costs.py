"""What a random crop costs to decode, per kind of JPEG: sequential and progressive files apart.

For every JPEG of a folder (default: the bench's built-in large variant, made if missing), one
thread decodes the crop ``DecodeRandomCrop(size=224)`` draws, at reduced scale, and the same crop
at full scale; the report gives the mean per file of each kind. A progressive file's scans are
each decoded down to the crop's last row, a sequential file's single scan too, so the two
kinds differ by how many times the entropy-coded data is walked (README, "Decoding at reduced
scale").

    .venv/bin/python scripts/decode_costs.py [DIR] [--repeats 3]
"""

from __future__ import annotations

import time
from pathlib import Path

import _folder
import torch

from torchfeed._doctor import _header  # (height, width, format, progressive) from Pillow
from torchfeed._pil import read_bytes
from torchfeed.decode import DecodeRandomCrop


def main() -> None:
    parser, folder, repeats, found = _folder.parse(__doc__)
    # (height, width, format, progressive) of each file, read once; None for an unreadable one
    headers = {p: h for p in found if (h := _header(p)) and h[2] == "JPEG"}
    if not headers:
        parser.error(f"folder: no JPEG files under {folder}")
    paths = list(headers)
    kinds = {p: "progressive" if h[3] else "sequential" for p, h in headers.items()}
    files = {p: read_bytes(p) for p in paths}
    best: dict[tuple[Path, str], float] = {}
    for _ in range(repeats):
        decoders = {  # the same crops in every pass and at both scales
            "reduced": DecodeRandomCrop(size=224, generator=torch.Generator().manual_seed(0)),
            "full": DecodeRandomCrop(generator=torch.Generator().manual_seed(0)),
        }
        for scale, decode in decoders.items():
            for p in paths:
                start = time.perf_counter()
                decode(files[p])
                took = time.perf_counter() - start
                best[p, scale] = min(best.get((p, scale), took), took)
    print(f"{folder}: {len(paths)} JPEGs, one thread, best of {repeats} passes")
    for kind in ("sequential", "progressive"):
        mine = [p for p in paths if kinds[p] == kind]
        if mine:
            reduced = 1e3 * sum(best[p, "reduced"] for p in mine) / len(mine)
            full = 1e3 * sum(best[p, "full"] for p in mine) / len(mine)
            print(
                f"  {kind:<11} {len(mine):4d} files: random crop {reduced:6.1f} ms at reduced "
                f"scale, {full:6.1f} ms at full scale (mean per file)"
            )


if __name__ == "__main__":
    main()
