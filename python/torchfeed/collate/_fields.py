"""The fields of a batch that are not ragged: how they are collated, and the checks that every
sample agrees on what a field is."""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from torchfeed._tree import Lazy, tensors_of
from torchfeed.memory import SharedRing, _recycled

__all__ = [
    "LABEL_FIELDS",
    "LABEL_PAD",
    "as_sequences",
    "collate_field",
    "field_kind",
    "is_sequence",
    "lazy_collate",
    "leave_worker",
]

_NUMBER = (bool, int, float, np.number, np.bool_)

# Label fields of sequences are padded with the value the losses ignore (PyTorch's
# ignore_index, Hugging Face's label_pad_token_id).
LABEL_FIELDS = frozenset({"labels", "label_ids", "label"})
LABEL_PAD = -100


def is_sequence(value: Any) -> bool:
    """Whether a field's value is a sequence, which an automatic PadCollate pads: a list or
    tuple of numbers (what a tokenizer returns), or a 1-D tensor or array."""
    if isinstance(value, Tensor | np.ndarray):
        return value.ndim == 1
    return isinstance(value, list | tuple) and all(isinstance(v, _NUMBER) for v in value)


def as_sequences(key: Hashable | None, values: list) -> list[Tensor]:
    """A ragged field's values as tensors: tensors as they are, numpy arrays wrapped, lists and
    tuples of numbers converted as ``torch.tensor`` converts them (int64, float32 or bool), all
    in the dtype the whole field converts to (an empty list takes the others' dtype, int64 when
    every one is empty)."""
    where = "" if key is None else f"field {key!r} of "
    out: list[Any] = []
    listed = []
    for i, v in enumerate(values):
        if isinstance(v, Tensor):
            out.append(v)
        elif isinstance(v, np.ndarray):
            out.append(torch.from_numpy(v if v.flags.writeable else v.copy()))
        elif isinstance(v, list | tuple):
            if not is_sequence(v):
                bad = next(x for x in v if not isinstance(x, _NUMBER))
                raise TypeError(
                    f"PadCollate: {where}sample {i} is a {type(v).__name__} holding a "
                    f"{type(bad).__name__}, expected numbers (a list of token ids, say)"
                )
            out.append(torch.tensor(v) if v else None)
            listed.append(i)
        else:
            expected = "a tensor, a numpy array or a list of numbers for a ragged field"
            if i == 0 or key is None:
                raise TypeError(
                    f"PadCollate: {where}sample {i} is a {type(v).__name__}, expected {expected}"
                )
            raise TypeError(
                f"PadCollate: field {key!r} is a {type(values[0]).__name__} in sample 0 but a "
                f"{type(v).__name__} in sample {i}, expected {expected}"
            )
    if listed:
        dtypes = [out[i].dtype for i in listed if out[i] is not None]
        dtype = functools.reduce(torch.promote_types, dtypes) if dtypes else torch.int64
        for i in listed:
            out[i] = torch.empty(0, dtype=dtype) if out[i] is None else out[i].to(dtype)
    return out


def field_kind(value: Any) -> str:
    """What a field's value is, for collation: "tensor" (tensors and numpy arrays, stacked),
    "number" (to a tensor), "nested" (dicts, lists, tuples: default_collate), "other" (strings
    and any other object: kept as a list)."""
    if isinstance(value, Tensor | np.ndarray):
        return "tensor"
    if isinstance(value, _NUMBER):
        return "number"
    if isinstance(value, Mapping | tuple | list):
        return "nested"
    return "other"


def _check_kind(key: Hashable, values: Sequence[Any]) -> str:
    kind = field_kind(values[0])
    first = type(values[0])
    if all(type(v) is first for v in values):  # the common case, one cheap pass
        return kind
    for i, v in enumerate(values):
        if field_kind(v) != kind:
            what = kind if kind in ("tensor", "number") else type(values[0]).__name__
            raise TypeError(
                f"field {key!r} is a {what} in sample 0 but a {type(v).__name__} in sample {i}: "
                "every sample must give a field the same kind of value (a tensor or array, a "
                "number, a dict/list/tuple, or any other object)"
            )
    return kind


def _lazy_stack(batch: list[Tensor], *, collate_fn_map: Any = None) -> Tensor | Lazy:
    """A tensor field stacked as ``default_collate`` stacks it, as a :class:`Lazy` buffer that
    ``torch.stack`` writes straight into the region the batch crosses in. Tensors that are not
    plain CPU tensors of one shape and dtype (a subclass, another device, a tensor that requires
    grad; shapes that differ, for which ``torch.stack`` raises its usual error) are stacked now,
    in private memory, and copied where the batch goes."""
    first = batch[0]
    shape = (len(batch), *first.shape)
    if all(
        type(t) is Tensor
        and t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.requires_grad
        and t.dtype == first.dtype
        and t.shape == first.shape
        for t in batch
    ):
        return Lazy(
            first.dtype, shape, lambda out: torch.stack(batch, out=out), lambda: torch.stack(batch)
        )
    return torch.stack(batch, 0)


# default_collate's rules (numbers, strings, numpy arrays, nested dicts, lists, tuples and
# namedtuples), with its stacked tensors written where the batch goes
_LAZY_COLLATE = {**default_collate_fn_map, Tensor: _lazy_stack}


def lazy_collate(samples: list) -> Any:
    """``default_collate(samples)`` with each stacked tensor a :class:`Lazy` buffer (the same
    batch once written), for a batch that crosses in a ring's region: nothing is stacked in
    memory of its own first, nor in a fresh shared-memory file, as ``default_collate`` stacks
    inside a worker."""
    return collate(samples, collate_fn_map=_LAZY_COLLATE)


def collate_field(key: Hashable, values: list, lazy: bool = False) -> Any:
    """A field that is not padded: tensors and arrays stacked (shapes, dtypes and devices must
    agree), numbers to a tensor, nested values through ``default_collate``, anything else kept
    as a list. ``lazy``: stacked tensors as :class:`Lazy` buffers (:func:`lazy_collate`), for a
    batch written into a ring's region."""
    kind = _check_kind(key, values)
    if kind == "tensor":
        tensors = [torch.from_numpy(v) if isinstance(v, np.ndarray) else v for v in values]
        dtype = tensors[0].dtype
        if not all(t.dtype is dtype for t in tensors):  # stack would promote: refuse
            _explain_mismatch(key, tensors)
        try:
            # default_collate stacks straight into shared memory inside a worker process.
            return _lazy_stack(tensors) if lazy else default_collate(tensors)
        except RuntimeError:  # shapes or devices differ: say which sample, in our words
            _explain_mismatch(key, tensors)
            raise
    if kind == "number":
        return default_collate(values)  # a new tensor of the numbers, never shared memory
    if kind == "nested":
        return lazy_collate(values) if lazy else default_collate(values)
    return list(values)


def _explain_mismatch(key: Hashable, tensors: list[Tensor]) -> None:
    ref = tensors[0]
    for i, t in enumerate(tensors):
        if t.shape != ref.shape:
            raise ValueError(
                f"field {key!r} has shape {list(ref.shape)} in sample 0 but "
                f"{list(t.shape)} in sample {i}; name it in ragged= to pad it"
            )
        if t.dtype != ref.dtype:
            raise TypeError(f"field {key!r} is {ref.dtype} in sample 0 but {t.dtype} in sample {i}")
        if t.device != ref.device:
            raise ValueError(
                f"field {key!r} is on {ref.device} in sample 0 but on {t.device} in sample {i}"
            )


def leave_worker(
    collate: Callable[[bool], Any],
    shared_ring: SharedRing | None = None,
    recycle: bool = False,
) -> Any:
    """A collate's batch in the form it leaves the process it is made in. ``collate(lazy)``
    makes it; with ``lazy`` it may hold :class:`~torchfeed._tree.Lazy` buffers, written once
    their memory is known, so that nothing is stacked twice. Outside a DataLoader worker:
    ``collate(False)``. In one: packed into ``shared_ring`` when given (zero copy); else, with
    ``recycle``, a dict, list, tuple or namedtuple batch is written into the worker's recycled
    memory; else ``collate(False)``. A batch that cannot cross recycled (no room now, or a type
    that cannot) is made afresh by ``collate(False)`` when it holds a buffer not yet written,
    and leaves as it is when it holds none."""
    if get_worker_info() is not None:
        if shared_ring is not None:
            return shared_ring.pack(collate(True))
        if recycle:
            lazy = collate(True)
            recycled = _recycled.recycle_batch(lazy)
            if recycled is not lazy:
                return recycled
            return collate(False) if _holds_lazy(lazy) else lazy
    return collate(False)


def _holds_lazy(batch: Any) -> bool:
    return bool(tensors_of(batch, lambda x: isinstance(x, Lazy)))
