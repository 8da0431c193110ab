"""Shared test helpers: dtypes, devices, exact comparisons, random data, commands run in the
test process."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence

import pytest
import torch

# Every dtype the copy kernels support: they move elements as bit patterns, so this covers each
# element size and each kind (bool, unsigned, signed, float, float8, complex).
ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.complex64,
    torch.complex128,
]

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers, so any two dtypes compare exactly (float8 and complex
    have no == on every device)."""
    return t.contiguous().view(torch.uint8).reshape(-1)


def assert_bits_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert torch.equal(bits(actual).cpu(), bits(expected).cpu())


def random_values(shape, dtype, generator=None) -> torch.Tensor:
    """Random, never-constant data of any dtype (float8 via float32)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=generator) * 4).to(dtype)
    hi = 100 if dtype != torch.uint8 else 250
    lo = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -100
    return torch.randint(lo, hi, shape, generator=generator).to(dtype)


def run_in_process(
    capsys, command: Sequence[str], call: Callable[[], int | None]
) -> subprocess.CompletedProcess:
    """``call()`` (a command's entry point, run in this process: a subprocess would import torch
    and torchfeed again, several seconds of CPU) as a finished process: its return value or
    ``SystemExit`` code (None: 0) and what it printed, as ``subprocess.run`` would give them."""
    try:
        code = call()
    except SystemExit as stop:  # argparse's errors, and the commands' own
        code = stop.code
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(command), code or 0, out.out, out.err)


def text_sample(i: int, longest: int = 11, label_lists: bool = False) -> dict:
    """Sample ``i`` of a text dataset: ragged ``input_ids`` and ``labels`` of 0 to ``longest``
    tokens (``labels`` as a tokenizer's list with ``label_lists``), a fixed-shape tensor, numbers,
    a string and None."""
    g = torch.Generator().manual_seed(i)
    n = int(torch.randint(0, longest + 1, (), generator=g))
    ids = torch.randint(0, 50, (n,), generator=g)
    labels = torch.randint(0, 50, (n,), generator=g)
    return {
        "input_ids": ids,
        "labels": labels.tolist() if label_lists else labels,
        "image": torch.randn(3, 4, 4, generator=g),
        "label": i % 3,
        "weight": 0.5 * i,
        "flag": bool(i % 2),
        "text": f"sample {i}",
        "meta": None,
    }


def same_batch(a, b) -> None:
    """``a`` is ``b``'s type (a plain dict, tuple, list, namedtuple: never a recycled one) with
    equal contents: tensors of the same dtype, shape and values, RaggedBatch tensors alike."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(b, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif hasattr(b, "tensors"):  # a RaggedBatch
        x, y = list(a.tensors()), list(b.tensors())
        assert all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(x, y, strict=True))
    elif isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            same_batch(a[k], b[k])
    elif isinstance(b, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same_batch(x, y)
    else:
        assert a == b


def written(batch):
    """``batch`` with each :class:`~torchfeed._tree.Lazy` buffer made (what the ordinary path
    gives for a batch a collate built to be written into a ring's region)."""
    from torchfeed._tree import Lazy, map_tensors

    return map_tensors(batch, lambda leaf: leaf.make(), lambda x: isinstance(x, Lazy))


class Drawing(torch.utils.data.Dataset):
    """Each read draws from torch (an augmentation) and notes the thread it ran in."""

    def __init__(self, n: int = 96, fail_at: int | None = None) -> None:
        self.n, self.fail_at, self.threads = n, fail_at, set()

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.threads.add(threading.current_thread().name)
        if i == self.fail_at:
            raise ValueError(f"sample {i} is corrupt")
        return torch.tensor([float(i), torch.rand(()).item()])


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "torchfeed-prefetch"]


def wait_for_no_threads(timeout: float = 5.0) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if not prefetch_threads():
            return True
        time.sleep(0.02)
    return False
