"""RaggedBatch: packing, host lengths, varlen-attention tensors, movement, pickling."""

from __future__ import annotations

import pickle

import pytest
import torch

import torchfeed
from torchfeed import RaggedBatch

from helpers import DEVICES


def make(device="cpu", lengths=(3, 0, 5, 1), feat=()):
    seqs = [torch.randn(n, *feat).to(device) for n in lengths]
    return seqs, RaggedBatch.from_sequences(seqs)


@pytest.mark.parametrize("device", DEVICES)
def test_from_sequences_round_trip(device):
    seqs, rb = make(device, feat=(2,))
    assert rb.batch_size == len(rb) == 4
    assert rb.host_lengths == (3, 0, 5, 1)
    assert rb.host_offsets == (0, 3, 3, 8, 9)
    assert rb.max_seqlen == 5
    assert rb.values.shape == (9, 2) and rb.device.type == device
    for a, b in zip(rb.unbind(), seqs, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(rb[-1], seqs[-1])


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_attention_tensors(device):
    _, rb = make(device)
    assert rb.cu_seqlens.dtype == torch.int32
    assert rb.cu_seqlens.tolist() == [0, 3, 3, 8, 9]
    assert rb.position_ids.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0]
    assert rb.lengths.tolist() == [3, 0, 5, 1]
    assert rb.position_ids.device.type == device


def test_max_seqlen_is_a_host_int():
    _, rb = make()
    assert type(rb.max_seqlen) is int


@pytest.mark.parametrize("device", DEVICES)
def test_pad_equals_list_pad(device):
    seqs, rb = make(device, feat=(3,))
    for kwargs in (
        {},
        dict(padding_side="left", pad_value=-1.0),
        dict(max_length=2, truncation_side="left", pad_to_multiple_of=3),
    ):
        a, b = rb.pad(**kwargs), torchfeed.pad(seqs, **kwargs)
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_truncate():
    seqs = [torch.arange(5), torch.arange(2), torch.arange(0)]
    rb = RaggedBatch.from_sequences(seqs)
    right = rb.truncate(3)
    assert [t.tolist() for t in right.unbind()] == [[0, 1, 2], [0, 1], []]
    left = rb.truncate(3, "left")
    assert [t.tolist() for t in left.unbind()] == [[2, 3, 4], [0, 1], []]
    assert rb.truncate(10) is rb


def test_pickle_keeps_everything():
    _, rb = make(feat=(2,))
    back = pickle.loads(pickle.dumps(rb))
    assert back.host_lengths == rb.host_lengths
    assert torch.equal(back.values, rb.values) and torch.equal(back.offsets, rb.offsets)


def test_to_keeps_host_lengths_and_casts():
    _, rb = make()
    moved = rb.to(torch.float64)
    assert moved.dtype == torch.float64 and moved.host_lengths == rb.host_lengths
    assert moved.offsets.dtype == torch.int64


@pytest.mark.cuda
def test_to_cuda_and_pad_there():
    seqs, rb = make()
    gpu = rb.pin_memory().to("cuda", non_blocking=True)
    assert gpu.values.is_cuda and gpu.offsets.is_cuda
    out = gpu.pad(pad_value=0.5)
    ref = torchfeed.pad(seqs, pad_value=0.5)
    for a, b in zip(out, ref, strict=True):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (([1, 2], torch.tensor([0, 2])), {}, TypeError, "values must be a tensor"),
        ((torch.arange(2), [0, 2]), {}, TypeError, "offsets must be an int64 tensor"),
        ((torch.tensor(1), torch.tensor([0])), {}, ValueError, "at least one dimension"),
        ((torch.arange(2), torch.tensor([0.0, 2.0])), {}, TypeError, "offsets must be int64"),
        ((torch.arange(2), torch.tensor([2, 0])), {}, ValueError, r"offsets\[0\] must be 0"),
        (
            (torch.arange(4), torch.tensor([0, 3, 4])),
            dict(lengths=[3]),
            ValueError,
            "lengths has 1 entries but offsets describes 2 sequences",
        ),
        (
            (torch.arange(4), torch.tensor([0, 3, 4])),
            dict(lengths=[2, 2]),
            ValueError,
            r"lengths \[2, 2\] disagree with offsets \[0, 3, 4\]",
        ),
        (
            (torch.arange(4), torch.tensor([0, 3, 4])),
            dict(lengths=[5, -1]),
            ValueError,
            "lengths must be >= 0",
        ),
    ],
)
def test_bad_construction(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        RaggedBatch(*args, **kwargs)


def test_bad_access_and_options():
    _, rb = make()
    with pytest.raises(IndexError, match="sequence index 4 out of range for a batch of 4"):
        rb[4]
    with pytest.raises(TypeError, match="index must be an int"):
        rb[1:2]
    with pytest.raises(ValueError, match="max_length must be >= 1"):
        rb.truncate(0)
    with pytest.raises(ValueError, match="truncation_side must be 'right' or 'left'"):
        rb.truncate(2, "both")
    with pytest.raises(ValueError, match="padding_side must be"):
        rb.pad(padding_side="top")


def test_from_sequences_errors():
    with pytest.raises(ValueError, match="at least one tensor"):
        RaggedBatch.from_sequences([])
    with pytest.raises(ValueError, match=r"sequences\[1\] must have at least one dimension"):
        RaggedBatch.from_sequences([torch.arange(2), torch.tensor(3)])
