"""PadCollate: a ``collate_fn`` for batches of dicts or tuples that mix ragged and fixed fields."""

from __future__ import annotations

import copy
import numbers
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from torch import Tensor

from torchfeed._options import check_bool
from torchfeed.collate._fields import (
    LABEL_FIELDS,
    LABEL_PAD,
    as_sequences,
    collate_field,
    is_sequence,
    leave_worker,
)
from torchfeed.collate._tokenizer import FlatteningCollate, TokenizerCollate
from torchfeed.memory import SharedRing
from torchfeed.ops._pad import PadOptions, PadValue, Side, pad_with
from torchfeed.ragged import RaggedBatch

__all__ = ["PadCollate"]

TOKENIZER_MASK = "attention_mask"  # the field a tokenizer's output has and other samples rarely do

Key = Hashable


class PadCollate:
    """Collates a list of samples into a batch, padding the ragged fields in one pass each.

    Samples are dicts (keys are field names), tuples/lists (keys are positions), or bare
    tensors (all ragged). A ragged field's values are tensors ``[n_i, *feat]``, numpy arrays or
    lists of numbers (what a tokenizer returns). Which fields are ragged:

    - ``ragged=None`` (the default, as ``default_collate`` is called with no arguments): every
      field whose values are sequences, decided from what the field is, never from one batch's
      lengths: lists or tuples of numbers, and 1-D tensors or arrays. A field of such values is
      padded, with its mask, in every batch, even one whose lengths happen to be equal. Fields
      named ``labels``, ``label_ids`` or ``label`` are padded with -100 (what the losses
      ignore), the others with ``pad_value``. On a tokenizer's output (samples with an
      ``attention_mask``) it warns once that the masks and lengths it adds are keys a model's
      forward refuses: :meth:`from_tokenizer` gives ``DataCollatorWithPadding``'s batch.
    - ``ragged`` given: exactly those fields, each with its own pad value
      (``ragged={"input_ids": 0, "labels": -100}``, or a list of names that all use
      ``pad_value``).

    A ragged field becomes ``[B, L, *feat]``; for dict samples its mask goes under
    ``masks[name]`` (default ``f"{name}_mask"``, ``None`` to leave it out) and its lengths under
    ``lengths[name]`` (default ``f"{name}_lengths"``). For tuple samples the field becomes a
    :class:`~torchfeed.Padded` ``(padded, mask, lengths)``. With ``packed=True`` it becomes a
    :class:`~torchfeed.RaggedBatch` instead, with no padding at all. Every other field:

    - tensors and numpy arrays: stacked (as ``default_collate`` does); shapes must agree.
    - numbers: to a tensor (bool, int64, float64, like ``default_collate``).
    - strings and any other object: kept as a list.

    Padding options (``padding_side``, ``pad_to_multiple_of``, ``max_length``,
    ``truncation_side``) apply to every ragged field. Picklable, so it runs in DataLoader
    workers. :meth:`from_tokenizer` gives the collate of a Hugging Face tokenizer's outputs.

    In an ordinary DataLoader's workers, ``recycle=True`` (the default) writes each batch of
    dict, tuple, list or namedtuple samples (or of bare tensors, unless ``packed``) into shared
    memory each worker reuses, batch after batch, instead of a fresh shared-memory file per
    tensor: the main process gets a plain dict (tuple, list, namedtuple) whose tensors view that
    memory, which goes back to the worker once they are freed (as
    :class:`~torchfeed.ImageCollate` does). The fields it does not pad (labels, an image beside
    the tokens, nested dicts) are stacked straight into that memory, never in memory of their
    own first. When the consumer keeps many batches, or the batch is changed in the worker after
    this collate, it takes the ordinary path; ``recycle=False`` always does.
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
        recycle: bool = True,
        shared_ring: SharedRing | None = None,
    ) -> None:
        # a torchfeed.SharedRing: inside DataLoader workers, batches are collated into it
        self.shared_ring = shared_ring
        check_bool("recycle", recycle)
        self.recycle = recycle
        self.auto = ragged is None  # the ragged fields found from what each field is
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
        self._given_masks = self._check_names("masks", masks)
        self._given_lengths = self._check_names("lengths", lengths)
        self.masks = self._names(self.ragged, self._given_masks, "_mask")
        self.lengths = self._names(self.ragged, self._given_lengths, "_lengths")
        check_bool("packed", packed)
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
        self._warned_tokenizer = False
        self.padding_side: Side = padding_side or "right"
        self.truncation_side: Side = truncation_side or "right"
        self.pad_to_multiple_of = pad_to_multiple_of
        self.max_length = max_length
        # One options value per pad value, validated once (here, or for a pad value first met in
        # a batch, then kept).
        self._options: dict[Any, PadOptions] = {}
        for value in [*self.ragged.values(), pad_value, LABEL_PAD]:
            self._options_for(value)

    @classmethod
    def from_tokenizer(
        cls,
        tokenizer: Any,
        *,
        pad_to_multiple_of: int | None = None,
        label_pad: int = LABEL_PAD,
        packed: bool = False,
        flash_attn_kwargs: bool = True,
        recycle: bool = True,
    ) -> TokenizerCollate | FlatteningCollate:
        """The collate of a Hugging Face tokenizer's outputs (duck-typed: ``pad_token_id``,
        ``padding_side``, ``pad_token_type_id``, ``model_input_names``), with transformers'
        keys, dtypes, padding and masks:

        - ``packed=False``: ``DataCollatorWithPadding`` (``input_ids`` padded with the pad token,
          ``attention_mask``, ``token_type_ids``, ``special_tokens_mask``, ``label`` renamed
          ``labels``), and sequence labels padded with ``label_pad`` as
          ``DataCollatorForSeq2Seq`` pads them (:class:`TokenizerCollate`);
        - ``packed=True``: ``DataCollatorWithFlattening`` (one ``[1, T]`` row of the samples'
          tokens, ``position_ids`` restarting at 0, ``labels`` with -100 at each sample's first
          token; ``cu_seq_lens_q/k`` and ``max_length_q/k`` with ``flash_attn_kwargs``)
          (:class:`FlatteningCollate`).

        ``recycle``: in an ordinary DataLoader's workers, each batch is written into shared
        memory the worker reuses, as :class:`PadCollate` does.
        """
        check_bool("packed", packed)
        if packed:
            if pad_to_multiple_of is not None:
                raise ValueError("pad_to_multiple_of has no effect with packed=True (no padding)")
            return FlatteningCollate(tokenizer, label_pad, flash_attn_kwargs, recycle=recycle)
        return TokenizerCollate(tokenizer, pad_to_multiple_of, label_pad, recycle=recycle)

    def with_shared_ring(self, shared_ring: SharedRing | None) -> PadCollate:
        """A copy of this collate that packs its batches into ``shared_ring`` inside DataLoader
        workers (``None``: a copy that does not); this one is left as it is."""
        bound = copy.copy(self)
        bound.shared_ring = shared_ring
        return bound

    def _check_names(
        self, arg: str, given: Mapping[Key, str | None] | None
    ) -> dict[Key, str | None]:
        given = dict(given or {})
        if not self.auto:
            unknown = [k for k in given if k not in self.ragged]
            if unknown:
                raise ValueError(
                    f"{arg} names field(s) {unknown} that are not in ragged={list(self.ragged)}"
                )
        for key, name in given.items():
            if name is not None and not isinstance(name, str):
                raise TypeError(f"{arg}[{key!r}] must be a str or None, got {type(name).__name__}")
        return given

    @staticmethod
    def _names(fields: Any, given: dict[Key, str | None], suffix: str) -> dict[Key, str | None]:
        return {
            key: given.get(key, f"{key}{suffix}" if isinstance(key, str) else None)
            for key in fields
        }

    def _options_for(self, pad_value: PadValue) -> PadOptions:
        key = (type(pad_value), pad_value)
        options = self._options.get(key)
        if options is None:
            options = PadOptions(
                pad_value,
                self.padding_side,
                self.pad_to_multiple_of,
                self.max_length,
                self.truncation_side,
            )
            self._options[key] = options
        return options

    def _pad_value(self, key: Key | None) -> PadValue:
        if key in self.ragged:
            return self.ragged[key]
        return LABEL_PAD if self.auto and key in LABEL_FIELDS else self.pad_value

    def _ragged_keys(self, keys: Sequence[Key], values: Callable[[Key], list]) -> list[Key]:
        """The ragged fields of a batch: the given ones, or (auto) those whose values are
        sequences (sample 0's value decides; every sample must agree on the kind)."""
        if not self.auto:
            return [k for k in keys if k in self.ragged]
        return [k for k in keys if is_sequence(values(k)[0])]

    def __repr__(self) -> str:
        ragged = "auto" if self.auto else self.ragged
        return (
            f"PadCollate(ragged={ragged}, padding_side={self.padding_side!r}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of}, max_length={self.max_length}, "
            f"truncation_side={self.truncation_side!r}, packed={self.packed})"
        )

    def __call__(self, batch: Sequence[Any]) -> Any:
        return leave_worker(lambda lazy: self._collate(batch, lazy), self.shared_ring, self.recycle)

    def _collate(self, batch: Sequence[Any], lazy: bool) -> Any:
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
            return self._collate_dicts(batch, lazy)
        if isinstance(first, tuple | list):
            self._check_kinds(batch, tuple | list, "a tuple or list")
            return self._collate_tuples(batch, lazy)
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

    def _collate_dicts(self, batch: Sequence[Mapping], lazy: bool) -> dict:
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
        ragged = set(self._ragged_keys(keys, lambda k: [s[k] for s in batch]))
        if self.auto and not self._warned_tokenizer and TOKENIZER_MASK in ragged:
            self._warn_tokenizer_output(ragged, key_set)
        masks = self.masks if not self.auto else self._names(ragged, self._given_masks, "_mask")
        lengths = (
            self.lengths if not self.auto else self._names(ragged, self._given_lengths, "_lengths")
        )
        out: dict = {}
        for key in keys:
            values = [sample[key] for sample in batch]
            if key not in ragged:
                out[key] = collate_field(key, values, lazy)
                continue
            result = self._ragged_field(key, values)
            if self.packed:
                out[key] = result
                continue
            out[key] = result.padded
            for extra_name, tensor in ((masks[key], result.mask), (lengths[key], result.lengths)):
                if extra_name is None:
                    continue
                if extra_name in key_set or extra_name in out:
                    raise ValueError(
                        f"PadCollate: the output name {extra_name!r} for field {key!r} collides "
                        "with another field; choose another with masks=/lengths="
                    )
                out[extra_name] = tensor
        return out

    def _warn_tokenizer_output(self, ragged: set[Key], keys: set[Key]) -> None:
        """Once: samples with a tokenizer's ``attention_mask`` met in auto mode, which gives
        every list field a mask and lengths of its own, keys a model's forward refuses."""
        self._warned_tokenizer = True
        if self._given_masks or self._given_lengths:
            return  # the user chose the output's names
        added = [
            f"{k}{suffix}" for k in sorted(map(str, ragged)) for suffix in ("_mask", "_lengths")
        ]
        label = [k for k in ("label", "label_ids") if k in keys]
        warnings.warn(
            "PadCollate(): these samples look like a tokenizer's output (they have an "
            f"{TOKENIZER_MASK!r} field). With no arguments every list field gets a mask and "
            f"lengths of its own, so the batch also has {added}, keys that model(**batch) "
            "refuses"
            + (
                f", and {label[0]!r} stays as it is (a model's forward takes 'labels')"
                if label
                else ""
            )
            + ". PadCollate.from_tokenizer(tokenizer) gives what transformers' "
            "DataCollatorWithPadding gives (its keys, the tokenizer's pad id and padding side); "
            "or name the fields, ragged={'input_ids': pad_id, 'attention_mask': 0} with "
            "masks=/lengths= (None leaves one out), for exactly the keys you want and no warning",
            UserWarning,
            stacklevel=7,  # the caller of PadCollate(): 6 frames up (leave_worker's 2 among them)
        )

    def _collate_tuples(self, batch: Sequence[Sequence], lazy: bool) -> Any:
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
        ragged = set(self._ragged_keys(range(width), lambda j: [s[j] for s in batch]))  # type: ignore[call-overload]
        fields = []
        for j in range(width):
            values = [sample[j] for sample in batch]
            if j in ragged:
                fields.append(self._ragged_field(j, values))
            else:
                fields.append(collate_field(j, values, lazy))
        sample = batch[0]
        if isinstance(sample, tuple) and hasattr(sample, "_fields"):  # namedtuple
            return type(sample)(*fields)
        return type(sample)(fields) if isinstance(sample, tuple) else fields

    def _ragged_field(self, key: Key | None, values: list):
        values = as_sequences(key, values)
        if self.packed:
            batch = RaggedBatch.from_sequences(values)
            if self.max_length is not None:
                batch = batch.truncate(self.max_length, self.truncation_side)
            return batch
        try:
            return pad_with(values, self._options_for(self._pad_value(key)))
        except (TypeError, ValueError) as e:  # the op's words, with the field they are about
            field = "" if key is None else f"field {key!r}: "
            raise type(e)(f"PadCollate: {field}{e}") from None
