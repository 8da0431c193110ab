"""Walking a nested batch: dicts, lists, tuples, namedtuples and batch types that hold tensors.

A batch type takes part by two methods (the :class:`TensorContainer` protocol): ``tensors()``
returns the tensors it holds, ``with_tensors(tensors)`` the same batch over other tensors
(moved, staged, viewed). Nothing here knows any batch type. Also here: where each tensor of a
batch goes in one block of memory (:func:`field_layout`, :func:`carve`), and :class:`Lazy`, a
tensor that is written in place once its memory is known.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = [
    "FIELD_ALIGN",
    "Lazy",
    "TensorContainer",
    "carve",
    "concat",
    "field_layout",
    "map_tensors",
    "nbytes",
    "tensors_of",
]

FIELD_ALIGN = 64  # each tensor of a batch laid out in one block starts on a cache line


@runtime_checkable
class TensorContainer(Protocol):
    """A batch type whose tensors :func:`map_tensors` can reach."""

    def tensors(self) -> tuple[Any, ...]: ...

    def with_tensors(self, tensors: Sequence[Any]) -> Any: ...


def _is_tensor(x: Any) -> bool:
    return isinstance(x, Tensor)


def map_tensors(
    obj: Any, fn: Callable[[Any], Any], is_leaf: Callable[[Any], bool] = _is_tensor
) -> Any:
    """Applies ``fn`` to every leaf (tensor) of a nested batch, rebuilding the same structure."""
    if is_leaf(obj):
        return fn(obj)
    if hasattr(type(obj), "with_tensors"):
        return obj.with_tensors([map_tensors(t, fn, is_leaf) for t in obj.tensors()])
    if isinstance(obj, Mapping):
        items = {k: map_tensors(v, fn, is_leaf) for k, v in obj.items()}
        return type(obj)(items) if isinstance(obj, dict) else items
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuples, Padded among them
        return type(obj)(*(map_tensors(v, fn, is_leaf) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(v, fn, is_leaf) for v in obj)
    return obj


def tensors_of(obj: Any, is_leaf: Callable[[Any], bool] = _is_tensor) -> list[Any]:
    """The leaves of a nested batch, in :func:`map_tensors` order."""
    found: list[Any] = []
    map_tensors(obj, found.append, is_leaf)
    return found


def nbytes(leaf: Any) -> int:
    return int(leaf.nbytes)


def field_layout(
    leaves: list[Any], size: Callable[[Any], int] = nbytes
) -> tuple[dict[int, int], int]:
    """Where each leaf of a batch starts in one block (each on a cache line; a leaf that occurs
    twice is placed once), and the block's size."""
    offsets: dict[int, int] = {}
    total = 0
    for leaf in leaves:
        if id(leaf) not in offsets:
            offsets[id(leaf)] = total
            total += -(-size(leaf) // FIELD_ALIGN) * FIELD_ALIGN
    return offsets, total


def carve(block: Tensor, start: int, size: int, dtype: torch.dtype, shape: Sequence[int]) -> Tensor:
    """The tensor of ``dtype`` and ``shape`` stored at ``block[start : start + size]``."""
    return block[start : start + size].view(dtype).view(tuple(shape))


class Lazy:
    """A tensor that a collate writes in place: packed into a ring, ``fill(out)`` writes it
    straight into the ring's memory (``out`` is ``shape`` contiguous, then ``permute``d); on the
    ordinary path ``make()`` builds it."""

    def __init__(
        self,
        dtype: torch.dtype,
        shape: Sequence[int],
        fill: Callable[[Tensor], Any],
        make: Callable[[], Tensor],
        permute: tuple[int, ...] | None = None,
    ) -> None:
        self.dtype = dtype
        self.shape = tuple(shape)
        self.fill = fill
        self.make = make
        self.permute = permute

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


def concat(parts: Sequence[Tensor]) -> Lazy:
    """The flattened concatenation of ``parts``, written once."""
    flat = [p.reshape(-1) for p in parts]
    numel = sum(p.numel() for p in flat)
    return Lazy(
        flat[0].dtype, (numel,), lambda out: torch.cat(flat, out=out), lambda: torch.cat(flat)
    )
