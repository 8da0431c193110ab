"""The pad op: ragged sequences to a padded batch, its mask and its lengths, in one pass.

``torch.ops.torchfeed.pad_list`` / ``pad_packed``: math in ``csrc/ops/pad.h``, checks in
``csrc/ops/pad_args.h``, kernels in ``csrc/ops/cpu/pad.cpp`` and ``csrc/ops/cuda/pad.cu``; this
module is their Python face: the wrappers and the fake kernels (the options, the
checks of paths without a kernel and the fallback are in :mod:`torchfeed.ops._pad`).

The mask comes from the lengths, never from ``tokens != pad_id``: real data contains the pad
id. The padded length is computed here on the host, where the lengths are known, and passed to
the op, so the output shape never depends on device data (no sync, no graph break).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from torchfeed.ops._dispatch import read_kernels
from torchfeed.ops._pad import (
    PackedSequences,
    Padded,
    PadOptions,
    PadValue,
    Side,
    as_list,
    check_host_offsets,
    pad_packed_with,
    pad_with,
    padded_length,
)

__all__ = ["Padded", "pad", "pad_packed"]


def pad(
    sequences: Sequence[Tensor] | PackedSequences,
    *,
    pad_value: PadValue = 0,
    padding_side: Side = "right",
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
    truncation_side: Side = "right",
) -> Padded:
    """Pads a list of tensors ``[n_i, *feat]`` (one dtype, one device, any numeric or bool
    dtype) to ``[B, L, *feat]`` in one pass (or a :class:`~torchfeed.RaggedBatch`).

    ``L`` is the longest length after truncation to ``max_length``, rounded up to
    ``pad_to_multiple_of``. ``padding_side`` puts the pads after (``"right"``) or before
    (``"left"``) the real elements; ``truncation_side`` says which end of a sequence longer than
    ``max_length`` is dropped. ``pad_value`` must be exactly representable in the dtype.
    """
    options = PadOptions(pad_value, padding_side, pad_to_multiple_of, max_length, truncation_side)
    # (a list first: a runtime Protocol check costs microseconds)
    if not isinstance(sequences, list | tuple) and isinstance(sequences, PackedSequences):
        return pad_packed_with(sequences.values, sequences.offsets, sequences.host_offsets, options)
    return pad_with(as_list(sequences), options)


def pad_packed(
    values: Tensor,
    offsets: Tensor,
    *,
    lengths: Sequence[int] | None = None,
    pad_value: PadValue = 0,
    padding_side: Side = "right",
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
    truncation_side: Side = "right",
) -> Padded:
    """Pads packed ``values`` ``[N, *feat]`` split by ``offsets`` ``[B+1]`` int64 (leading 0,
    non-decreasing, last equal to N) into ``[B, L, *feat]``; one kernel launch on CUDA.

    ``lengths``: the B lengths on the host, if the caller knows them (a
    :class:`~torchfeed.RaggedBatch` does). Without them, the offsets are read to the host,
    which synchronizes a CUDA device.
    """
    options = PadOptions(pad_value, padding_side, pad_to_multiple_of, max_length, truncation_side)
    host_offsets = check_host_offsets(values, offsets, lengths)
    return pad_packed_with(values, offsets, host_offsets, options)


@torch.library.register_fake("torchfeed::pad_packed")
def _pad_packed_fake(
    values, offsets, length, pad_value=0, left_pad=False, max_length=-1, truncate_left=False
):
    batch = offsets.shape[0] - 1
    return (
        values.new_empty((batch, length, *values.shape[1:])),
        values.new_empty((batch, length), dtype=torch.bool),
        values.new_empty((batch,), dtype=torch.int64),
    )


@torch.library.register_fake("torchfeed::pad_list")
def _pad_list_fake(
    sequences, length, pad_value=0, left_pad=False, max_length=-1, truncate_left=False, multiple=1
):
    for i, s in enumerate(sequences):  # a mix with meta tensors dispatches here
        if s.device != sequences[0].device:
            raise ValueError(
                f"pad_list: sequences[{i}] is on {s.device} but sequences[0] is on "
                f"{sequences[0].device} (all sequences must share one device)"
            )
    if length == -1:
        limit = None if max_length < 0 else max_length
        length = padded_length([s.shape[0] for s in sequences], limit, multiple)
    first = sequences[0]
    batch = len(sequences)
    return (
        first.new_empty((batch, length, *first.shape[1:])),
        first.new_empty((batch, length), dtype=torch.bool),
        first.new_empty((batch,), dtype=torch.int64),
    )


# Autograd: csrc/ops/autograd/pad.cpp (the gradient is the reverse gather of the copy).

read_kernels("pad_list", "pad_packed")
