"""PadCollate: a ``collate_fn`` for batches of dicts or tuples that mix ragged and fixed fields."""

from __future__ import annotations

import copy
import numbers
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import get_worker_info

from torchfeed.collate._fields import collate_field
from torchfeed.memory import SharedRing
from torchfeed.ops._pad import PadOptions, PadValue, Side, pad_with
from torchfeed.ragged import RaggedBatch

__all__ = ["PadCollate"]

Key = Hashable


class PadCollate:
    """Collates a list of samples into a batch, padding the ragged fields in one pass each.

    Samples are dicts (keys are field names), tuples/lists (keys are positions), or bare
    tensors (all ragged). Per field:

    - a field named in ``ragged`` (tensors ``[n_i, *feat]``): padded to ``[B, L, *feat]`` with
      its own pad value (``ragged={"input_ids": 0, "labels": -100}``, or a list of names that
      all use ``pad_value``); for dict samples its mask goes under ``masks[name]`` (default
      ``f"{name}_mask"``, ``None`` to leave it out) and its lengths under ``lengths[name]``
      (default ``f"{name}_lengths"``). For tuple samples the field becomes a
      :class:`~torchfeed.Padded` ``(padded, mask, lengths)``. With ``packed=True`` it becomes a
      :class:`~torchfeed.RaggedBatch` instead, with no padding at all.
    - other tensors and numpy arrays: stacked (as ``default_collate`` does); shapes must agree.
    - numbers: to a tensor (bool, int64, float64, like ``default_collate``).
    - strings and any other object: kept as a list.

    Padding options (``padding_side``, ``pad_to_multiple_of``, ``max_length``,
    ``truncation_side``) apply to every ragged field. Picklable, so it runs in DataLoader
    workers.
    """

    def __init__(
        self,
        ragged: Mapping[Key, PadValue] | Sequence[Key] | None = None,
        *,
        pad_value: PadValue = 0,
        masks: Mapping[Key, str | None] | None = None,
        lengths: Mapping[Key, str | None] | None = None,
        padding_side: Side | None = None,
        pad_to_multiple_of: int | None = None,
        max_length: int | None = None,
        truncation_side: Side | None = None,
        packed: bool = False,
        shared_ring: SharedRing | None = None,
    ) -> None:
        # a torchfeed.SharedRing: inside DataLoader workers, batches are collated into it
        self.shared_ring = shared_ring
        if ragged is None:
            self.ragged: dict[Key, PadValue] = {}
        elif isinstance(ragged, Mapping):
            self.ragged = dict(ragged)
        elif isinstance(ragged, str | bytes) or not isinstance(ragged, Sequence):
            raise TypeError(
                "ragged must be a mapping {field: pad_value} or a list of field names, got "
                f"{type(ragged).__name__}"
            )
        else:
            self.ragged = dict.fromkeys(ragged, pad_value)
        for key, value in self.ragged.items():
            if isinstance(value, Tensor) or not isinstance(value, numbers.Number):
                raise TypeError(
                    f"ragged[{key!r}]: the pad value must be a number, got {type(value).__name__}"
                )
        if isinstance(pad_value, Tensor) or not isinstance(pad_value, numbers.Number):
            raise TypeError(f"pad_value must be a number, got {type(pad_value).__name__}")
        self.pad_value = pad_value
        self.masks = self._names("masks", masks, "_mask")
        self.lengths = self._names("lengths", lengths, "_lengths")
        if not isinstance(packed, bool):
            raise TypeError(f"packed must be a bool, got {type(packed).__name__}")
        if packed:
            given = [
                name
                for name, value in (
                    ("padding_side", padding_side),
                    ("pad_to_multiple_of", pad_to_multiple_of),
                    ("masks", masks),
                )
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{', '.join(given)} has no effect with packed=True (a packed field is not "
                    "padded; pad it later with RaggedBatch.pad)"
                )
        self.packed = packed
        self.padding_side: Side = padding_side or "right"
        self.truncation_side: Side = truncation_side or "right"
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_length = max_length
        # One options value per ragged field (each has its own pad value; None: bare tensors),
        # validated here, once.
        self.options = {
            key: PadOptions(
                value, self.padding_side, pad_to_multiple_of, max_length, self.truncation_side
            )
            for key, value in [*self.ragged.items(), (None, pad_value)]
        }

    def with_shared_ring(self, shared_ring: SharedRing | None) -> PadCollate:
        """A copy of this collate that packs its batches into ``shared_ring`` inside DataLoader
        workers (``None``: a copy that does not); this one is left as it is."""
        bound = copy.copy(self)
        bound.shared_ring = shared_ring
        return bound

    def _names(self, arg: str, given: Mapping[Key, str | None] | None, suffix: str):
        given = dict(given or {})
        unknown = [k for k in given if k not in self.ragged]
        if unknown:
            raise ValueError(
                f"{arg} names field(s) {unknown} that are not in ragged={list(self.ragged)}"
            )
        names = {}
        for key in self.ragged:
            name = given.get(key, f"{key}{suffix}" if isinstance(key, str) else None)
            if name is not None and not isinstance(name, str):
                raise TypeError(f"{arg}[{key!r}] must be a str or None, got {type(name).__name__}")
            names[key] = name
        return names

    def __repr__(self) -> str:
        return (
            f"PadCollate(ragged={self.ragged}, padding_side={self.padding_side!r}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of}, max_length={self.max_length}, "
            f"truncation_side={self.truncation_side!r}, packed={self.packed})"
        )

    def __call__(self, batch: Sequence[Any]) -> Any:
        if self.shared_ring is not None and get_worker_info() is not None:
            # fixed fields in private memory: the ring replaces the worker's shared memory
            return self.shared_ring.pack(self._collate(batch, private=True))
        return self._collate(batch, private=False)

    def _collate(self, batch: Sequence[Any], private: bool) -> Any:
        if not isinstance(batch, Sequence) or isinstance(batch, str | bytes):
            raise TypeError(
                f"PadCollate: batch must be a list of samples, got {type(batch).__name__}"
            )
        if len(batch) == 0:
            raise ValueError("PadCollate: batch is empty (a DataLoader never passes one)")
        first = batch[0]
        if isinstance(first, Tensor):
            self._check_kinds(batch, Tensor, "a tensor")
            return self._ragged_field(None, list(batch))
        if isinstance(first, Mapping):
            self._check_kinds(batch, Mapping, "a dict")
            return self._collate_dicts(batch, private)
        if isinstance(first, tuple | list):
            self._check_kinds(batch, tuple | list, "a tuple or list")
            return self._collate_tuples(batch, private)
        raise TypeError(
            "PadCollate: samples must be dicts, tuples/lists or tensors, got "
            f"{type(first).__name__}"
        )

    @staticmethod
    def _check_kinds(batch: Sequence[Any], kind: Any, what: str) -> None:
        for i, sample in enumerate(batch):
            if not isinstance(sample, kind):
                raise TypeError(
                    f"PadCollate: sample 0 is {what} but sample {i} is {type(sample).__name__}"
                )

    def _collate_dicts(self, batch: Sequence[Mapping], private: bool) -> dict:
        keys = list(batch[0].keys())
        key_set = set(keys)
        for i, sample in enumerate(batch):
            if sample.keys() != key_set:
                missing = sorted(map(str, key_set - sample.keys()))
                extra = sorted(map(str, sample.keys() - key_set))
                raise ValueError(
                    f"PadCollate: sample {i} has different fields from sample 0 "
                    f"(missing {missing}, extra {extra})"
                )
        absent = [k for k in self.ragged if k not in key_set]
        if absent:
            raise ValueError(f"PadCollate: ragged field(s) {absent} are not in the samples {keys}")
        out: dict = {}
        for key in keys:
            values = [sample[key] for sample in batch]
            if key not in self.ragged:
                out[key] = collate_field(key, values, private)
                continue
            result = self._ragged_field(key, values)
            if self.packed:
                out[key] = result
                continue
            out[key] = result.padded
            for extra_name, tensor in (
                (self.masks[key], result.mask),
                (self.lengths[key], result.lengths),
            ):
                if extra_name is None:
                    continue
                if extra_name in key_set or extra_name in out:
                    raise ValueError(
                        f"PadCollate: the output name {extra_name!r} for field {key!r} collides "
                        "with another field; choose another with masks=/lengths="
                    )
                out[extra_name] = tensor
        return out

    def _collate_tuples(self, batch: Sequence[Sequence], private: bool) -> Any:
        width = len(batch[0])
        for i, sample in enumerate(batch):
            if len(sample) != width:
                raise ValueError(
                    f"PadCollate: sample {i} has {len(sample)} fields but sample 0 has {width}"
                )
        bad = [k for k in self.ragged if not isinstance(k, int) or not 0 <= k < width]
        if bad:
            raise ValueError(
                f"PadCollate: ragged positions {bad} do not exist in samples of {width} fields"
            )
        fields = []
        for j in range(width):
            values = [sample[j] for sample in batch]
            if j in self.ragged:
                fields.append(self._ragged_field(j, values))
            else:
                fields.append(collate_field(j, values, private))
        sample = batch[0]
        if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # namedtuple
            return type(sample)(*fields)
        return type(sample)(fields) if isinstance(sample, tuple) else fields

    def _ragged_field(self, key: Key | None, values: list):
        where = "" if key is None else f"field {key!r} of "
        for i, v in enumerate(values):
            if isinstance(v, np.ndarray):
                values[i] = torch.from_numpy(v)
            elif not isinstance(v, Tensor):
                raise TypeError(
                    f"PadCollate: {where}sample {i} is a {type(v).__name__}, expected a tensor "
                    "(or numpy array) for a ragged field; convert it in the dataset"
                )
        if self.packed:
            batch = RaggedBatch.from_sequences(values)
            if self.max_length is not None:
                batch = batch.truncate(self.max_length, self.truncation_side)
            return batch
        try:
            return pad_with(values, self.options[key])
        except (TypeError, ValueError) as e:  # the op's words, with the field they are about
            field = "" if key is None else f"field {key!r}: "
            raise type(e)(f"PadCollate: {field}{e}") from None
