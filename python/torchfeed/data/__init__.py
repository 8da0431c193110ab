"""Production data practices: randomness that follows the sample (:class:`SeedPerSample`,
:func:`seed_sample`), rank- and worker-aware seeding, rank x worker sharding and a resumable
distributed sampler with equal batch counts per rank, skipping corrupt samples, and
copy-on-write-safe sample metadata."""

from torchfeed.data._corrupt import SkipCorrupt
from torchfeed.data._metadata import SerializedList
from torchfeed.data._sampler import DistributedSampler
from torchfeed.data._seeding import SeedPerSample, WorkerSeeder, seed_sample, seed_worker
from torchfeed.data._sharding import ShardedIterableDataset

__all__ = [
    "DistributedSampler",
    "SeedPerSample",
    "SerializedList",
    "ShardedIterableDataset",
    "SkipCorrupt",
    "WorkerSeeder",
    "seed_sample",
    "seed_worker",
]
