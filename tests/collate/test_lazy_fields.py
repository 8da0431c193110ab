"""The fields a collate does not pad or transform (labels, scores, a multimodal sample's image,
nested dicts), written once where the batch goes: in a worker, ImageCollate, PadCollate,
TokenizerCollate and DefaultCollate hand the worker's recycled memory Lazy buffers, never a
tensor stacked in memory of its own first; a batch that cannot cross recycled is made afresh on
the ordinary path, unless it holds no such buffer."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

import torchfeed
from torchfeed._tree import Lazy, tensors_of
from torchfeed.collate import _fields
from torchfeed.collate._fields import collate_field

from helpers import same_batch as same
from helpers import written


def lazies(batch):
    return tensors_of(batch, lambda x: isinstance(x, Lazy))


@pytest.fixture
def in_worker(monkeypatch):
    """leave_worker as a DataLoader worker runs it, with the batches offered to the recycled
    memory recorded; ``refuse`` makes the memory have no room (the batch is handed back)."""
    offered = []
    state = types.SimpleNamespace(offered=offered, refuse=False)

    def recycle_batch(batch):
        offered.append(batch)
        return batch if state.refuse else ("recycled", written(batch))

    monkeypatch.setattr(_fields, "get_worker_info", lambda: object())
    monkeypatch.setattr(_fields._recycled, "recycle_batch", recycle_batch)
    return state


def text_samples(n=4):
    return [
        {
            "input_ids": list(range(i + 2)),
            "pixel_values": torch.full((3, 4, 5), float(i)),
            "label": i,
            "score": np.float32(i / 2),
            "meta": {"box": torch.arange(4) + i, "tags": (i, torch.ones(2) * i)},
            "name": f"s{i}",
        }
        for i in range(n)
    ]


def image_samples(n=4):
    return [
        (torch.full((3, 6 + i, 7), i, dtype=torch.uint8), torch.full((2,), float(i)), i)
        for i in range(n)
    ]


def test_collate_field_lazy_is_the_same_field_written_once():
    values = [torch.full((2, 3), float(i)) for i in range(4)]
    lazy = collate_field("x", values, lazy=True)
    assert isinstance(lazy, Lazy) and lazy.shape == (4, 2, 3)
    same(lazy.make(), default_collate(values))
    arrays = [np.arange(3, dtype=np.int16) + i for i in range(4)]
    same(collate_field("a", arrays, lazy=True).make(), default_collate(arrays))
    nested = [{"box": torch.ones(2) * i, "k": i} for i in range(4)]
    got = collate_field("n", nested, lazy=True)
    assert isinstance(got["box"], Lazy)
    same(written(got), default_collate(nested))
    same(collate_field("n", [1, 2], lazy=True), torch.tensor([1, 2]))
    assert collate_field("s", ["a", "b"], lazy=True) == ["a", "b"]


def test_collate_field_lazy_keeps_its_errors():
    with pytest.raises(ValueError, match=r"field 'x' has shape \[2\] in sample 0 but \[3\]"):
        collate_field("x", [torch.ones(2), torch.ones(3)], lazy=True)
    with pytest.raises(TypeError, match="field 'x' is torch.float32 in sample 0 but torch.int64"):
        collate_field("x", [torch.ones(2), torch.ones(2, dtype=torch.int64)], lazy=True)


def default_samples():
    samples = text_samples()
    for s in samples:
        s["input_ids"] = torch.tensor(s["input_ids"][:2])
    return samples


@pytest.mark.parametrize(
    "collate, samples",
    [
        (torchfeed.PadCollate(ragged=["input_ids"]), text_samples),
        (torchfeed.DefaultCollate(), default_samples),
    ],
    ids=["PadCollate", "DefaultCollate"],
)
def test_fixed_fields_reach_the_recycled_memory_unwritten(in_worker, collate, samples):
    ordinary = collate._collate(samples(), False) if hasattr(collate, "_collate") else None
    tag, batch = collate(samples())
    (offered,) = in_worker.offered
    assert tag == "recycled"
    assert isinstance(offered["pixel_values"], Lazy) and torch.is_tensor(offered["label"])
    assert isinstance(offered["meta"]["box"], Lazy) and isinstance(offered["meta"]["tags"][1], Lazy)
    same(batch, ordinary if ordinary is not None else default_collate(samples()))


def test_image_collate_labels_reach_the_recycled_memory_unwritten(in_worker):
    collate = torchfeed.ImageCollate(0)
    tag, batch = collate(image_samples())
    (offered,) = in_worker.offered
    assert tag == "recycled" and isinstance(offered[1], Lazy) and torch.is_tensor(offered[2])
    same(batch[1], torch.stack([torch.full((2,), float(i)) for i in range(4)]))
    same(batch[2], torch.arange(4))


def test_no_room_makes_the_batch_afresh_with_nothing_unwritten(in_worker):
    in_worker.refuse = True
    samples = text_samples()
    batch = torchfeed.PadCollate(ragged=["input_ids"])(samples)
    assert not lazies(batch) and len(in_worker.offered) == 1
    assert isinstance(batch["pixel_values"], torch.Tensor)
    same(batch["pixel_values"], torch.stack([s["pixel_values"] for s in samples]))
    images = torchfeed.ImageCollate(0)(image_samples())
    assert not lazies(images) and len(in_worker.offered) == 2
    same(images[2], torch.arange(4))


def test_a_batch_with_nothing_unwritten_is_not_made_twice(in_worker, monkeypatch):
    # a bare ragged batch (PadCollate.packed) is no dict or tuple: it cannot cross recycled, and
    # holds no Lazy buffer, so it leaves as it is, padded once
    in_worker.refuse = True
    calls = []
    collate = torchfeed.PadCollate(packed=True)
    real = collate._collate
    monkeypatch.setattr(collate, "_collate", lambda b, lazy: calls.append(lazy) or real(b, lazy))
    batch = collate([torch.arange(3), torch.arange(5)])
    assert calls == [True] and isinstance(batch, torchfeed.RaggedBatch)
    assert batch.values.tolist() == [0, 1, 2, 0, 1, 2, 3, 4]
