"""PadCollate on what a Hugging Face tokenizer returns: lists of token ids as ragged fields, the
automatic mode, and PadCollate.from_tokenizer against transformers' own collators
(DataCollatorWithPadding, DataCollatorForSeq2Seq, DataCollatorWithFlattening) where transformers
is installed, and against fixed expected outputs everywhere."""

from __future__ import annotations

import random
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import torchfeed
from torchfeed import PadCollate


class Tokenizer:
    """Duck-typed: what PadCollate.from_tokenizer reads of a transformers tokenizer."""

    def __init__(self, pad_token_id=0, padding_side="right", pad_token_type_id=0, names=None):
        self.pad_token_id = pad_token_id
        self.padding_side = padding_side
        self.pad_token_type_id = pad_token_type_id
        self.model_input_names = names or ["input_ids", "token_type_ids", "attention_mask"]


FEATURES = [
    {"input_ids": [101, 7592, 102], "attention_mask": [1, 1, 1], "label": 1},
    {"input_ids": [101, 102], "attention_mask": [1, 1], "label": 0},
    {"input_ids": [101, 0, 7, 102], "attention_mask": [1, 1, 1, 1], "label": 1},  # a real 0
]


def test_the_issue_row_lists_of_ints_are_ragged_fields():
    out = PadCollate({"input_ids": 0, "attention_mask": 0})(FEATURES)
    assert out["input_ids"].tolist() == [[101, 7592, 102, 0], [101, 102, 0, 0], [101, 0, 7, 102]]
    assert out["input_ids_mask"].tolist()[2] == [True] * 4  # from the lengths: the real 0 is kept
    assert out["label"].tolist() == [1, 0, 1] and out["input_ids"].dtype == torch.int64


def test_no_arguments_pads_what_is_a_sequence_whatever_the_lengths():
    collate = PadCollate()
    equal = [{"ids": [1, 2], "labels": [5, 6], "x": torch.ones(3, 2), "y": 0.5, "name": "a"}] * 2
    ragged = [{"ids": [1, 2, 3], "labels": [5], "x": torch.ones(3, 2), "y": 0.5, "name": "b"},
              {"ids": [4], "labels": [6, 7], "x": torch.ones(3, 2), "y": 1.5, "name": "c"}]  # fmt: skip
    a, b = collate(equal), collate(ragged)
    assert list(a) == list(b)  # the same keys whatever the batch's lengths
    assert {k: v.dtype for k, v in a.items() if isinstance(v, torch.Tensor)} == {
        k: v.dtype for k, v in b.items() if isinstance(v, torch.Tensor)
    }
    assert a["ids_mask"].all() and a["ids"].shape == (2, 2)  # padded (to itself) with its mask
    assert b["labels"].tolist() == [[5, -100], [6, 7]]  # labels are padded with -100
    assert b["ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert b["x"].shape == (2, 3, 2) and b["y"].dtype == torch.float64 and b["name"] == ["b", "c"]
    arrays = [{"ids": np.arange(3)}, {"ids": np.arange(1)}]
    assert collate(arrays)["ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_dtypes_of_list_fields():
    out = PadCollate()(
        [{"a": [], "b": [0.5], "c": [True]}, {"a": [], "b": [1], "c": [False, True]}]
    )
    assert out["a"].dtype == torch.int64 and out["a"].shape == (2, 0)  # all empty: int64
    assert out["b"].dtype == torch.float32  # as torch.tensor([0.5, 1]) converts them
    assert out["c"].dtype == torch.bool


@pytest.mark.parametrize("side", ["right", "left"])
def test_from_tokenizer_fixed_expected_outputs(side):
    collate = PadCollate.from_tokenizer(
        Tokenizer(pad_token_id=9, padding_side=side), pad_to_multiple_of=4
    )
    features = [
        {"input_ids": [1, 2, 3], "token_type_ids": [0, 0, 1], "special_tokens_mask": [1, 0, 1], "label": 2},
        {"input_ids": [4], "token_type_ids": [0], "special_tokens_mask": [1], "label": 0},
    ]  # fmt: skip
    out = collate(features)
    assert list(out) == [  # transformers' order: the mask it made after the features' fields
        "input_ids",
        "token_type_ids",
        "special_tokens_mask",
        "attention_mask",
        "labels",
    ]
    assert all(v.dtype == torch.int64 for v in out.values())
    right = side == "right"
    pad = (
        (lambda row, v: row + [v] * (4 - len(row)))
        if right
        else (lambda row, v: [v] * (4 - len(row)) + row)
    )
    assert out["input_ids"].tolist() == [pad([1, 2, 3], 9), pad([4], 9)]
    assert out["attention_mask"].tolist() == [
        pad([1, 1, 1], 0),
        pad([1], 0),
    ]  # made from the lengths
    assert out["token_type_ids"].tolist() == [pad([0, 0, 1], 0), pad([0], 0)]
    assert out["special_tokens_mask"].tolist() == [pad([1, 0, 1], 1), pad([1], 1)]
    assert out["labels"].tolist() == [2, 0]
    seq2seq = collate(
        [{"input_ids": [1, 2], "labels": [5, 6, 7]}, {"input_ids": [3], "labels": [8]}]
    )
    assert seq2seq["labels"].tolist() == [pad([5, 6, 7], -100), pad([8], -100)]


def test_from_tokenizer_packed_fixed_expected_outputs():
    collate = PadCollate.from_tokenizer(Tokenizer(), packed=True)
    out = collate(
        [
            {"input_ids": [5, 6, 7]},
            {"input_ids": []},
            {"input_ids": [8, 9], "attention_mask": [1, 1]},
        ]
    )
    assert out["input_ids"].tolist() == [[5, 6, 7, 8, 9]]
    assert out["labels"].tolist() == [[-100, 6, 7, -100, 9]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert out["cu_seq_lens_q"].tolist() == [0, 3, 5] and out["cu_seq_lens_q"].dtype == torch.int32
    assert out["max_length_q"] == out["max_length_k"] == 3
    assert "attention_mask" not in out  # dropped, as DataCollatorWithFlattening drops it


def test_from_tokenizer_errors():
    with pytest.raises(ValueError, match="the tokenizer has no pad token"):
        PadCollate.from_tokenizer(Tokenizer(pad_token_id=None))
    with pytest.raises(ValueError, match="tokenizer.padding_side must be 'right' or 'left'"):
        PadCollate.from_tokenizer(Tokenizer(padding_side="middle"))
    with pytest.raises(ValueError, match="pad_to_multiple_of has no effect with packed=True"):
        PadCollate.from_tokenizer(Tokenizer(), packed=True, pad_to_multiple_of=8)
    with pytest.raises(ValueError, match="every sample is empty"):
        PadCollate.from_tokenizer(Tokenizer(), packed=True)([{"input_ids": []}])
    with pytest.raises(ValueError, match="the samples have no 'input_ids' field"):
        PadCollate.from_tokenizer(Tokenizer())([{"ids": [1]}])


class Tokenized(torch.utils.data.Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"input_ids": list(range(1, 2 + i % 4)), "label": i}


def test_from_tokenizer_in_dataloader_workers():
    loader = DataLoader(Tokenized(), batch_size=4, num_workers=2,
                        collate_fn=PadCollate.from_tokenizer(Tokenizer()))  # fmt: skip
    batches = list(loader)
    assert [b["input_ids"].shape[0] for b in batches] == [4, 4, 2]
    assert batches[0]["attention_mask"].sum(1).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("packed", [False, True])
def test_from_tokenizer_recycles_worker_memory(packed):
    def batches(recycle):
        collate = PadCollate.from_tokenizer(Tokenizer(), packed=packed, recycle=recycle)
        return list(DataLoader(Tokenized(), batch_size=4, num_workers=2, collate_fn=collate))

    for ours, plain in zip(batches(True), batches(False), strict=True):
        assert type(ours) is dict and ours.keys() == plain.keys()
        for key, value in plain.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(ours[key], value) and ours[key].dtype == value.dtype, key
                # recycled: viewing the worker's memory, not a torch shared-memory file
                assert not ours[key].is_shared() and value.is_shared(), key
            else:
                assert ours[key] == value, key
    with pytest.raises(TypeError, match="recycle must be a bool"):
        PadCollate.from_tokenizer(Tokenizer(), packed=packed, recycle=None)


# Against transformers' own collators, where transformers is installed.


@pytest.fixture(scope="module")
def hf():
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *[f"w{i}" for i in range(40)]]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]")
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]"
    )
    return transformers, tokenizer


def texts(n, seed):
    rng = random.Random(seed)
    return [
        " ".join(f"w{rng.randrange(40)}" for _ in range(rng.randrange(1, 12))) for _ in range(n)
    ]


def same(ours, theirs):
    assert list(ours) == list(theirs)
    for key in theirs:
        if isinstance(theirs[key], torch.Tensor):
            assert ours[key].dtype == theirs[key].dtype, key
            assert torch.equal(ours[key], theirs[key]), key
        else:
            assert ours[key] == theirs[key], key


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("multiple", [None, 8])
def test_like_data_collator_with_padding(hf, side, multiple):
    transformers, tokenizer = hf
    tokenizer.padding_side = side
    for seed in range(3):
        features = [{**tokenizer(t, return_token_type_ids=True, return_special_tokens_mask=True), "label": i % 3}
                    for i, t in enumerate(texts(7, seed))]  # fmt: skip
        features[0]["score"] = 0.5  # a float field on every sample
        for f in features:
            f.setdefault("score", 0.25)
        theirs = transformers.DataCollatorWithPadding(tokenizer, pad_to_multiple_of=multiple)(
            [dict(f) for f in features]
        )
        same(
            PadCollate.from_tokenizer(tokenizer, pad_to_multiple_of=multiple)(features),
            dict(theirs),
        )
        plain = [
            {"input_ids": f["input_ids"], "label": f["label"]} for f in features
        ]  # no mask: made
        theirs = transformers.DataCollatorWithPadding(tokenizer)([dict(f) for f in plain])
        same(PadCollate.from_tokenizer(tokenizer)(plain), dict(theirs))


@pytest.mark.parametrize("side", ["right", "left"])
def test_like_data_collator_for_seq2seq(hf, side):
    transformers, tokenizer = hf
    tokenizer.padding_side = side
    features = [
        {**tokenizer(a), "labels": tokenizer(b)["input_ids"]}
        for a, b in zip(texts(6, 1), texts(6, 2), strict=True)
    ]
    theirs = transformers.DataCollatorForSeq2Seq(tokenizer, pad_to_multiple_of=4)(
        [dict(f) for f in features]
    )
    same(PadCollate.from_tokenizer(tokenizer, pad_to_multiple_of=4)(features), dict(theirs))


@pytest.mark.parametrize("labels", [False, True])
@pytest.mark.parametrize("flash", [False, True])
def test_like_data_collator_with_flattening(hf, labels, flash):
    transformers, tokenizer = hf
    features = [{"input_ids": tokenizer(t)["input_ids"]} for t in texts(6, 3)]
    if labels:
        for f in features:
            f["labels"] = [v + 1 for v in f["input_ids"]]
    theirs = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash)(
        [dict(f) for f in features]
    )
    same(
        PadCollate.from_tokenizer(tokenizer, packed=True, flash_attn_kwargs=flash)(features),
        dict(theirs),
    )


def test_the_top_level_collate_is_the_one_home():
    assert torchfeed.PadCollate is PadCollate and torchfeed.collate.PadCollate is PadCollate


def test_no_arguments_on_tokenizer_output_says_which_collate_gives_model_inputs():
    # a Hugging Face user's habit: collate_fn=PadCollate() on a tokenized dataset, then
    # model(**batch); the batch is still the one auto mode documents, with a warning that says
    # which keys a model refuses and what gives DataCollatorWithPadding's batch
    collate = PadCollate()
    with pytest.warns(UserWarning, match="tokenizer's output") as caught:
        out = collate(FEATURES)
    message = str(caught[0].message)
    for part in ("input_ids_mask", "attention_mask_lengths", "'label' stays", "from_tokenizer"):
        assert part in message, part
    assert caught[0].filename == __file__  # it points at the caller, not at torchfeed
    assert {"input_ids_mask", "attention_mask_mask", "label"} <= set(out)
    assert out["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collate(FEATURES)  # once per collate


@pytest.mark.parametrize(
    "collate",
    [
        PadCollate({"input_ids": 0, "attention_mask": 0}),  # the fields named: exactly these keys
        PadCollate(masks={"input_ids": None, "attention_mask": None}),  # the output's names chosen
        PadCollate(lengths={"input_ids": None}),
    ],
    ids=["ragged", "masks", "lengths"],
)
def test_tokenizer_output_with_fields_or_names_given_is_not_warned_about(collate):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = collate([{k: v for k, v in f.items() if k != "label"} for f in FEATURES])
    assert out["input_ids"].shape == (3, 4)


def test_samples_without_an_attention_mask_are_not_warned_about():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = PadCollate()(
            [{"input_ids": [1, 2], "labels": [3]}, {"input_ids": [4], "labels": [5, 6]}]
        )
    assert out["labels"].tolist() == [[3, -100], [5, 6]]
