"""Production data practices: rank- and worker-aware seeding, rank x worker sharding with equal
batch counts per rank, skipping corrupt samples, and copy-on-write-safe sample metadata."""

from torchfeed.data._distributed import rank_and_world_size, worker_and_count
from torchfeed.data.corrupt import SkipCorrupt
from torchfeed.data.metadata import SerializedList
from torchfeed.data.plan import EpochPlan
from torchfeed.data.sampler import DistributedSampler
from torchfeed.data.seeding import WorkerSeeder, derive_seed, seed_worker
from torchfeed.data.sharding import ShardedIterableDataset, seed_sample, split_for_consumer

__all__ = [
    "DistributedSampler",
    "EpochPlan",
    "SerializedList",
    "ShardedIterableDataset",
    "SkipCorrupt",
    "WorkerSeeder",
    "derive_seed",
    "rank_and_world_size",
    "seed_sample",
    "seed_worker",
    "split_for_consumer",
    "worker_and_count",
]
