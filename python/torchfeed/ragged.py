"""RaggedBatch: a batch of variable-length sequences, packed, with its lengths on the host."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchfeed.ops._pad import (
    Padded,
    PadOptions,
    PadValue,
    Side,
    check_host_offsets,
    check_sequences,
    pad_packed_with,
)

__all__ = ["RaggedBatch"]


class RaggedBatch:
    """B sequences packed into ``values`` ``[N, *feat]``, sequence i being
    ``values[offsets[i]:offsets[i+1]]``; ``offsets`` ``[B+1]`` int64 lives with the values.

    The lengths are also kept on the host, so sending the batch to a GPU moves only the real
    elements, and ``pad``, ``max_seqlen`` and ``position_ids`` never synchronize the device.
    Picklable (it travels from DataLoader workers) and pinnable (``DataLoader(pin_memory=True)``).
    """

    __slots__ = ("_host_offsets", "offsets", "values")

    def __init__(
        self, values: Tensor, offsets: Tensor, lengths: Sequence[int] | None = None
    ) -> None:
        self._host_offsets = check_host_offsets(values, offsets, lengths)
        self.values = values
        self.offsets = offsets

    @classmethod
    def from_sequences(cls, sequences: Sequence[Tensor]) -> RaggedBatch:
        """Packs a list of tensors ``[n_i, *feat]`` (one dtype, one device)."""
        seqs = list(sequences)
        check_sequences(seqs)
        lengths = [s.shape[0] for s in seqs]
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        values = torch.cat(seqs)
        return cls(values, offsets.to(values.device, non_blocking=True), lengths)

    @property
    def host_lengths(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in itertools.pairwise(self._host_offsets))

    @property
    def host_offsets(self) -> tuple[int, ...]:
        return self._host_offsets

    @property
    def batch_size(self) -> int:
        return len(self._host_offsets) - 1

    def __len__(self) -> int:
        return self.batch_size

    @property
    def max_seqlen(self) -> int:
        """The longest length, a Python int (no device sync)."""
        return max(self.host_lengths, default=0)

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def lengths(self) -> Tensor:
        """``[B]`` int64 on the values' device."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def cu_seqlens(self) -> Tensor:
        """``[B+1]`` int32 cumulative lengths with a leading 0 (flash-attention's varlen form)."""
        return self.offsets.to(torch.int32)

    @property
    def position_ids(self) -> Tensor:
        """``[N]`` int64: each element's position within its sequence, restarting at 0."""
        total = self.values.shape[0]
        starts = torch.repeat_interleave(self.offsets[:-1], self.lengths, output_size=total)
        return torch.arange(total, device=self.values.device) - starts

    def tensors(self) -> tuple[Tensor, Tensor]:
        return self.values, self.offsets

    def with_tensors(self, tensors: Sequence[Tensor]) -> RaggedBatch:
        """The same batch over other ``(values, offsets)`` (moved or staged copies)."""
        out = object.__new__(RaggedBatch)
        out.values, out.offsets = tensors
        out._host_offsets = self._host_offsets
        return out

    def to(self, *args: Any, non_blocking: bool = False, **kwargs: Any) -> RaggedBatch:
        """Moves values and offsets (``Tensor.to`` arguments); the host lengths come along."""
        values = self.values.to(*args, non_blocking=non_blocking, **kwargs)  # type: ignore[call-overload]
        offsets = self.offsets.to(values.device, non_blocking=non_blocking)
        return self.with_tensors((values, offsets))

    def pin_memory(self) -> RaggedBatch:
        return self.with_tensors((self.values.pin_memory(), self.offsets.pin_memory()))

    def is_pinned(self) -> bool:
        return self.values.is_pinned() and self.offsets.is_pinned()

    def __getitem__(self, i: int) -> Tensor:
        if not isinstance(i, int):
            raise TypeError(f"RaggedBatch index must be an int, got {type(i).__name__}")
        b = self.batch_size
        if not -b <= i < b:
            raise IndexError(f"sequence index {i} out of range for a batch of {b}")
        i %= b
        return self.values[self._host_offsets[i] : self._host_offsets[i + 1]]

    def unbind(self) -> list[Tensor]:
        return [self[i] for i in range(self.batch_size)]

    def truncate(self, max_length: int, truncation_side: Side = "right") -> RaggedBatch:
        """Keeps at most ``max_length`` elements of each sequence, dropping from the right or
        the left end."""
        left = PadOptions(max_length=max_length, truncation_side=truncation_side).truncate_left
        if self.max_seqlen <= max_length:
            return self
        keep = []
        for start, n in zip(self._host_offsets, self.host_lengths, strict=False):
            kept = min(n, max_length)
            first = start + (n - kept if left else 0)
            keep.append(torch.arange(first, first + kept))
        index = torch.cat(keep).to(self.values.device, non_blocking=True)
        lengths = [min(n, max_length) for n in self.host_lengths]
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        return RaggedBatch(
            self.values.index_select(0, index),
            offsets.to(self.values.device, non_blocking=True),
            lengths,
        )

    def pad(
        self,
        *,
        pad_value: PadValue = 0,
        padding_side: Side = "right",
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        truncation_side: Side = "right",
    ) -> Padded:
        """Pads to ``[B, L, *feat]`` on the batch's own device (one kernel launch on CUDA): send
        the packed batch to the GPU, pad it there."""
        options = PadOptions(
            pad_value, padding_side, pad_to_multiple_of, max_length, truncation_side
        )
        return self.pad_with(options)

    def pad_with(self, options: PadOptions) -> Padded:
        """:meth:`pad` with options validated once (:class:`torchfeed.ops.PadOptions`)."""
        return pad_packed_with(self.values, self.offsets, self._host_offsets, options)

    def __repr__(self) -> str:
        return (
            f"RaggedBatch(batch_size={self.batch_size}, values={list(self.values.shape)} "
            f"{self.values.dtype}, max_seqlen={self.max_seqlen}, device={self.values.device})"
        )
