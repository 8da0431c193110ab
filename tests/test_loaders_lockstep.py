"""Every rank yields the same number of batches in every resumed epoch: under DDP a rank with one
batch more waits forever in its all-reduce. Random configurations (dataset size, world sizes
before and after, workers before and after, batch size, cut point, drop_last / uneven), each
checkpointed with torchfeed.loader's state_dict and resumed; the ranks and their workers are
modelled in one process (a worker's stream is what the dataset yields for that rank and
worker, as a DataLoader worker reads it; the DataLoader batches each worker's stream apart),
and every sample is checked to be read exactly once across the cut, but for the padding the
docs name. (tests/test_loaders_torchrun.py runs real ranks under torchrun, with an all_reduce per
step through a resumed elastic epoch.)"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import torchfeed
from torchfeed.data import DistributedSampler, ShardedIterableDataset, _sharding

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def batches(count: int, batch_size: int, drop_last: bool) -> int:
    return count // batch_size if drop_last else -(-count // batch_size)


def map_checkpoint(n, world, batch_size, drop_last, cut, seed=5, epoch=2):
    sampler = DistributedSampler(n, world, 0, seed=seed, drop_last=drop_last)
    sampler.set_epoch(epoch)
    loader = torchfeed.loader(range(n), sampler=sampler, batch_size=batch_size, collate_fn=list)
    per_rank = len(sampler)
    cut = min(cut, batches(per_rank, batch_size, False))
    loader._batches = cut  # as if `cut` batches had been yielded on every rank (lockstep)
    state = loader.state_dict()
    order = list(sampler)
    consumed = [order[: cut * batch_size]]
    for r in range(1, world):
        other = DistributedSampler(n, world, r, seed=seed, drop_last=drop_last)
        other.set_epoch(epoch)
        consumed.append(list(other)[: cut * batch_size])
    return state, consumed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 400),
    before=st.integers(1, 5),
    after=st.integers(1, 5),
    batch_size=st.integers(1, 9),
    drop_last=st.booleans(),
    cut=st.integers(0, 60),
)
def test_map_style_resumes_in_lockstep(n, before, after, batch_size, drop_last, cut):
    assume(not (drop_last and n < max(before, after)))  # every rank would get nothing
    state, consumed = map_checkpoint(n, before, batch_size, drop_last, cut)
    rest = []
    for r in range(after):
        sampler = DistributedSampler(n, after, r, seed=5, drop_last=drop_last)
        sampler.load_state_dict(state["source"])
        assert len(sampler) == len(list(sampler))
        rest.append(list(sampler))
    counts = {len(r) for r in rest}
    assert len(counts) == 1, f"resumed shares {[len(r) for r in rest]}"
    assert len({batches(len(r), batch_size, d) for r in rest for d in (drop_last,)}) == 1
    # exactly once, but for padding (drop_last=False) and dropping (drop_last=True)
    epoch_plan = [i for c in consumed for i in c]
    seen = epoch_plan + [i for r in rest for i in r]
    planned = set(i for r in range(before) for i in _fresh(n, before, r, drop_last))
    assert set(seen) <= planned
    if drop_last:
        assert len(seen) == len(set(seen))  # nothing twice
        assert len(planned) - len(set(seen)) < after  # at most after - 1 left out
    else:
        assert set(seen) == planned  # everything
        assert len(seen) - len(set(seen)) < after + before  # the padding: repeats only


def _fresh(n, world, rank, drop_last):
    sampler = DistributedSampler(n, world, rank, seed=5, drop_last=drop_last)
    sampler.set_epoch(2)
    return list(sampler)


def streams(ds, world, workers, monkeypatch):
    """Each (rank, worker) consumer's samples, as its DataLoader worker reads them (from its own
    copy of the dataset, as a worker process has)."""
    out = {}
    for rank in range(world):
        for worker in range(workers):
            monkeypatch.setattr(_sharding, "rank_and_world_size", lambda r=rank: (r, world))
            monkeypatch.setattr(_sharding, "worker_and_count", lambda w=worker: (w, workers))
            out[rank, worker] = list(iter(copy.deepcopy(ds)))
    return out


def sharded(mode, items, length, uneven, seed=3, epoch=1):
    opener = (lambda k: [(k, j) for j in range(length)]) if mode == "shard" else (lambda k: (k, 0))
    lengths = [length] * items if mode == "shard" else None
    ds = ShardedIterableDataset(list(range(items)), opener, mode=mode, uneven=uneven, seed=seed,
                                item_lengths=lengths)  # fmt: skip
    ds.set_epoch(epoch)
    return ds


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    mode=st.sampled_from(["sample", "shard"]),
    items=st.integers(1, 40),
    length=st.integers(1, 6),
    world=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    workers=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    batch_size=st.integers(1, 7),
    uneven=st.sampled_from(["drop", "pad"]),
    drop_last=st.booleans(),
    cut=st.integers(0, 20),
)  # fmt: skip
def test_iterable_resumes_in_lockstep(
    mode, items, length, world, workers, batch_size, uneven, drop_last, cut, monkeypatch
):
    (w0, w1), (k0, k1) = world, workers
    assume(items >= max(w0 * k0, w1 * k1))  # else refused: tested in test_hostile_inputs
    ds = sharded(mode, items, length, uneven)
    before = streams(ds, w0, k0, monkeypatch)
    monkeypatch.setattr(_sharding, "rank_and_world_size", lambda: (0, w0))
    monkeypatch.setattr(torchfeed._resumable, "rank_and_world_size", lambda: (0, w0))
    loader = torchfeed.loader(ds, batch_size=batch_size, num_workers=k0, drop_last=drop_last,
                              collate_fn=list)  # fmt: skip
    per_rank = [sum(batches(len(before[r, w]), batch_size, drop_last) for w in range(k0))
                for r in range(w0)]  # fmt: skip
    assert len(set(per_rank)) == 1  # the fresh epoch is in lockstep
    cut = min(cut, per_rank[0])
    loader._batches = cut
    state = loader.state_dict()
    resumed = sharded(mode, items, length, uneven)
    resumed.load_state_dict(state["source"])
    after = streams(resumed, w1, k1, monkeypatch)
    per_rank = [sum(batches(len(after[r, w]), batch_size, drop_last) for w in range(k1))
                for r in range(w1)]  # fmt: skip
    assert len(set(per_rank)) == 1, f"resumed ranks yield {per_rank} batches"
    if w0 * k0 != w1 * k1:  # elastic: the rest is dealt out in equal streams
        lengths = {len(s) for s in after.values()}
        assert len(lengths) == 1, f"resumed consumers' streams {sorted(lengths)}"
