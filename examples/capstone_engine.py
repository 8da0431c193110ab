"""Capstone, with torchfeed: the course's multimodal data engine (images, variable-length tokens,
labels; shuffled, several workers, pinned, persistent) against the same engine on torchfeed.

What changes, and why:

- ``WorkerSeeder`` seeds torch, numpy and ``random`` per worker AND per rank (the course's
  ``seed_worker`` gives worker k of every DDP rank the same numpy stream);
- ``PadCollate`` builds the attention mask from the lengths (the course's ``tokens != 0`` hides
  any real 0) and pads in one pass;
- ``torchfeed.loader(..., zero_copy=True)``: the workers collate straight into one shared,
  reused ring instead of a fresh shared-memory file per tensor per batch;
- ``DevicePrefetcher`` copies batch k+1 on its own stream while step k runs (a GPU machine),
  from the ring's page-locked memory with no staging;
- the loader checkpoints mid-epoch (``state_dict()``), and a restart reads the rest exactly once.

Both engines read the same samples; the printout is samples/s per epoch for each, and the
ratio. Run with ``--quick`` for a small run (as CI does).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from _common import parse
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

import torchfeed
from torchfeed.data import WorkerSeeder


class MultimodalDataset(Dataset):
    """The course's dataset: an image [3, 128, 128], 8 to 32 tokens drawn with numpy (so worker
    seeding matters), a label."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, idx: int):
        image = torch.randn(3, 128, 128)
        length = int(np.random.randint(8, 33))
        tokens = torch.randint(100, 10000, (length,), dtype=torch.long)
        return {"image": image, "tokens": tokens, "label": idx % 5}


def seed_worker(worker_id: int) -> None:  # the course's worker_init_fn
    np.random.seed(torch.initial_seed() % 2**32)


def course_collate(batch):
    images = torch.stack([s["image"] for s in batch])
    labels = torch.tensor([s["label"] for s in batch], dtype=torch.long)
    tokens = pad_sequence([s["tokens"] for s in batch], batch_first=True, padding_value=0)
    return {"image": images, "tokens": tokens, "mask": tokens != 0, "label": labels}


def course_engine(ds: Dataset, batch_size: int, workers: int, device: torch.device):
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        pin_memory=device.type == "cuda",
        persistent_workers=workers > 0,
        worker_init_fn=seed_worker,
        generator=torch.Generator().manual_seed(42),
        collate_fn=course_collate,
    )

    def epoch():
        for batch in loader:
            yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}

    return epoch


def torchfeed_engine(ds: Dataset, batch_size: int, workers: int, device: torch.device):
    collate = torchfeed.PadCollate({"tokens": 0}, masks={"tokens": "mask"})
    loader = torchfeed.loader(
        ds,
        zero_copy=workers > 0,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        persistent_workers=workers > 0,
        worker_init_fn=WorkerSeeder(),
        generator=torch.Generator().manual_seed(42),
        collate_fn=collate,
    )
    prefetcher = torchfeed.DevicePrefetcher(loader, device)  # made once, iterated per epoch

    def epoch():
        return iter(prefetcher)

    return epoch


def run(name: str, make, ds, args, device) -> list[float]:
    epoch = make(ds, args.batch_size, args.workers, device)
    rates = []
    for e in range(args.epochs):
        t0 = time.perf_counter()
        n = 0
        for batch in epoch():
            n += batch["image"].shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        rates.append(n / (time.perf_counter() - t0))
        print(f"capstone: {name:<9} epoch {e + 1}: {rates[-1]:8,.0f} samples/s")
    return rates


def resume_demo(ds: Dataset, args) -> None:
    """Stop after a few steps, save, restart elsewhere: the rest of the epoch, exactly once."""

    def make():
        return torchfeed.loader(
            ds,
            batch_size=args.batch_size,
            shuffle=True,
            num_workers=args.workers,
            worker_init_fn=WorkerSeeder(),
            generator=torch.Generator().manual_seed(7),
            collate_fn=torchfeed.PadCollate({"tokens": 0}),
        )

    first = make()
    seen = []
    for step, batch in enumerate(first):
        seen += batch["label"].tolist()
        if step == 2:
            state = first.state_dict()  # what a checkpoint stores next to the model
            break
    second = make()
    second.load_state_dict(state)
    rest = sum(len(b["label"]) for b in second)
    print(
        f"capstone: stopped after {len(seen)} samples, resumed and read the other {rest} "
        f"(total {len(seen) + rest} of {len(ds)})"
    )
    assert len(seen) + rest == len(ds)


def main() -> None:
    args = parse(__doc__.splitlines()[0])
    args.size = 256 if args.quick else 2000
    args.batch_size, args.workers, args.epochs = 64, 2, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ds = MultimodalDataset(args.size)
    print(
        f"capstone: {args.size} samples, batch {args.batch_size}, {args.workers} workers, "
        f"on {device}"
    )
    theirs = run("course", course_engine, ds, args, device)
    ours = run("torchfeed", torchfeed_engine, ds, args, device)
    print(f"capstone: torchfeed / course, best epoch: {max(ours) / max(theirs):.2f}x")
    resume_demo(ds, args)


if __name__ == "__main__":
    main()
