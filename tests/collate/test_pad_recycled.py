"""PadCollate in an ordinary DataLoader's workers with recycle=True (the default): dict, tuple,
list and namedtuple batches written into the worker's reused shared memory arrive as the plain
types, equal to the ordinary path's, with fork and spawn, over epochs; a consumer keeping batches
never waits; a batch changed after the collate, a batch of another type and recycle=False take
the ordinary path."""

from __future__ import annotations

import collections
import copy
import gc
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import NamedTuple

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchfeed import PadCollate
from torchfeed._tree import tensors_of
from torchfeed.memory import _recycled

from helpers import same_batch as same
from helpers import text_sample


def sample(i: int) -> dict:
    return text_sample(i, longest=39, label_lists=True)  # zero-length sequences among them


class Pair(NamedTuple):
    ids: torch.Tensor
    label: int


KINDS = ("dict", "tuple", "list", "namedtuple", "tensor")
RAGGED = {"dict": None, "tuple": [0, 1], "list": [0], "namedtuple": [0], "tensor": None}


def as_kind(s: dict, kind: str):
    """Sample ``s`` as a dataset of that kind returns it."""
    if kind == "tuple":
        return (s["input_ids"], s["labels"], s["label"])
    if kind == "list":
        return [s["input_ids"], s["image"], s["label"]]
    if kind == "namedtuple":
        return Pair(s["input_ids"], s["label"])
    if kind == "tensor":
        return s["input_ids"]
    return s


class Samples(Dataset):
    def __init__(self, n=37, kind="dict"):
        self.n, self.kind = n, kind

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return as_kind(sample(i), self.kind)


def in_recycled_memory(t: torch.Tensor) -> bool:
    # the ordinary path's tensors arrive in torch shared-memory storages; recycled ones view the
    # worker's memory through a mapping of this process's own
    return not t.is_shared()


def leaves(batch) -> list[torch.Tensor]:
    return [t for t in tensors_of(batch) if isinstance(t, torch.Tensor)]


def batch_of(data: Dataset, b: int) -> list:
    """The samples of batch ``b`` (of 8) of ``data``."""
    return [data[i] for i in range(8 * b, min(8 * b + 8, len(data)))]


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


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("kind", KINDS[1:])
def test_tuple_list_namedtuple_and_tensor_batches_recycle_too(kind, packed):
    # what PadCollate makes of them: a tuple (a Padded namedtuple per ragged position), a list,
    # a namedtuple, a Padded; packed, the ragged fields are RaggedBatches (a packed batch of bare
    # tensors is a RaggedBatch alone: not a container that crosses recycled)
    ragged = RAGGED[kind]
    data = Samples(kind=kind)
    ours = loader(PadCollate(ragged, packed=packed), data, persistent_workers=True)
    plain = loader(PadCollate(ragged, packed=packed, recycle=False), data)
    for _ in range(2):
        for b, (a, o) in enumerate(zip(ours, plain, strict=True)):
            want = PadCollate(ragged, packed=packed)(batch_of(data, b))
            same(a, o)
            same(a, want)
            recycled = not (packed and kind == "tensor")
            assert all(in_recycled_memory(t) == recycled for t in leaves(a)), kind
            assert not any(in_recycled_memory(t) for t in leaves(o))


def test_namedtuple_batches_recycle_with_spawn():
    data = Samples(kind="namedtuple")
    batches = list(loader(PadCollate([0]), data, multiprocessing_context="spawn"))
    assert [type(b) for b in batches] == [Pair] * 5
    for b, batch in enumerate(batches):
        same(batch, PadCollate([0])(batch_of(data, b)))
        assert all(in_recycled_memory(t) for t in leaves(batch))


def test_a_consumer_keeping_every_batch_never_waits(monkeypatch, ring_views):
    # ring_views: kept, these small batches hold their regions
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


def append_to_a_list(batch):
    out = PadCollate([0])(batch)
    out.append(torch.ones(2))
    return out


def replace_in_a_list(batch):
    out = PadCollate([0])(batch)
    out[2] = out[2] + 1
    return out


def replace_in_a_namedtuple(batch):
    return PadCollate([0])(batch)._replace(label=torch.zeros(2))


@pytest.mark.parametrize(
    ("kind", "collate", "edit"),
    [
        ("list", append_to_a_list, lambda w: w.append(torch.ones(2))),
        ("list", replace_in_a_list, lambda w: w.__setitem__(2, w[2] + 1)),
        ("namedtuple", replace_in_a_namedtuple, None),
    ],
    ids=["list_append", "list_replace", "namedtuple_replace"],
)
def test_a_list_or_namedtuple_changed_after_the_collate_arrives_as_changed(kind, collate, edit):
    data = Samples(kind=kind)
    for b, batch in enumerate(loader(collate, data)):
        want = PadCollate([0])(batch_of(data, b))
        if edit is None:
            want = want._replace(label=torch.zeros(2))
        else:
            edit(want)
        same(batch, want)
        assert not any(in_recycled_memory(t) for t in leaves(batch))


def test_recycle_false_takes_the_ordinary_path():
    for kind in ("dict", "tuple"):
        for batch in loader(PadCollate(recycle=False), Samples(kind=kind)):
            assert not any(in_recycled_memory(t) for t in leaves(batch))


def test_outside_workers_a_plain_dict():
    out = PadCollate()([sample(0), sample(1)])
    assert type(out) is dict


@pytest.mark.parametrize(
    ("kind", "recycled_type"),
    [
        ("dict", _recycled.RecycledDict),
        ("tuple", _recycled.RecycledTuple),
        ("list", _recycled.RecycledList),
        ("namedtuple", Pair),  # a recycled subclass of it
    ],
)
def test_a_recycled_batch_pickles_and_copies_as_its_plain_type(
    monkeypatch, ring_views, kind, recycled_type
):  # ring_views: these small fields views too
    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())  # as in a worker
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)  # a ring of this process's own
    monkeypatch.setattr("torchfeed.collate._fields.get_worker_info", lambda: object())
    ragged = RAGGED[kind]
    samples = [as_kind(sample(i), kind) for i in range(1, 6)]
    batch = PadCollate(ragged)(samples)
    want = PadCollate(ragged, recycle=False)(samples)
    assert isinstance(batch, recycled_type) and type(batch) is not type(want)
    for again in (pickle.loads(pickle.dumps(batch)), copy.deepcopy(batch), copy.copy(batch)):
        same(again, want)
    # through a DataLoader queue's pickler: the region's handle, then the batch viewing it
    sent = ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))
    same(sent, want)
    first = sent["input_ids"] if kind == "dict" else sent[0].padded
    mine = batch["input_ids"] if kind == "dict" else batch[0].padded
    mine[0, 0] = 99  # the same memory, through another mapping of it
    assert int(first[0, 0]) == 99 and in_recycled_memory(first)
    del batch, sent, first, mine
    gc.collect()


def test_small_fields_arrive_as_copies_of_their_own(monkeypatch):
    """A field of at most SMALL_FIELD_BYTES (the labels, the lengths) is copied out of the
    region on arrival, so keeping it holds none of the batch's memory; a larger one views it."""
    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())  # as in a worker
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)  # a ring of this process's own
    monkeypatch.setattr("torchfeed.collate._fields.get_worker_info", lambda: object())
    samples = [{"input_ids": torch.arange(3000) + i, "label": i} for i in range(4)]
    batch = PadCollate()(samples)  # input_ids: 4 x 3000 int64, 96 KB; the rest small
    sent = ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))
    same(sent, PadCollate(recycle=False)(samples))
    for key in ("input_ids", "input_ids_mask", "input_ids_lengths", "label"):
        batch[key].view(-1)[0] = 7 if key != "input_ids_mask" else 0  # the worker's side
    assert int(sent["input_ids"][0, 0]) == 7  # a view of the region
    assert sent["input_ids_mask"].nbytes == 12000 and bool(sent["input_ids_mask"][0, 0])
    assert int(sent["input_ids_lengths"][0]) == 3000 and int(sent["label"][0]) == 0  # copies
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
    assert _recycled.recycle_batch(batch) is batch
    plain = {"x": torch.arange(3), "y": [1, 2]}
    assert isinstance(_recycled.recycle_batch(plain), _recycled.RecycledDict)


class Batch:
    def __init__(self, x):
        self.x = x


@pytest.mark.parametrize(
    "batch",
    [
        collections.OrderedDict(x=torch.arange(3)),
        collections.UserDict(x=torch.arange(3)),
        Batch(torch.arange(3)),
        torch.arange(3),
    ],
    ids=["OrderedDict", "UserDict", "own_class", "tensor"],
)
def test_a_batch_of_another_type_takes_the_ordinary_path(monkeypatch, batch):
    # it would not arrive as the type that left (or holds tensors the walk does not see)
    monkeypatch.setattr(_recycled, "get_worker_info", lambda: object())
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)
    assert _recycled.recycle_batch(batch) is batch


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
