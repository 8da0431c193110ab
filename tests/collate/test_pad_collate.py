"""PadCollate on the batches users have: dicts and tuples mixing ragged and fixed fields."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset

from torchfeed import PadCollate, Padded, RaggedBatch

from helpers import text_sample


def test_dicts_mixed_fields():
    batch = [text_sample(i) for i in range(6)]
    collate = PadCollate(
        {"input_ids": 0, "labels": -100},
        masks={"input_ids": "attention_mask", "labels": None},
        lengths={"labels": None},
    )
    out = collate(batch)
    assert set(out) == {
        "input_ids",
        "attention_mask",
        "input_ids_lengths",
        "labels",
        "image",
        "label",
        "weight",
        "flag",
        "text",
        "meta",
    }
    ids = [s["input_ids"] for s in batch]
    assert torch.equal(out["input_ids"], pad_sequence(ids, batch_first=True, padding_value=0))
    assert torch.equal(
        out["labels"],
        pad_sequence([s["labels"] for s in batch], batch_first=True, padding_value=-100),
    )
    lengths = torch.tensor([len(t) for t in ids])
    assert torch.equal(out["input_ids_lengths"], lengths)
    assert torch.equal(
        out["attention_mask"], torch.arange(out["input_ids"].shape[1]) < lengths[:, None]
    )
    assert torch.equal(out["image"], torch.stack([s["image"] for s in batch]))
    assert out["label"].dtype == torch.int64 and out["label"].tolist() == [0, 1, 2, 0, 1, 2]
    assert out["weight"].dtype == torch.float64
    assert out["flag"].dtype == torch.bool
    assert out["text"] == [f"sample {i}" for i in range(6)]
    assert out["meta"] == [None] * 6


def test_default_mask_and_length_names():
    out = PadCollate(["input_ids", "labels"])([text_sample(i) for i in range(3)])
    assert "input_ids_mask" in out and "input_ids_lengths" in out


def test_options_apply_to_every_ragged_field():
    batch = [{"a": torch.arange(n), "b": torch.arange(n) * 2} for n in (3, 9)]
    out = PadCollate(
        ["a", "b"], padding_side="left", max_length=5, truncation_side="left", pad_to_multiple_of=4
    )(batch)
    assert out["a"].shape == out["b"].shape == (2, 8)
    assert out["a"][1].tolist() == [0, 0, 0, 4, 5, 6, 7, 8]
    assert out["b_lengths"].tolist() == [3, 5]


def test_tuples_and_namedtuples():
    batch = [(torch.arange(n), n, "x") for n in (2, 4)]
    out = PadCollate([0])(batch)
    assert isinstance(out, tuple) and isinstance(out[0], Padded)
    assert out[0].padded.tolist() == [[0, 1, 0, 0], [0, 1, 2, 3]]
    assert out[1].tolist() == [2, 4] and out[2] == ["x", "x"]

    Pair = collections.namedtuple("Pair", "tokens label")
    out = PadCollate([0], pad_value=-1)([Pair(torch.arange(n), n) for n in (1, 3)])
    assert isinstance(out, Pair) and out.tokens.padded.tolist() == [[0, -1, -1], [0, 1, 2]]

    out = PadCollate([1])([[1.0, torch.arange(2)], [2.0, torch.arange(1)]])
    assert isinstance(out, list) and out[1].lengths.tolist() == [2, 1]


def test_bare_tensors_are_all_ragged():
    out = PadCollate(pad_value=9)([torch.arange(2), torch.arange(3)])
    assert out.padded.tolist() == [[0, 1, 9], [0, 1, 2]]


def test_numpy_fields():
    batch = [
        {"ids": np.arange(n), "vec": np.ones(2, dtype=np.float32), "k": np.int32(n)} for n in (1, 3)
    ]
    out = PadCollate(["ids"])(batch)
    assert out["ids"].tolist() == [[0, 0, 0], [0, 1, 2]]
    assert out["vec"].shape == (2, 2) and out["k"].tolist() == [1, 3]


def test_packed_fields():
    batch = [text_sample(i) for i in range(5)]
    out = PadCollate(["input_ids", "labels"], packed=True, max_length=4)(batch)
    rb = out["input_ids"]
    assert isinstance(rb, RaggedBatch)
    assert rb.host_lengths == tuple(min(len(s["input_ids"]), 4) for s in batch)
    for got, s in zip(rb.unbind(), batch, strict=True):
        assert torch.equal(got, s["input_ids"][:4])
    assert "input_ids_mask" not in out


def test_input_samples_not_modified():
    batch = [text_sample(i) for i in range(3)]
    before = [
        {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in s.items()} for s in batch
    ]
    PadCollate(["input_ids", "labels"], max_length=2)(batch)
    for s, b in zip(batch, before, strict=True):
        for k in s:
            assert torch.equal(s[k], b[k]) if isinstance(s[k], torch.Tensor) else s[k] == b[k]


class TextDataset(Dataset):
    def __len__(self):
        return 37

    def __getitem__(self, i):
        return text_sample(i)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_workers(context):
    collate = PadCollate({"input_ids": 0, "labels": -100}, masks={"input_ids": "attention_mask"})
    loader = DataLoader(
        TextDataset(),
        batch_size=8,
        num_workers=2,
        collate_fn=collate,
        multiprocessing_context=context,
    )
    seen = 0
    for b, batch in enumerate(loader):
        expected = collate([text_sample(i) for i in range(8 * b, min(8 * b + 8, 37))])
        assert batch.keys() == expected.keys()
        for k, v in expected.items():
            assert torch.equal(batch[k], v) if isinstance(v, torch.Tensor) else batch[k] == v
        seen += batch["label"].shape[0]
    assert seen == 37


def test_dataloader_packed_with_workers():
    loader = DataLoader(
        TextDataset(),
        batch_size=10,
        num_workers=2,
        collate_fn=PadCollate(["input_ids", "labels"], packed=True),
    )
    lengths = [rb for batch in loader for rb in batch["input_ids"].host_lengths]
    assert lengths == [len(text_sample(i)["input_ids"]) for i in range(37)]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(ragged="input_ids"), TypeError, "ragged must be a mapping"),
        (dict(ragged={"a": "x"}), TypeError, r"ragged\['a'\]: the pad value must be a number"),
        (dict(ragged=["a"], masks={"b": "m"}), ValueError, r"masks names field\(s\) \['b'\]"),
        (dict(ragged=["a"], lengths={"a": 3}), TypeError, r"lengths\['a'\] must be a str or None"),
        (dict(ragged=["a"], padding_side="top"), ValueError, "padding_side must be"),
        (dict(ragged=["a"], max_length=0), ValueError, "max_length must be >= 1"),
        (dict(ragged=["a"], pad_to_multiple_of=-2), ValueError, "pad_to_multiple_of must be >= 1"),
        (
            dict(ragged=["a"], packed=True, pad_to_multiple_of=8),
            ValueError,
            "no effect with packed=True",
        ),
        (
            dict(ragged=["a"], packed=True, padding_side="left"),
            ValueError,
            "no effect with packed=True",
        ),
        (dict(ragged=["a"], packed=1), TypeError, "packed must be a bool"),
        (dict(ragged=["a"], recycle="yes"), TypeError, "recycle must be a bool"),
        (dict(pad_value=None), TypeError, "pad_value must be a number"),
    ],
)
def test_bad_configuration(kwargs, error, match):
    with pytest.raises(error, match=match):
        PadCollate(**kwargs)


@pytest.mark.parametrize(
    ("collate", "batch", "error", "match"),
    [
        (PadCollate(), [], ValueError, "batch is empty"),
        (PadCollate(), "abc", TypeError, "batch must be a list of samples"),
        (PadCollate(), [{"a": 1}, (1,)], TypeError, "sample 0 is a dict but sample 1 is tuple"),
        (PadCollate(), [3, 4], TypeError, "samples must be dicts, tuples/lists or tensors, got int"),
        (PadCollate(), [{"a": 1}, {"b": 1}], ValueError, r"sample 1 has different fields .*missing \['a'\], extra \['b'\]"),
        (PadCollate(["x"]), [{"a": 1}], ValueError, r"ragged field\(s\) \['x'\] are not in the samples"),
        (PadCollate(["a"]), [{"a": torch.arange(2)}, {"a": ["x", "y"]}], TypeError, "field 'a' of sample 1 is a list holding a str, expected numbers"),
        (PadCollate(["a"]), [{"a": torch.arange(2)}, {"a": 3}], TypeError, "field 'a' is a Tensor in sample 0 but a int in sample 1, expected a tensor, a numpy array or a list of numbers"),
        # 2-D tensors are stacked unless named in ragged=: shapes, dtypes and devices must agree
        (PadCollate(), [{"a": torch.ones(2, 3)}, {"a": torch.ones(3, 3)}], ValueError, r"field 'a' has shape \[2, 3\] in sample 0 but \[3, 3\] in sample 1; name it in ragged="),
        (PadCollate(), [{"a": torch.ones(2, 2)}, {"a": torch.ones(2, 2, dtype=torch.int64)}], TypeError, "field 'a' is torch.float32 in sample 0 but torch.int64 in sample 1"),
        (PadCollate(), [{"a": torch.ones(2, 2)}, {"a": torch.empty(2, 2, device="meta")}], ValueError, "field 'a' is on cpu in sample 0 but on meta in sample 1"),
        (PadCollate(), [{"a": torch.ones(1, 2)}, {"a": torch.ones(2)}], ValueError, r"field 'a' has shape \[1, 2\] in sample 0 but \[2\] in sample 1"),
        (PadCollate(), [{"a": torch.ones(2, 2)}, {"a": 3}], TypeError, "field 'a' is a tensor in sample 0 but a int in sample 1"),
        # a 1-D field is a sequence (padded): a sample that is not one is named
        (PadCollate(), [{"a": torch.ones(2)}, {"a": 3}], TypeError, "field 'a' is a Tensor in sample 0 but a int in sample 1, expected a tensor"),
        (PadCollate(), [{"a": torch.ones(2)}, {"a": torch.ones(2, dtype=torch.int64)}], TypeError, r"field 'a': pad_list: sequences\[1\] has dtype torch.int64 but sequences\[0\] has torch.float32"),
        (PadCollate(["a"]), [{"a": torch.arange(2), "a_mask": 1}], ValueError, "output name 'a_mask' for field 'a' collides"),
        (PadCollate({"a": -1}), [{"a": torch.arange(2, dtype=torch.uint8)}], ValueError, "PadCollate: field 'a': pad_list: pad_value=-1 is not representable in torch.uint8"),
        (PadCollate(["a"]), [{"a": torch.arange(2)}, {"a": torch.arange(2.0)}], TypeError, r"sequences\[1\] has dtype"),
        (PadCollate([2]), [(1, 2)], ValueError, r"ragged positions \[2\] do not exist in samples of 2 fields"),
        (PadCollate(), [(1, 2), (1,)], ValueError, "sample 1 has 1 fields but sample 0 has 2"),
    ],
)  # fmt: skip
def test_bad_batches(collate, batch, error, match):
    with pytest.raises(error, match=match):
        collate(batch)
