"""Production data practices: rank- and worker-aware seeding, rank x worker sharding with equal
batch counts per rank, skipping corrupt samples, and copy-on-write-safe sample metadata."""

from torchfeed.data._corrupt import SkipCorrupt
from torchfeed.data._metadata import SerializedList
from torchfeed.data._sampler import DistributedSampler
from torchfeed.data._seeding import WorkerSeeder, seed_worker
from torchfeed.data._sharding import ShardedIterableDataset, seed_sample

__all__ = [
    "DistributedSampler",
    "SerializedList",
    "ShardedIterableDataset",
    "SkipCorrupt",
    "WorkerSeeder",
    "seed_sample",
    "seed_worker",
]
