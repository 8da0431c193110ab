"""DataLoader's arguments as torchfeed's loaders take them: by name or by position, as
DataLoader does, and whether they leave the batches to ``default_collate``."""

from __future__ import annotations

import inspect
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["dataloader_keywords", "default_collation"]

# DataLoader's arguments after the dataset that may be given by position (batch_size, shuffle,
# sampler, batch_sampler, num_workers, collate_fn, ...), in order
_POSITIONAL = [
    p.name
    for p in inspect.signature(DataLoader.__init__).parameters.values()
    if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
][2:]


def dataloader_keywords(args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """DataLoader's arguments after the dataset, each by name: ``DataLoader(dataset, 64, True)``
    as ``batch_size=64, shuffle=True``. Too many, or one given twice, raise as DataLoader
    would."""
    if len(args) > len(_POSITIONAL):
        raise TypeError(
            f"a DataLoader takes at most {len(_POSITIONAL)} positional arguments after the "
            f"dataset ({', '.join(_POSITIONAL)}), got {len(args)}"
        )
    named = dict(kwargs)
    for name, value in zip(_POSITIONAL, args, strict=False):
        if name in named:
            raise TypeError(f"a DataLoader got multiple values for argument {name!r}")
        named[name] = value
    return named


def default_collation(kwargs: dict[str, Any]) -> bool:
    """Whether a DataLoader given these arguments (after the dataset, by name) would collate its
    batches with ``default_collate``: no ``collate_fn``, and batches (a ``batch_size``, 1 by
    default, or a ``batch_sampler``; without either it converts each sample with
    ``default_convert``)."""
    if kwargs.get("collate_fn") is not None:
        return False
    return kwargs.get("batch_size", 1) is not None or kwargs.get("batch_sampler") is not None
