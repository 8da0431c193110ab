"""The collates of a Hugging Face tokenizer's outputs, from the tokenizer itself (duck-typed: its
``pad_token_id``, ``padding_side``, ``pad_token_type_id`` and ``model_input_names``; no
dependency on transformers): :class:`TokenizerCollate` gives what ``DataCollatorWithPadding``
gives (``DataCollatorForSeq2Seq`` for sequence labels), :class:`FlatteningCollate` what
``DataCollatorWithFlattening`` gives, each with the fused pad kernel instead of Python loops."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from torchfeed._options import check_bool
from torchfeed.collate._fields import (
    LABEL_PAD,
    as_sequences,
    collate_field,
    is_sequence,
    leave_worker,
)
from torchfeed.memory import SharedRing
from torchfeed.ops._pad import PadOptions, Side, pad_with, parse_side
from torchfeed.ragged import RaggedBatch

__all__ = ["FlatteningCollate", "TokenizerCollate", "tokenizer_facts"]


def tokenizer_facts(tokenizer: Any) -> tuple[int, int, Side, str, bool]:
    """(pad_token_id, pad_token_type_id, padding_side, main input name, whether it returns an
    attention mask) of a tokenizer, read as transformers' tokenizers expose them."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if isinstance(pad, bool) or not isinstance(pad, int):
        raise ValueError(
            f"the tokenizer has no pad token (pad_token_id={pad!r}); set one, e.g. "
            "tokenizer.pad_token = tokenizer.eos_token, as transformers' collators need too"
        )
    side: Side = getattr(tokenizer, "padding_side", "right")
    parse_side("tokenizer.padding_side", side)
    type_pad = getattr(tokenizer, "pad_token_type_id", 0)
    names = list(getattr(tokenizer, "model_input_names", ["input_ids", "attention_mask"]))
    if not names:
        raise ValueError("the tokenizer's model_input_names is empty: no input to pad")
    return pad, int(type_pad), side, str(names[0]), "attention_mask" in names


def _renamed(sample: Mapping) -> dict:
    out = dict(sample)
    for old in ("label", "label_ids"):
        if old in out:
            out["labels"] = out.pop(old)
    return out


class TokenizerCollate:
    """Pads what a tokenizer returns, as transformers' ``DataCollatorWithPadding`` does: the main
    input (``input_ids``) with ``pad_token_id``, ``attention_mask`` with 0 (made from the lengths
    when the samples have none and the tokenizer returns one), ``token_type_ids`` with
    ``pad_token_type_id``, ``special_tokens_mask`` with 1, on the tokenizer's padding side, to
    the longest in the batch rounded up to ``pad_to_multiple_of``; ``label``/``label_ids`` become
    ``labels``, which are padded with ``label_pad`` (-100) to their own longest when they are
    sequences (``DataCollatorForSeq2Seq``). All int64, as transformers returns them; scalar
    fields become tensors as ``torch.tensor`` makes them (float32 for floats); strings and other
    objects stay lists. Made by :meth:`torchfeed.PadCollate.from_tokenizer`."""

    def __init__(
        self,
        tokenizer: Any,
        pad_to_multiple_of: int | None = None,
        label_pad: int = LABEL_PAD,
        shared_ring: SharedRing | None = None,
        *,
        recycle: bool = True,
    ) -> None:
        check_bool("recycle", recycle)
        self.recycle = recycle
        pad, type_pad, side, main, makes_mask = tokenizer_facts(tokenizer)
        self.main, self.makes_mask = main, makes_mask
        self.padding_side: Side = side
        self.pad_to_multiple_of = pad_to_multiple_of
        self.pad_values = {
            main: pad,
            "attention_mask": 0,
            "token_type_ids": type_pad,
            "special_tokens_mask": 1,
            "labels": label_pad,
        }
        self._options = {
            key: PadOptions(value, side, pad_to_multiple_of)
            for key, value in self.pad_values.items()
        }
        self.shared_ring = shared_ring

    def with_shared_ring(self, shared_ring: SharedRing | None) -> TokenizerCollate:
        """A copy that collates into ``shared_ring`` inside DataLoader workers (zero copy)."""
        bound = copy.copy(self)
        bound.shared_ring = shared_ring
        return bound

    def __call__(self, features: Sequence[Mapping]) -> Any:
        return leave_worker(
            lambda lazy: self._collate(features, lazy), self.shared_ring, self.recycle
        )

    def _collate(self, features: Sequence[Mapping], lazy: bool) -> dict:
        if not features or not all(isinstance(f, Mapping) for f in features):
            raise TypeError("the tokenizer collate takes a non-empty list of dicts (features)")
        samples = [_renamed(f) for f in features]
        if self.main not in samples[0]:
            raise ValueError(f"the samples have no {self.main!r} field to pad: {list(samples[0])}")
        out: dict = {}
        made_mask = None
        for key in samples[0]:
            values = [s[key] for s in samples]
            if key in self._options and (key != "labels" or is_sequence(values[0])):
                padded = self._pad(key, values)
                out[key] = padded.padded
                if key == self.main and self.makes_mask and "attention_mask" not in samples[0]:
                    made_mask = padded.mask.to(torch.int64)  # from the lengths
            elif all(isinstance(v, bool | int | float | np.number) for v in values):
                out[key] = torch.tensor(values)  # as transformers' BatchEncoding makes them
            else:
                out[key] = collate_field(key, values, lazy)
        # transformers' order: the features' keys, the attention mask it made, then the labels
        # (renamed from label / label_ids)
        labels = out.pop("labels", None)
        if made_mask is not None:
            out["attention_mask"] = made_mask
        if labels is not None:
            out["labels"] = labels
        return out

    def _pad(self, key: str, values: list) -> Any:
        seqs = [s.to(torch.int64) for s in as_sequences(key, values)]
        try:
            return pad_with(seqs, self._options[key])
        except (TypeError, ValueError) as e:
            raise type(e)(f"tokenizer collate: field {key!r}: {e}") from None

    def __repr__(self) -> str:
        return (
            f"TokenizerCollate(pad_values={self.pad_values}, padding_side={self.padding_side!r}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of})"
        )


class FlatteningCollate:
    """Packs what a tokenizer returns into one row without padding, as transformers'
    ``DataCollatorWithFlattening`` does: ``input_ids`` ``[1, T]``, ``labels`` ``[1, T]`` (each
    sample's ``labels``, else its ``input_ids``, with ``separator_id`` at its first position),
    ``position_ids`` ``[1, T]`` restarting at 0 for each sample, all int64; with
    ``flash_attn_kwargs``, ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (int32 ``[B + 1]``, a leading 0)
    and ``max_length_q`` / ``max_length_k`` (Python ints). Empty samples are dropped; other
    fields too, as transformers drops them. Made by :meth:`torchfeed.PadCollate.from_tokenizer`
    with ``packed=True``."""

    def __init__(
        self,
        tokenizer: Any,
        separator_id: int = LABEL_PAD,
        flash_attn_kwargs: bool = True,
        *,
        recycle: bool = True,
    ):
        check_bool("recycle", recycle)
        self.recycle = recycle
        self.main = tokenizer_facts(tokenizer)[3]
        if isinstance(separator_id, bool) or not isinstance(separator_id, int):
            raise TypeError(f"separator_id must be an int, got {type(separator_id).__name__}")
        check_bool("flash_attn_kwargs", flash_attn_kwargs)
        self.separator_id = separator_id
        self.flash_attn_kwargs = flash_attn_kwargs

    def __call__(self, features: Sequence[Mapping]) -> dict:
        return leave_worker(lambda _lazy: self._flatten(features), recycle=self.recycle)

    def _flatten(self, features: Sequence[Mapping]) -> dict:
        if not features or not all(isinstance(f, Mapping) for f in features):
            raise TypeError("the flattening collate takes a non-empty list of dicts (features)")
        kept = [f for f in features if len(f[self.main]) > 0]
        if not kept:
            raise ValueError("the flattening collate got a batch in which every sample is empty")
        ids = RaggedBatch.from_sequences(
            [s.to(torch.int64) for s in as_sequences(self.main, [f[self.main] for f in kept])]
        )
        if "labels" in kept[0]:
            labels = torch.cat(
                [s.to(torch.int64) for s in as_sequences("labels", [f["labels"] for f in kept])]
            )
            if labels.shape[0] != ids.values.shape[0]:
                raise ValueError(
                    f"the flattening collate needs labels as long as {self.main!r} in every "
                    f"sample: {labels.shape[0]} labels for {ids.values.shape[0]} tokens"
                )
        else:
            labels = ids.values.clone()
        starts = torch.tensor(ids.host_offsets[:-1], dtype=torch.int64)
        labels[starts] = self.separator_id
        out: dict[str, Any] = {
            "input_ids": ids.values[None],
            "labels": labels[None],
            "position_ids": ids.position_ids[None],
        }
        if self.flash_attn_kwargs:
            out["cu_seq_lens_q"] = out["cu_seq_lens_k"] = ids.cu_seqlens
            out["max_length_q"] = out["max_length_k"] = ids.max_seqlen
        return out

    def __repr__(self) -> str:
        return (
            f"FlatteningCollate(separator_id={self.separator_id}, "
            f"flash_attn_kwargs={self.flash_attn_kwargs})"
        )
