"""Run by tests/test_data.py under torchrun --nproc_per_node=2 (gloo, CPU): each rank reads a
sharded iterable dataset with 2 workers; rank 0 checks coverage, batch counts and random
streams across all rank x worker pairs, and writes the verdict as JSON."""

import json
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from torchfeed.data import ShardedIterableDataset, WorkerSeeder
from torchfeed.data._distributed import worker_and_count


def sample(i):
    worker, _ = worker_and_count()
    return {"i": i, "worker": worker, "draw": torch.rand(()).item()}


def main(out_path: str, uneven: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # the same on every rank, as DDP scripts do
    ds = ShardedIterableDataset(range(103), sample, mode="sample", uneven=uneven, seed=7)
    loader = DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        worker_init_fn=WorkerSeeder(),
        persistent_workers=True,
        # spawned, not forked from this rank: CPython < 3.12 can deadlock a worker forked from
        # a process with other threads (gh-112275; see tests/scripts/dist_resume.py)
        multiprocessing_context="spawn",
    )
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        batches = [
            {"i": b["i"].tolist(), "worker": b["worker"].tolist(), "draw": b["draw"].tolist()}
            for b in loader
        ]
        epochs.append(batches)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"rank": rank, "epochs": epochs})
    if rank == 0:
        verdict = {"ok": True, "problems": []}
        for e in range(2):
            per_rank = [g["epochs"][e] for g in gathered]
            counts = [len(b) for b in per_rank]
            if len(set(counts)) != 1:
                verdict["problems"].append(f"epoch {e}: batch counts differ {counts}")
            seen = [i for b in per_rank for batch in b for i in batch["i"]]
            if uneven == "drop":
                if len(seen) != len(set(seen)) or len(seen) != 100:
                    verdict["problems"].append(
                        f"epoch {e}: drop saw {len(seen)} ({len(set(seen))} unique)"
                    )
            else:
                if set(seen) != set(range(103)) or len(seen) != 104:
                    verdict["problems"].append(
                        f"epoch {e}: pad saw {len(seen)} ({len(set(seen))} unique)"
                    )
            streams = {}
            for g in gathered:
                for batch in g["epochs"][e]:
                    for w, d in zip(batch["worker"], batch["draw"], strict=True):
                        streams.setdefault((g["rank"], w), []).append(d)
            firsts = [tuple(v[:3]) for v in streams.values()]
            if len(streams) != 4 or len(set(firsts)) != 4:
                verdict["problems"].append(f"epoch {e}: random streams repeat across rank x worker")
        orders = [[i for b in g["epochs"][e] for i in b["i"]] for g in gathered for e in range(2)]
        if orders[0] == orders[1]:
            verdict["problems"].append("set_epoch did not change the order")
        verdict["ok"] = not verdict["problems"]
        with open(out_path, "w") as f:
            json.dump(verdict, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
