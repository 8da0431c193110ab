"""Fused pad-and-mask against pad_sequence and nested tensors (issue: 3x / 2x the pad_sequence
baseline on the large / small case), and PadCollate against the hand-written collate."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

import torchfeed

CASES = {"64x[8,512]": (64, 8, 512), "32x[8,64]": (32, 8, 64)}


def make_sequences(batch: int, lo: int, hi: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g).tolist()
    return [torch.randint(0, 32000, (n,), generator=g) for n in lengths]


@pytest.fixture(params=list(CASES), scope="module")
def case(request):
    return request.param, make_sequences(*CASES[request.param])


def pad_sequence_baseline(seqs):
    padded = pad_sequence(seqs, batch_first=True, padding_value=0)
    lengths = torch.tensor([s.shape[0] for s in seqs])
    mask = torch.arange(padded.shape[1]) < lengths[:, None]
    return padded, mask, lengths


def nested_baseline(seqs):
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged)
    padded = nt.to_padded_tensor(0)
    lengths = nt.offsets().diff()
    mask = torch.arange(padded.shape[1]) < lengths[:, None]
    return padded, mask, lengths


def floor(seqs):
    # Allocating the padded output and copying the real tokens once: no mask, no pads.
    out = torch.empty(len(seqs), max(s.shape[0] for s in seqs), dtype=seqs[0].dtype)
    torch.cat(seqs, out=out.view(-1)[: sum(s.shape[0] for s in seqs)])
    return out


def test_pad_torchfeed(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad {name}"
    role("torchfeed")
    out = benchmark(torchfeed.pad, seqs)
    ref = pad_sequence_baseline(seqs)
    assert all(torch.equal(a, b) for a, b in zip(out, ref, strict=True))


def test_pad_pad_sequence(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad {name}"
    role("baseline")
    benchmark(pad_sequence_baseline, seqs)


def test_pad_nested_jagged(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad {name}"
    role("baseline")
    out = benchmark(nested_baseline, seqs)
    assert torch.equal(out[0], pad_sequence_baseline(seqs)[0])


def test_pad_floor_alloc_and_copy(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad {name}"
    role("floor")
    benchmark(floor, seqs)


def make_samples():
    g = torch.Generator().manual_seed(1)
    samples = []
    for i, seq in enumerate(make_sequences(64, 8, 512)):
        samples.append(
            {"image": torch.randn(3, 64, 64, generator=g), "tokens": seq, "label": i % 10}
        )
    return samples


def handwritten_collate(batch):
    images = torch.stack([b["image"] for b in batch])
    tokens = pad_sequence([b["tokens"] for b in batch], batch_first=True, padding_value=0)
    lengths = torch.tensor([b["tokens"].shape[0] for b in batch])
    mask = torch.arange(tokens.shape[1]) < lengths[:, None]
    labels = torch.tensor([b["label"] for b in batch])
    return {"image": images, "tokens": tokens, "attention_mask": mask, "label": labels}


@pytest.fixture(scope="module")
def samples():
    return make_samples()


COLLATE = torchfeed.PadCollate(
    {"tokens": 0}, masks={"tokens": "attention_mask"}, lengths={"tokens": None}
)


def test_collate_padcollate(benchmark, role, samples):
    benchmark.group = "collate 64 dicts"
    role("torchfeed")
    out = benchmark(COLLATE, samples)
    ref = handwritten_collate(samples)
    assert out.keys() == ref.keys()
    assert all(torch.equal(out[k], ref[k]) for k in ref)


def test_collate_handwritten(benchmark, role, samples):
    benchmark.group = "collate 64 dicts"
    role("baseline")
    benchmark(handwritten_collate, samples)


def synchronized(fn, *args):
    def run():
        out = fn(*args)
        torch.cuda.synchronize()
        return out

    return run


@pytest.mark.cuda
def test_pad_cuda_torchfeed_packed(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad cuda {name}"
    role("torchfeed")
    batch = torchfeed.RaggedBatch.from_sequences(seqs).to("cuda")
    out = benchmark(synchronized(batch.pad))
    ref = pad_sequence_baseline(seqs)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(out, ref, strict=True))


@pytest.mark.cuda
def test_pad_cuda_torchfeed_list(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad cuda {name}"
    role("torchfeed")
    gpu = [s.cuda() for s in seqs]
    benchmark(synchronized(torchfeed.pad, gpu))


@pytest.mark.cuda
def test_pad_cuda_pad_sequence(benchmark, role, case):
    name, seqs = case
    benchmark.group = f"pad cuda {name}"
    role("baseline")
    gpu = [s.cuda() for s in seqs]

    def baseline():
        padded = pad_sequence(gpu, batch_first=True, padding_value=0)
        lengths = torch.tensor([s.shape[0] for s in gpu]).cuda(non_blocking=True)
        return padded, torch.arange(padded.shape[1], device="cuda") < lengths[:, None], lengths

    benchmark(synchronized(baseline))
