"""PadCollate: a ``collate_fn`` for batches of dicts or tuples that mix ragged and fixed fields."""

from __future__ import annotations

import numbers
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import default_collate, get_worker_info

from torchfeed.images import private_collate
from torchfeed.padding import (
    PadValue,
    Side,
    check_length_options,
    check_pad_value,
    check_side,
    pad,
)
from torchfeed.ragged import RaggedBatch

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
        ring: Any = None,
    ) -> None:
        self.ring = ring  # a torchfeed.shared.SharedRing: workers collate into it (zero copy)
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
        check_side("padding_side", self.padding_side)
        check_side("truncation_side", self.truncation_side)
        check_length_options(pad_to_multiple_of, max_length)
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_length = max_length

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

    # --- collation ----------------------------------------------------------------------------
    def __call__(self, batch: Sequence[Any]) -> Any:
        if self.ring is not None and get_worker_info() is not None:
            self._private = True  # fixed fields in private memory: the ring replaces shm
            try:
                return self.ring.pack(self._collate(batch))
            finally:
                self._private = False
        return self._collate(batch)

    _private = False

    def _collate(self, batch: Sequence[Any]) -> Any:
        if not isinstance(batch, Sequence) or isinstance(batch, str | bytes):
            raise TypeError(
                f"PadCollate: batch must be a list of samples, got {type(batch).__name__}"
            )
        if len(batch) == 0:
            raise ValueError("PadCollate: batch is empty (a DataLoader never passes one)")
        first = batch[0]
        if isinstance(first, Tensor):
            self._check_kinds(batch, Tensor, "a tensor")
            return self._ragged_field(None, list(batch), self.pad_value)
        if isinstance(first, Mapping):
            self._check_kinds(batch, Mapping, "a dict")
            return self._collate_dicts(batch)
        if isinstance(first, tuple | list):
            self._check_kinds(batch, tuple | list, "a tuple or list")
            return self._collate_tuples(batch)
        raise TypeError(
            "PadCollate: samples must be dicts, tuples/lists or tensors, got "
            f"{type(first).__name__}"
        )

    @staticmethod
    def _check_kinds(batch: Sequence[Any], kind: type, what: str) -> None:
        for i, sample in enumerate(batch):
            if not isinstance(sample, kind):
                raise TypeError(
                    f"PadCollate: sample 0 is {what} but sample {i} is {type(sample).__name__}"
                )

    def _collate_dicts(self, batch: Sequence[Mapping]) -> dict:
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
                out[key] = self._fixed_field(key, values, self._private)
                continue
            result = self._ragged_field(key, values, self.ragged[key])
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

    def _collate_tuples(self, batch: Sequence[Sequence]) -> Any:
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
                fields.append(self._ragged_field(j, values, self.ragged[j]))
            else:
                fields.append(self._fixed_field(j, values, self._private))
        sample = batch[0]
        if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # namedtuple
            return type(sample)(*fields)
        return type(sample)(fields) if isinstance(sample, tuple) else fields

    def _ragged_field(self, key: Key | None, values: list, pad_value: PadValue):
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
            check_pad_value(pad_value, values[0].dtype)
        except ValueError as e:
            raise ValueError(f"PadCollate: {where}{e}") from None
        return pad(
            values,
            pad_value=pad_value,
            padding_side=self.padding_side,
            pad_to_multiple_of=self.pad_to_multiple_of,
            max_length=self.max_length,
            truncation_side=self.truncation_side,
        )

    @staticmethod
    def _fixed_field(key: Key, values: list, private: bool = False) -> Any:
        first = values[0]
        if isinstance(first, Tensor | np.ndarray):
            tensors = []
            for i, v in enumerate(values):
                if not isinstance(v, Tensor | np.ndarray):
                    raise TypeError(
                        f"PadCollate: field {key!r} is a tensor in sample 0 but a "
                        f"{type(v).__name__} in sample {i}"
                    )
                t = torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                ref = tensors[0] if tensors else t
                if t.shape != ref.shape:
                    raise ValueError(
                        f"PadCollate: field {key!r} has shape {list(ref.shape)} in sample 0 but "
                        f"{list(t.shape)} in sample {i}; name it in ragged= to pad it"
                    )
                if t.dtype != ref.dtype or t.device != ref.device:
                    raise TypeError(
                        f"PadCollate: field {key!r} is {ref.dtype} on {ref.device} in sample 0 "
                        f"but {t.dtype} on {t.device} in sample {i}"
                    )
                tensors.append(t)
            # default_collate stacks straight into shared memory inside a worker process.
            return torch.stack(tensors) if private else default_collate(tensors)
        if isinstance(first, bool | int | float | np.number | np.bool_):
            if all(isinstance(v, bool | int | float | np.number | np.bool_) for v in values):
                return private_collate(values) if private else default_collate(values)
            return list(values)
        if isinstance(first, Mapping | tuple | list) and not isinstance(first, str):
            return default_collate(values)
        return list(values)
