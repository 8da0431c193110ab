"""PadCollate in an ordinary DataLoader's workers with recycle=True (the default): dict batches
written into the worker's reused shared memory arrive as plain dicts equal to the ordinary
path's, with fork and spawn, over epochs; a consumer keeping batches never waits; a batch changed
after the collate, tuple samples and recycle=False take the ordinary path."""

from __future__ import annotations

import copy
import gc
import pickle
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchfeed import PadCollate, RaggedBatch
from torchfeed.memory import _recycled

from helpers import text_sample


def sample(i: int) -> dict:
    return text_sample(i, longest=39, label_lists=True)  # zero-length sequences among them


class Samples(Dataset):
    def __init__(self, n=37, tuples=False):
        self.n, self.tuples = n, tuples

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = sample(i)
        return (s["input_ids"], s["label"]) if self.tuples else s


def in_recycled_memory(t: torch.Tensor) -> bool:
    # the ordinary path's tensors arrive in torch shared-memory storages; recycled ones view the
    # worker's memory through a mapping of this process's own
    return not t.is_shared()


def leaves(batch: dict) -> list[torch.Tensor]:
    out = []
    for v in batch.values():
        out += list(v.tensors()) if isinstance(v, RaggedBatch) else [v]
    return [t for t in out if isinstance(t, torch.Tensor)]


def same(a, b) -> None:
    assert type(a) is dict and a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if isinstance(y, RaggedBatch):
            x, y = list(x.tensors()), list(y.tensors())
            assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(x, y, strict=True))
        elif isinstance(y, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), k
        else:
            assert x == y, k


def loader(collate, dataset=None, **kw):
    kw = {"batch_size": 8, "num_workers": 2, "collate_fn": collate, **kw}
    return DataLoader(dataset or Samples(), **kw)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("persistent", [False, True])
def test_recycled_batches_are_the_ordinary_ones(context, persistent, packed):
    kw = dict(multiprocessing_context=context, persistent_workers=persistent)
    args = dict(ragged=["input_ids", "labels"], packed=packed)
    ours, plain = loader(PadCollate(**args), **kw), loader(PadCollate(**args, recycle=False), **kw)
    for _ in range(2):  # persistent workers reuse their memory in the second epoch
        for b, (a, o) in enumerate(zip(ours, plain, strict=True)):
            same(a, o)
            same(a, PadCollate(**args)([sample(i) for i in range(8 * b, min(8 * b + 8, 37))]))
            assert all(in_recycled_memory(t) for t in leaves(a))
            assert not any(in_recycled_memory(t) for t in leaves(o))


def test_a_consumer_keeping_every_batch_never_waits(monkeypatch):
    monkeypatch.setattr(_recycled, "RING_MIN_BYTES", 0)  # rings of 6 first batches (forked)
    kept = list(DataLoader(Samples(400), batch_size=4, num_workers=2, collate_fn=PadCollate()))
    assert len(kept) == 100  # far more than a worker's memory holds: the ordinary path then
    modes = [in_recycled_memory(b["input_ids"]) for b in kept]
    assert modes[0] and not all(modes)
    for b, batch in enumerate(kept):
        same(batch, PadCollate()([sample(i) for i in range(4 * b, 4 * b + 4)]))


def add_a_field(batch):
    out = PadCollate()(batch)
    out["extra"] = torch.ones(2)
    return out


def replace_a_field(batch):
    out = PadCollate()(batch)
    out["input_ids"] = out["input_ids"] + 1
    return out


def edit_in_place(batch):
    out = PadCollate()(batch)
    out["input_ids"] += 1  # still the tensor the collate wrote: crosses recycled
    return out


@pytest.mark.parametrize(
    ("collate", "recycled", "change"),
    [(add_a_field, False, "extra"), (replace_a_field, False, 1), (edit_in_place, True, 1)],
)
def test_a_batch_changed_after_the_collate_arrives_as_changed(collate, recycled, change):
    for b, batch in enumerate(loader(collate)):
        want = PadCollate()([sample(i) for i in range(8 * b, min(8 * b + 8, 37))])
        if change == "extra":
            want["extra"] = torch.ones(2)
        else:
            want["input_ids"] += change
        same(batch, want)
        assert in_recycled_memory(batch["input_ids"]) == recycled


def test_tuple_samples_and_recycle_false_take_the_ordinary_path():
    for ids, labels in loader(PadCollate(), dataset=Samples(tuples=True)):
        assert not in_recycled_memory(ids.padded) and not in_recycled_memory(labels)
    for batch in loader(PadCollate(recycle=False)):
        assert not any(in_recycled_memory(t) for t in leaves(batch))


def test_outside_workers_a_plain_dict():
    out = PadCollate()([sample(0), sample(1)])
    assert type(out) is dict


def test_a_recycled_batch_pickles_and_copies_as_a_plain_dict(monkeypatch):
    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())  # as in a worker
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)  # a ring of this process's own
    monkeypatch.setattr("torchfeed.collate._fields.get_worker_info", lambda: object())
    batch = PadCollate()([sample(i) for i in range(5)])
    want = PadCollate(recycle=False)([sample(i) for i in range(5)])
    assert isinstance(batch, _recycled.RecycledDict)
    for again in (pickle.loads(pickle.dumps(batch)), copy.deepcopy(batch), copy.copy(batch)):
        assert type(again) is dict
        same(again, want)
    # through a DataLoader queue's pickler: the region's handle, then a dict viewing it
    sent = ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))
    assert type(sent) is dict
    same(sent, want)
    batch["input_ids"][0, 0] = 99  # the same memory, through another mapping of it
    assert int(sent["input_ids"][0, 0]) == 99 and in_recycled_memory(sent["input_ids"])
    del batch, sent
    gc.collect()


@pytest.mark.parametrize(
    "tensor",
    [torch.ones(2, requires_grad=True), torch.eye(3).to_sparse(), torch.ones(0)],
    ids=["requires_grad", "sparse", "no_bytes"],
)
def test_what_cannot_arrive_as_it_left_takes_the_ordinary_path(monkeypatch, tensor):
    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())  # as in a worker
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)
    batch = {"x": tensor, "y": [1, 2]}
    assert _recycled.recycle_dict(batch) is batch
    plain = {"x": torch.arange(3), "y": [1, 2]}
    assert isinstance(_recycled.recycle_dict(plain), _recycled.RecycledDict)


class Growing(Dataset):
    """Sequences sorted by length, 1 to 4,000 tokens: every batch far larger than the first."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"input_ids": torch.arange(1 + i * 63, dtype=torch.int64), "label": i}


def test_batches_far_larger_than_the_first_still_recycle():
    batches = list(DataLoader(Growing(), batch_size=4, num_workers=1, collate_fn=PadCollate()))
    # the first batch is 4 x 190 tokens, the last 4 x 4,000 (21x): each still fits the ring,
    # since a worker's ring is at least RING_MIN_BYTES, not only 6 of its first batch
    assert batches[-1]["input_ids"].numel() > 6 * batches[0]["input_ids"].numel()
    for b, batch in enumerate(batches):
        assert in_recycled_memory(batch["input_ids"]), b
        want = PadCollate()([Growing()[i] for i in range(4 * b, 4 * b + 4)])
        same(batch, want)
