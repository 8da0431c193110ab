"""One rank of a torchrun job for tests/test_loaders_torchrun.py: reads an epoch through
torchfeed.loader over a ShardedIterableDataset (or a map-style dataset with DistributedSampler),
2 workers, as a DDP training loop does (one all_reduce per batch: a rank with a batch more than
the others waits in it until the process group's timeout fails the job), and records what it
read; saves its loader's checkpoint every `every` steps; stops, crashes (SIGKILL) or resumes as
told.

    dist_resume.py OUT KIND ACTION [--every N] [--stop N] [--crash N] [--resume FILE] [--next]

With --next it then counts the next epoch's batches on every rank (a second loader, whose
spawned workers cost each rank a few CPU seconds more: only the runs whose test reads it ask).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

import torchfeed
from torchfeed.data import DistributedSampler, ShardedIterableDataset, seed_sample

ITEMS = 150
EPOCH = 4


def make_sample(k: int):
    return k, torch.rand(1).item()  # the augmentation: drawn after the sample's seeding


class MapStyle(Dataset):
    def __len__(self):
        return ITEMS

    def __getitem__(self, i):
        seed_sample(1, EPOCH, i, 0)
        return make_sample(i)


def collate(batch):
    return batch


# Workers are spawned, not forked from this rank: on CPython before 3.12, a worker forked right
# after a collective deadlocks now and then at its start (gh-112275: the hang CI saw twice, as
# gloo's timeout in the all_gather after the next epoch); torchfeed.loader warns about it. Not
# 'forkserver': workers forked by the server keep it alive, and it keeps them, so a rank killed
# with SIGKILL leaves both behind for good (seen here); a spawned worker sees its rank go.
CONTEXT = "spawn"


def build(kind: str, epoch: int):
    if kind == "iterable":
        ds = ShardedIterableDataset(
            list(range(ITEMS)), make_sample, mode="sample", seed=1, seed_samples=True
        )
        ds.set_epoch(epoch)
        return torchfeed.loader(
            ds, batch_size=4, num_workers=2, collate_fn=collate, multiprocessing_context=CONTEXT
        )
    sampler = DistributedSampler(ITEMS, seed=1)
    sampler.set_epoch(epoch)
    return torchfeed.loader(
        MapStyle(),
        batch_size=4,
        sampler=sampler,
        num_workers=2,
        collate_fn=collate,
        multiprocessing_context=CONTEXT,
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("kind", choices=["iterable", "map"])
    p.add_argument("tag")
    p.add_argument("--every", type=int, default=0)
    p.add_argument("--stop", type=int, default=-1)
    p.add_argument("--crash", type=int, default=-1)
    p.add_argument("--resume", default=None)
    p.add_argument("--next", action="store_true")
    args = p.parse_args()
    # A rank waits in a collective at most this long for the others. CI runs this on two busy
    # cores next to other tests (one run there timed out at 60 s); the test's own limit is 300 s.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=180))
    # a rank that is still running after that leaves its threads' stacks in the job's stderr
    faulthandler.dump_traceback_later(200, exit=True)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = Path(args.out)
    loader = build(args.kind, EPOCH)
    if args.resume:
        loader.load_state_dict(torch.load(args.resume, weights_only=False))
    log = (out / f"seen-{args.tag}-rank{rank}.jsonl").open("w", buffering=1)  # line by line:
    step = 0  # what a rank read survives its being killed
    for batch in loader:
        if step == args.stop:
            break
        dist.all_reduce(torch.ones(1))  # the step's gradient all-reduce: every rank must come
        step += 1
        for k, a in batch:
            log.write(json.dumps([step, k, a]) + "\n")
        if args.every and step % args.every == 0:
            torch.save(loader.state_dict(), out / f"ckpt-{args.tag}-rank{rank}.pt")
            (out / f"ckpt-{args.tag}-rank{rank}.step").write_text(str(step))
        if step == args.crash and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # preempted: no cleanup, no goodbye
    steps = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(steps, torch.tensor([step]))
    if rank == 0:
        (out / f"steps-{args.tag}.json").write_text(json.dumps([int(s) for s in steps]))
    log.close()
    if args.next:  # the next epoch on this world: its batches per rank (balanced again)
        nxt = build(args.kind, EPOCH + 1)
        counts = torch.tensor([sum(1 for _ in nxt)], dtype=torch.int64)
        everyone = [torch.zeros_like(counts) for _ in range(world)]
        dist.all_gather(everyone, counts)
        if rank == 0:
            (out / f"next-{args.tag}.json").write_text(json.dumps([int(c) for c in everyone]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
