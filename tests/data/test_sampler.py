"""Mid-epoch checkpoints (issue 13): epoch plans, the distributed sampler, the sharded dataset,
torchfeed.loader (ordinary and zero-copy) and torchdata's StatefulDataLoader. Deterministic
resume reproduces the uninterrupted run bit for bit; elastic resume reads every sample not yet
consumed exactly once. (The torchrun runs over real ranks are in test_resume_torchrun.py.)"""

from __future__ import annotations

import pytest
import torch

from torchfeed.data import (
    DistributedSampler,
)


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_the_sampler_draws_what_torchs_draws(drop_last, shuffle):
    """Its indices and attributes are torch's, and it is an instance of torch's: PyTorch
    Lightning under DDP (and Ignite) keep a loader's sampler only when it is one, and otherwise
    shard the rank's share again (2 ranks read half of every epoch)."""
    dataset = range(23)
    for world in (1, 2, 3):
        for rank in range(world):
            ours = DistributedSampler(dataset, world, rank, shuffle, 5, drop_last)
            theirs = torch.utils.data.DistributedSampler(
                dataset, world, rank, shuffle, 5, drop_last
            )
            assert isinstance(ours, torch.utils.data.DistributedSampler)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs) and len(ours) == len(theirs)
                for name in ("dataset", "num_replicas", "rank", "epoch", "drop_last",
                             "num_samples", "total_size", "shuffle", "seed"):  # fmt: skip
                    assert getattr(ours, name) == getattr(theirs, name), name


def test_the_sampler_checks_its_arguments():
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\)"):
        DistributedSampler(range(5), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas must be an int >= 1"):
        DistributedSampler(range(5), num_replicas=0, rank=0)
    with pytest.raises(ValueError, match="the dataset is empty"):
        DistributedSampler([], num_replicas=1, rank=0)
    s = DistributedSampler(range(5), num_replicas=1, rank=0, seed=1)
    with pytest.raises(ValueError, match="seed=2 differs"):
        s.load_state_dict({**DistributedSampler(range(5), 1, 0, seed=2).state_dict()})
