"""RaggedBatch: a batch of variable-length sequences, packed, with its lengths on the host."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor

from torchfeed.padding import (
    Padded,
    PadValue,
    Side,
    _check_sequences,
    check_length_options,
    check_pad_value,
    check_side,
    pad_packed_op,
    padded_length,
)


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
        if not isinstance(values, Tensor):
            raise TypeError(f"values must be a tensor [N, *feat], got {type(values).__name__}")
        if not isinstance(offsets, Tensor):
            raise TypeError(f"offsets must be an int64 tensor [B+1], got {type(offsets).__name__}")
        if values.dim() < 1:
            raise ValueError("values must have at least one dimension ([N, *feat]), got 0-d")
        if offsets.dtype != torch.int64:
            raise TypeError(f"offsets must be int64, got {offsets.dtype}")
        if offsets.dim() != 1 or offsets.shape[0] < 1:
            raise ValueError(
                f"offsets must be 1-D with B+1 >= 1 entries, got shape {list(offsets.shape)}"
            )
        if offsets.device != values.device:
            raise ValueError(
                f"offsets must be on the device of values ({values.device}), got {offsets.device}"
            )
        if lengths is None:
            host = offsets.tolist()  # synchronizes a CUDA device: pass lengths to avoid it
        else:
            lengths = [int(n) for n in lengths]
            if len(lengths) != offsets.shape[0] - 1:
                raise ValueError(
                    f"lengths has {len(lengths)} entries but offsets describes "
                    f"{offsets.shape[0] - 1} sequences"
                )
            if any(n < 0 for n in lengths):
                raise ValueError(f"lengths must be >= 0, got {lengths}")
            host = [0, *itertools.accumulate(lengths)]
            if offsets.device.type == "cpu" and offsets.tolist() != host:
                raise ValueError(f"lengths {lengths} disagree with offsets {offsets.tolist()}")
        _check_host_offsets(host, values.shape[0])
        self.values = values
        self.offsets = offsets
        self._host_offsets = tuple(host)

    @classmethod
    def from_sequences(cls, sequences: Sequence[Tensor]) -> RaggedBatch:
        """Packs a list of tensors ``[n_i, *feat]`` (one dtype, one device)."""
        seqs = _check_sequences(sequences)
        for i, s in enumerate(seqs):
            if s.dim() == 0:
                raise ValueError(f"sequences[{i}] must have at least one dimension, got 0-d")
        lengths = [s.shape[0] for s in seqs]
        offsets = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        values = torch.cat(seqs)
        return cls(values, offsets.to(values.device, non_blocking=True), lengths)

    # --- shape facts, all from the host -------------------------------------------------------
    @property
    def host_lengths(self) -> tuple[int, ...]:
        o = self._host_offsets
        return tuple(o[i + 1] - o[i] for i in range(len(o) - 1))

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

    # --- tensors for variable-length attention ------------------------------------------------
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

    # --- movement -----------------------------------------------------------------------------
    def to(self, *args, non_blocking: bool = False, **kwargs) -> RaggedBatch:
        """Moves values and offsets (``Tensor.to`` arguments); the host lengths come along."""
        values = self.values.to(*args, non_blocking=non_blocking, **kwargs)
        offsets = self.offsets.to(values.device, non_blocking=non_blocking)
        return self._with(values, offsets)

    def pin_memory(self) -> RaggedBatch:
        return self._with(self.values.pin_memory(), self.offsets.pin_memory())

    def is_pinned(self) -> bool:
        return self.values.is_pinned() and self.offsets.is_pinned()

    def _with(self, values: Tensor, offsets: Tensor) -> RaggedBatch:
        out = object.__new__(RaggedBatch)
        out.values, out.offsets, out._host_offsets = values, offsets, self._host_offsets
        return out

    # --- access -------------------------------------------------------------------------------
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
        check_length_options(None, max_length)
        left = check_side("truncation_side", truncation_side)
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
        left_pad = check_side("padding_side", padding_side)
        truncate_left = check_side("truncation_side", truncation_side)
        check_length_options(pad_to_multiple_of, max_length)
        check_pad_value(pad_value, self.values.dtype)
        length = padded_length(self.host_lengths, max_length, pad_to_multiple_of)
        return pad_packed_op(
            self.values,
            self.offsets,
            self._host_offsets,
            length,
            pad_value,
            left_pad,
            max_length,
            truncate_left,
        )

    def __repr__(self) -> str:
        return (
            f"RaggedBatch(batch_size={self.batch_size}, values={list(self.values.shape)} "
            f"{self.values.dtype}, max_seqlen={self.max_seqlen}, device={self.values.device})"
        )


def _check_host_offsets(offsets: Sequence[int], total: int) -> None:
    if offsets[0] != 0:
        raise ValueError(f"offsets[0] must be 0, got {offsets[0]}")
    for i in range(1, len(offsets)):
        if offsets[i] < offsets[i - 1]:
            raise ValueError(
                f"offsets must be non-decreasing, got offsets[{i - 1}]={offsets[i - 1]} > "
                f"offsets[{i}]={offsets[i]}"
            )
    if offsets[-1] != total:
        raise ValueError(f"offsets[-1] must equal values.shape[0]={total}, got {offsets[-1]}")
