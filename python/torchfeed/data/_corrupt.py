"""Skipping corrupt samples, with a bound, a log and a record of what was skipped."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["SkipCorrupt"]

log = logging.getLogger("torchfeed.data")


class SkipCorrupt(Dataset):
    """Wraps a map-style dataset: when reading sample i raises, logs the index and the error
    once, and returns another sample instead, chosen deterministically (i + 1, i + 2, ... modulo
    the length), trying at most ``max_retries`` others; if they all fail, raises a RuntimeError
    naming them. ``skipped_indices`` lists the samples that failed, gathered from every worker
    (it lives in shared memory). ``on_error(index, error)`` is called for each failure."""

    def __init__(
        self,
        dataset: Dataset,
        max_retries: int = 10,
        on_error: Callable[[int, BaseException], None] | None = None,
        errors: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    ) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.dataset = dataset
        self.max_retries = int(max_retries)
        self.on_error = on_error
        self.errors = errors
        n = len(dataset)  # type: ignore[arg-type]
        self._failed = torch.zeros((n + 7) // 8, dtype=torch.uint8).share_memory_()

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def _mark(self, i: int, error: BaseException) -> None:
        byte, bit = divmod(i, 8)
        if not int(self._failed[byte]) >> bit & 1:
            self._failed[byte] |= 1 << bit
            log.warning(
                "SkipCorrupt: sample %d failed (%s: %s); using another",
                i,
                type(error).__name__,
                error,
            )
        if self.on_error is not None:
            self.on_error(i, error)

    def __getitem__(self, i: int) -> Any:
        n = len(self)
        if isinstance(i, bool) or not isinstance(i, int | np.integer):
            raise TypeError(f"SkipCorrupt index must be an int, got {type(i).__name__}")
        if not -n <= i < n:  # also ends iteration by __getitem__ (list(), for ... in)
            raise IndexError(f"SkipCorrupt index {i} out of range for a dataset of {n} samples")
        i = int(i) % n
        tried = []
        for k in range(self.max_retries + 1):
            j = (i + k) % n
            try:
                return self.dataset[j]
            except self.errors as e:
                self._mark(j, e)
                tried.append(j)
                last = e
        raise RuntimeError(
            f"SkipCorrupt: sample {i} and the {self.max_retries} after it all failed "
            f"(indices {tried}); last error: {type(last).__name__}: {last}"
        ) from last

    @property
    def __getitems__(self) -> Callable[[list[int]], Any] | None:
        """The wrapped dataset's batched read, where it has one (a Hugging Face dataset reads a
        batch as one slice of its table; a ``Subset`` passes batches on), with the skipping: a
        batch whose read raises one of ``errors`` is read again sample by sample, each failing
        sample replaced as ``dataset[i]`` replaces it. None where the wrapped dataset has none:
        the DataLoader then reads by index, as without this wrapper."""
        batched = getattr(self.dataset, "__getitems__", None)
        if not batched:
            return None

        def read(indices: list[int]) -> Any:
            try:
                return batched(indices)
            except self.errors:
                return [self[i] for i in indices]

        return read

    def state_dict(self) -> dict[str, Any]:
        """The samples that failed so far (a loader's checkpoint carries them)."""
        return {"kind": "SkipCorrupt", "length": len(self), "skipped": self.skipped_indices}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") != "SkipCorrupt" or state.get("length") != len(self):
            raise ValueError(
                "SkipCorrupt.load_state_dict: not the state of a SkipCorrupt of "
                f"{len(self)} samples"
            )
        self._failed.zero_()
        for i in state["skipped"]:
            byte, bit = divmod(int(i), 8)
            self._failed[byte] |= 1 << bit

    @property
    def skipped_indices(self) -> list[int]:
        bits = np.unpackbits(self._failed.numpy(), bitorder="little")[: len(self)]
        return np.flatnonzero(bits).tolist()
