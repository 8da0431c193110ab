"""Copy-on-write-safe sample metadata for map-style datasets read by forked workers."""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["SerializedList"]


class SerializedList(Sequence):
    """A list of Python objects stored as ONE numpy byte buffer plus offsets.

    A plain list of dicts in a Dataset is copied page by page into every forked DataLoader
    worker, because reading an object writes its reference count (PyTorch issue #13246): the
    workers' memory grows to a full copy each. Here the objects are pickled into two numpy
    arrays, which reads never write to; ``__getitem__`` unpickles one item."""

    def __init__(self, items: Iterable[Any]) -> None:
        blobs = [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL) for x in items]
        self._offsets = np.cumsum([0] + [len(b) for b in blobs], dtype=np.int64)
        self._data = np.frombuffer(b"".join(blobs), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> Any:  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"SerializedList index {i} out of range for length {n}")
        i %= n
        return pickle.loads(self._data[self._offsets[i] : self._offsets[i + 1]].tobytes())

    @property
    def nbytes(self) -> int:
        return self._data.nbytes + self._offsets.nbytes
