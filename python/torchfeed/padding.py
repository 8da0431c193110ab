"""Fused pad-and-mask: ragged sequences to a padded batch, its mask and its lengths.

The mask comes from the lengths, never from ``tokens != pad_id``: real data contains the pad
id. The padded length is computed here on the host, where the lengths are known, and passed to
the op, so the output shape never depends on device data (no sync, no graph break).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from torchfeed import reference

Side = Literal["right", "left"]
PadValue = bool | int | float


class Padded(NamedTuple):
    """A padded batch: ``padded`` ``[B, L, *feat]``, ``mask`` ``[B, L]`` bool (True on real
    elements), ``lengths`` ``[B]`` int64 (after truncation)."""

    padded: Tensor
    mask: Tensor
    lengths: Tensor


def check_side(name: str, value: str) -> bool:
    """Validates a ``"right"``/``"left"`` option; returns True for left."""
    if value not in ("right", "left"):
        raise ValueError(f"{name} must be 'right' or 'left', got {value!r}")
    return value == "left"


def check_length_options(pad_to_multiple_of: int | None, max_length: int | None) -> None:
    for name, value in (("pad_to_multiple_of", pad_to_multiple_of), ("max_length", max_length)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def check_pad_value(pad_value: PadValue, dtype: torch.dtype, name: str = "pad_value") -> None:
    """Raises unless ``pad_value`` is exactly representable in ``dtype`` (nothing is rounded or
    wrapped silently)."""
    if isinstance(pad_value, Tensor) or not isinstance(pad_value, bool | int | float | complex):
        raise TypeError(f"{name} must be a Python number, got {type(pad_value).__name__}")
    if dtype.is_complex or dtype.is_floating_point:
        if isinstance(pad_value, complex) and not dtype.is_complex:
            raise ValueError(f"{name}={pad_value!r} is complex but the values are {dtype}")
        return
    if dtype == torch.bool:
        if pad_value not in (0, 1) or isinstance(pad_value, complex):
            raise ValueError(f"{name}={pad_value!r} is not representable in torch.bool")
        return
    integral = isinstance(pad_value, bool | int) or (
        isinstance(pad_value, float) and pad_value.is_integer()
    )
    info = torch.iinfo(dtype)
    if not integral or not info.min <= pad_value <= info.max:
        raise ValueError(
            f"{name}={pad_value!r} is not representable in {dtype} "
            f"(integers in [{info.min}, {info.max}])"
        )


def padded_length(
    lengths: Iterable[int], max_length: int | None, pad_to_multiple_of: int | None
) -> int:
    """L: the longest kept length, rounded up to ``pad_to_multiple_of``."""
    longest = 0
    for n in lengths:  # not max(..., default=0): dynamo before torch 2.12 cannot trace it
        longest = max(longest, n)
    if max_length is not None:
        longest = min(longest, max_length)
    if pad_to_multiple_of is not None:
        longest = math.ceil(longest / pad_to_multiple_of) * pad_to_multiple_of
    return longest


_warned: set[tuple[str, str]] = set()


def _has_kernel(op: str, device_type: str) -> bool:
    return _KERNELS.get((op, device_type), False)


def _warn_fallback(op: str, device_type: str) -> None:
    if (op, device_type) in _warned:
        return
    _warned.add((op, device_type))
    warnings.warn(
        f"torchfeed.{op}: no compiled kernel for {device_type} tensors in this build "
        f"(torchfeed.build_info() says what was built); using the PyTorch reference",
        RuntimeWarning,
        stacklevel=3,
    )


def _check_sequences(sequences: Sequence[Tensor]) -> list[Tensor]:
    if isinstance(sequences, Tensor):
        raise TypeError(
            "sequences must be a list of tensors [n_i, *feat]; for one packed tensor use "
            "torchfeed.pad_packed(values, offsets) or torchfeed.RaggedBatch"
        )
    seqs = list(sequences)
    if not seqs:
        raise ValueError("sequences must hold at least one tensor, got an empty list")
    for i, s in enumerate(seqs):
        if not isinstance(s, Tensor):
            raise TypeError(f"sequences[{i}] must be a tensor, got {type(s).__name__}")
    return seqs


def _check_consistent(seqs: list[Tensor]) -> None:
    """The checks the compiled kernels make, for the reference path (which would otherwise
    convert dtypes silently)."""
    first = seqs[0]
    for i, s in enumerate(seqs):
        if s.dtype != first.dtype:
            raise TypeError(
                f"sequences[{i}] has dtype {s.dtype} but sequences[0] has {first.dtype} "
                "(all sequences must share one dtype)"
            )
        if s.device != first.device:
            raise ValueError(
                f"sequences[{i}] is on {s.device} but sequences[0] is on {first.device} "
                "(all sequences must share one device)"
            )
        if s.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"sequences[{i}] has trailing dims {list(s.shape[1:])} but sequences[0] has "
                f"{list(first.shape[1:])} (only dim 0 may differ)"
            )


def pad(
    sequences: Sequence[Tensor],
    *,
    pad_value: PadValue = 0,
    padding_side: Side = "right",
    pad_to_multiple_of: int | None = None,
    max_length: int | None = None,
    truncation_side: Side = "right",
) -> Padded:
    """Pads a list of tensors ``[n_i, *feat]`` (one dtype, one device, any numeric or bool
    dtype) to ``[B, L, *feat]`` in one pass.

    ``L`` is the longest length after truncation to ``max_length``, rounded up to
    ``pad_to_multiple_of``. ``padding_side`` puts the pads after (``"right"``) or before
    (``"left"``) the real elements; ``truncation_side`` says which end of a sequence longer than
    ``max_length`` is dropped.
    """
    from torchfeed.ragged import RaggedBatch

    if isinstance(sequences, RaggedBatch):
        return sequences.pad(
            pad_value=pad_value,
            padding_side=padding_side,
            pad_to_multiple_of=pad_to_multiple_of,
            max_length=max_length,
            truncation_side=truncation_side,
        )
    seqs = _check_sequences(sequences)
    left_pad = check_side("padding_side", padding_side)
    truncate_left = check_side("truncation_side", truncation_side)
    check_length_options(pad_to_multiple_of, max_length)
    check_pad_value(pad_value, seqs[0].dtype)
    for i, s in enumerate(seqs):
        if s.dim() == 0:
            raise ValueError(f"sequences[{i}] must have at least one dimension, got a 0-d tensor")
    length = padded_length((s.shape[0] for s in seqs), max_length, pad_to_multiple_of)
    device_type = seqs[0].device.type
    if _has_kernel("pad_list", device_type):
        out = torch.ops.torchfeed.pad_list(
            seqs,
            length,
            pad_value,
            left_pad,
            -1 if max_length is None else max_length,
            truncate_left,
        )
    else:
        _warn_fallback("pad", device_type)
        _check_consistent(seqs)
        out = reference.pad_sequences(seqs, length, pad_value, left_pad, max_length, truncate_left)
    return Padded(*out)


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

    ``lengths``: the B lengths on the host, if the caller knows them (a :class:`RaggedBatch`
    does). Without them, the offsets are read to the host, which synchronizes a CUDA device.
    """
    from torchfeed.ragged import RaggedBatch

    return RaggedBatch(values, offsets, lengths).pad(
        pad_value=pad_value,
        padding_side=padding_side,
        pad_to_multiple_of=pad_to_multiple_of,
        max_length=max_length,
        truncation_side=truncation_side,
    )


def pad_packed_op(
    values: Tensor,
    offsets: Tensor,
    host_offsets: Sequence[int],
    length: int,
    pad_value: PadValue,
    left_pad: bool,
    max_length: int | None,
    truncate_left: bool,
) -> Padded:
    """Runs the packed op (or the reference where no kernel exists); arguments already checked."""
    device_type = values.device.type
    if _has_kernel("pad_packed", device_type):
        out = torch.ops.torchfeed.pad_packed(
            values,
            offsets,
            length,
            pad_value,
            left_pad,
            -1 if max_length is None else max_length,
            truncate_left,
        )
    else:
        _warn_fallback("pad_packed", device_type)
        out = reference.pad_packed(
            values, host_offsets, length, pad_value, left_pad, max_length, truncate_left
        )
    return Padded(*out)


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
    sequences, length, pad_value=0, left_pad=False, max_length=-1, truncate_left=False
):
    first = sequences[0]
    batch = len(sequences)
    return (
        first.new_empty((batch, length, *first.shape[1:])),
        first.new_empty((batch, length), dtype=torch.bool),
        first.new_empty((batch,), dtype=torch.int64),
    )


# Which (op, device type) pairs have a kernel (the fake ones above serve meta), read once: a
# plain dict lookup is something torch.compile can trace, a dispatcher query is not.
_KERNELS = {
    (op, device_type): torch._C._dispatch_has_kernel_for_dispatch_key(f"torchfeed::{op}", key)
    for op in ("pad_list", "pad_packed")
    for device_type, key in (("cpu", "CPU"), ("cuda", "CUDA"), ("meta", "Meta"))
}
