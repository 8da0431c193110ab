"""The pad op's plumbing: its options value (validated once, where options enter), the checks
of the paths that run no kernel of ours, and the call of the compiled kernel or its fallback
(:mod:`torchfeed.reference`). The public face is :mod:`torchfeed.ops.pad`."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from torchfeed import reference
from torchfeed.ops._dispatch import has_kernel, warn_fallback

__all__ = [
    "PackedSequences",
    "PadOptions",
    "PadValue",
    "Padded",
    "Side",
    "as_list",
    "check_host_offsets",
    "check_sequences",
    "pad_packed_with",
    "pad_with",
    "padded_length",
    "parse_side",
]

Side = Literal["right", "left"]
PadValue = bool | int | float


class Padded(NamedTuple):
    """A padded batch: ``padded`` ``[B, L, *feat]``, ``mask`` ``[B, L]`` bool (True on real
    elements), ``lengths`` ``[B]`` int64 (after truncation)."""

    padded: Tensor
    mask: Tensor
    lengths: Tensor


def parse_side(name: str, value: str) -> bool:
    """A ``"right"``/``"left"`` option: True for left."""
    if value not in ("right", "left"):
        raise ValueError(f"{name} must be 'right' or 'left', got {value!r}")
    return value == "left"


def _check_length_option(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")


def _check_number(name: str, value: object) -> None:
    if isinstance(value, Tensor) or not isinstance(value, bool | int | float):
        raise TypeError(f"{name} must be a Python number (bool, int or float), got {value!r}")
    if isinstance(value, int) and not -(1 << 63) <= value < 1 << 64:
        raise ValueError(f"{name}={value} is not representable in any integer dtype")


@dataclass(frozen=True)
class PadOptions:
    """How ragged sequences are padded, validated once, where they enter: ``pad_value`` (a
    number; whether the values' dtype holds it exactly is the kernel's check, per call),
    ``padding_side`` (pads after ``"right"`` or before ``"left"`` the real elements),
    ``pad_to_multiple_of`` (round the padded length up), ``max_length`` (truncate longer
    sequences) and ``truncation_side`` (which end of a long sequence is dropped)."""

    pad_value: PadValue = 0
    padding_side: Side = "right"
    pad_to_multiple_of: int | None = None
    max_length: int | None = None
    truncation_side: Side = "right"

    def __post_init__(self) -> None:
        _check_number("pad_value", self.pad_value)
        parse_side("padding_side", self.padding_side)
        parse_side("truncation_side", self.truncation_side)
        _check_length_option("pad_to_multiple_of", self.pad_to_multiple_of)
        _check_length_option("max_length", self.max_length)

    @property
    def left_pad(self) -> bool:
        return self.padding_side == "left"

    @property
    def truncate_left(self) -> bool:
        return self.truncation_side == "left"

    def length(self, lengths: Iterable[int]) -> int:
        """L for sequences of these lengths (see :func:`padded_length`)."""
        return padded_length(lengths, self.max_length, self.pad_to_multiple_of)


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
        longest = -(-longest // pad_to_multiple_of) * pad_to_multiple_of  # ints (SymInts) only
    return longest


def as_list(sequences: Sequence[Tensor]) -> list[Tensor]:
    if isinstance(sequences, Tensor) or not isinstance(sequences, Sequence):
        raise TypeError(
            "sequences must be a list of tensors [n_i, *feat], got "
            f"{type(sequences).__name__}; for one packed tensor use "
            "torchfeed.pad_packed(values, offsets) or torchfeed.RaggedBatch"
        )
    return list(sequences)


def _check_tensors(seqs: Sequence[Any]) -> None:
    """What the dispatcher cannot say well: an element that is not a tensor."""
    for i, s in enumerate(seqs):
        if not isinstance(s, Tensor):
            raise TypeError(f"sequences[{i}] must be a tensor, got {type(s).__name__}")


def check_sequences(seqs: Sequence[Any]) -> None:
    """The kernels' checks of a list of sequences (``csrc/ops/pad_args.h``: at least one tensor
    ``[n_i, *feat]``, one dtype, one device, the same trailing dims), in the same words, for the
    paths that run no kernel of ours: the reference fallback and packing with ``torch.cat``."""
    if not seqs:
        raise ValueError("sequences must hold at least one tensor, got none")
    _check_tensors(seqs)
    first = seqs[0]
    for i, s in enumerate(seqs):
        if s.dim() == 0:
            raise ValueError(
                f"sequences[{i}] must have at least one dimension ([n, *feat]), got a 0-d tensor"
            )
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


def _check_pad_value_on_host(pad_value: PadValue, dtype: torch.dtype) -> None:
    """The kernels' pad value check (exactly representable in ``dtype``) for the reference path,
    which no kernel of ours sees: the CPU kernel run on an empty batch of that dtype, so the
    check has one implementation and one wording."""
    torch.ops.torchfeed.pad_list([torch.empty(0, dtype=dtype)], 0, pad_value)


def check_host_offsets(
    values: Tensor, offsets: Tensor, lengths: Sequence[int] | None
) -> tuple[int, ...]:
    """Packed ``values`` ``[N, *feat]`` and ``offsets`` ``[B+1]`` int64: the offsets on the
    host, from ``lengths`` when given (no device read), else read back (which synchronizes a
    CUDA device). The host needs them to size the output; these checks are the kernels' own
    (``check_packed``, ``check_offsets_values``) in the same words, for offsets that a CUDA
    kernel cannot read without a sync."""
    if not isinstance(values, Tensor):
        raise TypeError(f"values must be a tensor [N, *feat], got {type(values).__name__}")
    if not isinstance(offsets, Tensor):
        raise TypeError(f"offsets must be an int64 tensor [B+1], got {type(offsets).__name__}")
    if values.dim() < 1:
        raise ValueError("values must have at least one dimension ([N, *feat]), got a 0-d tensor")
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
    if host[0] != 0:
        raise ValueError(f"offsets[0] must be 0, got {host[0]}")
    for i in range(1, len(host)):
        if host[i] < host[i - 1]:
            raise ValueError(
                f"offsets must be non-decreasing, got offsets[{i - 1}]={host[i - 1]} > "
                f"offsets[{i}]={host[i]}"
            )
    if host[-1] != values.shape[0]:
        raise ValueError(
            f"offsets[-1] must equal values.shape[0]={values.shape[0]}, got {host[-1]}"
        )
    return tuple(host)


@runtime_checkable
class PackedSequences(Protocol):
    """What :func:`pad` accepts besides a list: packed ``values`` and ``offsets`` with their
    offsets on the host (:class:`torchfeed.RaggedBatch`)."""

    values: Tensor
    offsets: Tensor

    @property
    def host_offsets(self) -> tuple[int, ...]: ...


def pad_with(seqs: list[Tensor], options: PadOptions) -> Padded:
    """:func:`pad` of a list with options validated already. The compiled kernel checks the
    sequences and the pad value itself (its messages name the argument and the value)."""
    if not seqs:  # the dispatcher has no tensor to dispatch on, and says nothing useful
        raise ValueError("sequences must hold at least one tensor, got none")
    first = seqs[0]
    device_type = first.device.type if isinstance(first, Tensor) else "cpu"
    max_length = options.max_length
    if not has_kernel("pad_list", device_type):
        check_sequences(seqs)
        _check_pad_value_on_host(options.pad_value, seqs[0].dtype)
        warn_fallback("pad", device_type, "using the PyTorch reference")
        length = options.length(s.shape[0] for s in seqs)
        out = reference.pad_sequences(
            seqs, length, options.pad_value, options.left_pad, max_length, options.truncate_left
        )
        return Padded(*out)
    try:
        out = torch.ops.torchfeed.pad_list(
            seqs,
            -1,  # the kernel finds the longest length (a loop over shapes, in C++)
            options.pad_value,
            options.left_pad,
            -1 if max_length is None else max_length,
            options.truncate_left,
            options.pad_to_multiple_of or 1,
        )
    except RuntimeError:  # the dispatcher's words for a non-tensor element: say which one
        _check_tensors(seqs)
        raise
    return Padded(*out)


def pad_packed_with(
    values: Tensor, offsets: Tensor, host_offsets: Sequence[int], options: PadOptions
) -> Padded:
    """:func:`pad_packed` with the offsets on the host checked already
    (:func:`check_host_offsets`)."""
    length = options.length(b - a for a, b in itertools.pairwise(host_offsets))
    device_type = values.device.type
    max_length = options.max_length
    if has_kernel("pad_packed", device_type):
        out = torch.ops.torchfeed.pad_packed(
            values,
            offsets,
            length,
            options.pad_value,
            options.left_pad,
            -1 if max_length is None else max_length,
            options.truncate_left,
        )
    else:
        _check_pad_value_on_host(options.pad_value, values.dtype)
        warn_fallback("pad_packed", device_type, "using the PyTorch reference")
        out = reference.pad_packed(
            values,
            host_offsets,
            length,
            options.pad_value,
            options.left_pad,
            max_length,
            options.truncate_left,
        )
    return Padded(*out)
