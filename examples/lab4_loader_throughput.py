"""Lab 4, with torchfeed: DataLoader throughput over workers and memory, as a table.

The course measured workers and ``pin_memory`` on a TensorDataset. The cost it did not show is
moving each batch from a worker to the main process: a fresh shared-memory file per tensor,
page faults, and (with pin_memory) one more copy into pinned memory. ``torchfeed.loader(...,
zero_copy=True)`` has the workers collate straight into one shared (on a GPU machine,
page-locked) ring.
"""

from __future__ import annotations

import torch
from _common import parse, rate
from torch.utils.data import DataLoader, Dataset

import torchfeed


class Images(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.base = torch.randint(0, 256, (3, 96, 96), dtype=torch.uint8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return self.base, i  # decoding is not what this lab measures


def ordinary(ds: Dataset, workers: int, gpu: bool) -> DataLoader:
    return DataLoader(ds, batch_size=128, num_workers=workers, pin_memory=gpu)


def zero_copy(ds: Dataset, workers: int, gpu: bool) -> DataLoader:
    return torchfeed.loader(
        ds,
        zero_copy=True,
        batch_size=128,
        num_workers=workers,
        collate_fn=torchfeed.ImageCollate(0),
    )


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    n = 2048 if args.quick else 20000
    ds = Images(n)
    gpu = torch.cuda.is_available()
    rows = []
    for workers in (0, 2):
        for name, make in (("DataLoader", ordinary), ("torchfeed zero-copy", zero_copy)):
            dl = make(ds, workers, gpu)
            rows.append((name, workers, rate(lambda dl=dl: sum(len(b[1]) for b in dl))))
    print(f"lab 4: {'loader':<22} {'workers':>7} {'samples/s':>11}")
    for name, workers, r in rows:
        print(f"lab 4: {name:<22} {workers:>7} {r:>11,.0f}")
    base = {w: r for name, w, r in rows if name == "DataLoader"}
    ours = {w: r for name, w, r in rows if name != "DataLoader"}
    print(f"lab 4: zero copy with 2 workers: {ours[2] / base[2]:.2f}x the DataLoader")


if __name__ == "__main__":
    main()
