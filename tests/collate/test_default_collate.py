"""DefaultCollate: default_collate's batches (types, values, dtypes, shapes, nested fields, its
errors), written in an ordinary DataLoader's workers into memory each worker reuses; the default
of torchfeed.loader and ResumableLoader; the ordinary path outside workers, when the ring has no
room, for batches of another type and with recycle=False."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate, default_convert

import torchfeed
from torchfeed import DefaultCollate, ResumableLoader
from torchfeed.memory import _recycled

from helpers import same_batch as same

Pair = collections.namedtuple("Pair", "ids flag")
IMAGE = (3, 40, 48)  # a float image of 23 KB: a batch of 5 is past the 64 KiB of small fields


class Nested(Dataset):
    """Samples of every kind default_collate takes, as a per-sample pipeline returns them."""

    def __init__(self, n=23):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {
            "image": torch.rand(IMAGE, generator=g),
            "label": i,
            "score": 0.5 * i,
            "name": f"s{i}",
            "array": np.arange(4, dtype=np.int16) + i,
            "half": torch.full((2, 3), i, dtype=torch.float16),
            "bf16": torch.full((3,), i, dtype=torch.bfloat16),
            "mask": torch.arange(5) < i % 5,
            "empty": torch.zeros(0, 3),
            "nested": [torch.tensor([i, -i]), (np.float32(i), torch.ones(2, dtype=torch.uint8))],
            "pair": Pair(torch.full((4,), i), i % 2 == 0),
        }


class Kind(Dataset):
    """A sample as a tuple, a list, a namedtuple or a bare tensor."""

    def __init__(self, kind, n=17):
        self.kind, self.n = kind, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        image, label = torch.full(IMAGE, float(i)), i
        if self.kind == "tuple":
            return image, label
        if self.kind == "list":
            return [image, label]
        if self.kind == "namedtuple":
            return Pair(image, label)
        return image


def recycled(t: torch.Tensor) -> bool:
    # the ordinary path's tensors arrive in torch's shared-memory storages; a recycled batch's
    # view its worker's memory through a mapping of this process's own
    return not t.is_shared()


def batches(ds, collate_fn=None, epochs=1, **kw):
    dl = DataLoader(ds, batch_size=5, collate_fn=collate_fn, **kw)
    return [b for _ in range(epochs) for b in dl]


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("persistent", [False, True])
def test_the_batches_are_default_collates_written_into_reused_memory(context, persistent):
    kw = dict(num_workers=2, multiprocessing_context=context, persistent_workers=persistent)
    ours = batches(Nested(), DefaultCollate(), epochs=2, **kw)
    plain = batches(Nested(), None, epochs=2, **kw)
    assert len(ours) == len(plain) == 10
    for a, b in zip(ours, plain, strict=True):
        same(a, b)
    assert all(recycled(b["image"]) and b["image"].is_contiguous() for b in ours)
    assert not any(recycled(b["image"]) for b in plain)  # (the check tells the two apart)


@pytest.mark.parametrize("kind", ["tuple", "list", "namedtuple"])
def test_tuple_list_and_namedtuple_batches_are_recycled_as_their_plain_types(kind):
    ours = batches(Kind(kind), DefaultCollate(), num_workers=2)
    plain = batches(Kind(kind), None, num_workers=2)
    for a, b in zip(ours, plain, strict=True):
        same(a, b)
        assert recycled(a[0])


def test_bare_tensor_batches_and_recycle_false_take_the_ordinary_path():
    for ds, collate_fn in ((Kind("tensor"), DefaultCollate()), (Nested(), DefaultCollate(False))):
        ours = batches(ds, collate_fn, num_workers=2)
        for a, b in zip(ours, batches(ds, None, num_workers=2), strict=True):
            same(a, b)
            assert not recycled(a if isinstance(a, torch.Tensor) else a["image"])


def test_outside_workers_it_is_default_collate():
    samples = [Nested()[i] for i in range(5)]
    same(DefaultCollate()(samples), default_collate(samples))
    same(DefaultCollate(recycle=False)(samples), default_collate(samples))


def test_a_consumer_keeping_every_batch_never_waits(monkeypatch):
    monkeypatch.setattr(_recycled, "RING_MIN_BYTES", 0)  # rings of 6 first batches (forked)
    ds = Nested(200)
    kept = batches(ds, DefaultCollate(), num_workers=2, multiprocessing_context="fork", timeout=60)
    for a, b in zip(kept, batches(ds, None), strict=True):
        same(a, b)
    modes = [recycled(b["image"]) for b in kept]
    assert modes[0] and not all(modes)  # the rings filled, then the ordinary path


class Uneven(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"image": torch.zeros(3, 8 + i, 8)}


class Caught:
    """A collate that returns the error its inner collate raised, as the batch (so the error
    of a worker's collate is read without a DataLoader failing mid-epoch)."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, samples):
        try:
            return self.inner(samples)
        except RuntimeError as e:
            return str(e)


def test_images_of_different_sizes_raise_default_collates_error():
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        batches(Uneven(), DefaultCollate())
    # in a worker, where the batch would be written into recycled memory: the same error
    ours = batches(Uneven(), Caught(DefaultCollate()), num_workers=2)
    assert ours == batches(Uneven(), Caught(default_collate), num_workers=2)
    assert "stack expects each tensor to be equal size" in ours[0]


class Unusual(Dataset):
    """Tensors written eagerly, not lazily: a tensor subclass, mixed dtypes (promoted)."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        from torchvision import tv_tensors

        return {
            "image": tv_tensors.Image(torch.full(IMAGE, i, dtype=torch.uint8)),
            "mixed": torch.tensor([i], dtype=torch.int32 if i % 2 else torch.int64),
        }


def test_subclasses_and_mixed_dtypes_collate_as_default_collate_does():
    ours = batches(Unusual(), DefaultCollate(), num_workers=2)
    plain = batches(Unusual(), None, num_workers=2)
    for a, b in zip(ours, plain, strict=True):
        assert type(a["image"]) is type(b["image"])
        assert torch.equal(a["image"], b["image"]) and a["mixed"].dtype == b["mixed"].dtype
        assert torch.equal(a["mixed"], b["mixed"])


def test_only_plain_cpu_tensors_of_one_shape_and_dtype_are_written_lazily():
    from torchvision import tv_tensors

    from torchfeed._tree import Lazy
    from torchfeed.collate._fields import lazy_collate

    plain = [torch.full((2, 3), float(i)) for i in range(4)]
    lazy = lazy_collate(plain)
    assert isinstance(lazy, Lazy) and lazy.shape == (4, 2, 3) and lazy.dtype == torch.float32
    out = torch.empty(lazy.shape)
    lazy.fill(out)
    assert torch.equal(out, torch.stack(plain)) and torch.equal(lazy.make(), torch.stack(plain))
    grad = [t.clone().requires_grad_() for t in plain]
    mixed = [plain[0], plain[1].double()]
    for eager in (grad, [tv_tensors.Image(t) for t in plain], mixed):
        got = lazy_collate(eager)
        assert isinstance(got, torch.Tensor) and torch.equal(got, default_collate(eager))


def test_zero_copy_writes_default_collates_batches_into_its_ring():
    dl = torchfeed.loader(Nested(), zero_copy=True, batch_size=5, num_workers=2)
    assert repr(dl.collate_fn) == "DefaultCollate()"
    ours = [b for _ in range(2) for b in dl]
    for a, b in zip(ours, batches(Nested(), None, epochs=2), strict=True):
        same(a, b)
    assert all(dl.shared_ring.contains(b["image"]) for b in ours)


def test_loader_and_resumable_loader_use_it_when_given_no_collate_fn():
    assert isinstance(torchfeed.loader(Nested(), batch_size=5).collate_fn, DefaultCollate)
    assert isinstance(ResumableLoader(Nested(), 5).collate_fn, DefaultCollate)
    ours = [b for b in torchfeed.loader(Nested(), batch_size=5, num_workers=2, seed_samples=False)]
    for a, b in zip(ours, batches(Nested(), None), strict=True):
        same(a, b)
    assert all(recycled(b["image"]) for b in ours)
    # without batches, a DataLoader converts each sample: left as it is
    assert torchfeed.loader(Nested(), batch_size=None).collate_fn is default_convert
    # a collate_fn the caller gave stays, by keyword or by position; None, either way, is none
    assert torchfeed.loader(Nested(), batch_size=5, collate_fn=default_collate).collate_fn is (
        default_collate
    )
    given = (5, False, None, None, 0, default_collate)
    assert ResumableLoader(Nested(), *given).collate_fn is default_collate
    assert torchfeed.loader(Nested(), *given).collate_fn is default_collate
    for none in (dict(collate_fn=None), dict()):
        assert isinstance(ResumableLoader(Nested(), *given[:5], **none).collate_fn, DefaultCollate)
    assert isinstance(ResumableLoader(Nested(), *given[:5], None).collate_fn, DefaultCollate)


def test_recycle_must_be_a_bool():
    with pytest.raises(TypeError, match="recycle must be a bool, got str"):
        DefaultCollate("yes")  # type: ignore[arg-type]
    assert repr(DefaultCollate(recycle=False)) == "DefaultCollate(recycle=False)"
    bound = DefaultCollate(False).with_shared_ring(None)
    assert bound.recycle is False and bound.shared_ring is None
