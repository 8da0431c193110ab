"""What a torchfeed loader says once per process before it forks its workers: where forking can
hang (a torch.distributed process on Python < 3.12), and where every worker ends up with a copy
of the dataset's Python objects (copy-on-write, undone by reference counts)."""

from __future__ import annotations

import multiprocessing
import sys
import warnings
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from torchfeed.data._distributed import distributed_initialized

__all__ = ["warn_before_forking"]

# CPython before 3.12 can deadlock a forked child in PyOS_AfterFork_Child, when another thread
# held the interpreter's thread-state lock at the fork (gh-112275). A torch.distributed process
# has threads of its own (gloo's), so a DataLoader forking its workers there (a DDP loop's next
# epoch, right after a collective) now and then leaves a worker stuck before it runs any Python
# (seen with gdb), and the rank waiting for its batch forever. Measured here (Python 3.11.7,
# gloo, 2 ranks x 2 workers, a new loader per epoch): 3 of 4 runs of 400 epochs hung, with a
# plain DataLoader as with torchfeed.loader.
_FORK_DEADLOCK = sys.version_info < (3, 12)
_fork_warned = False

# A container of this many Python objects in a dataset: reading an object writes its reference
# count, so each forked worker copies the memory pages of the objects it reads (pytorch#13246).
# An ImageFolder's 1,281,167 (path, label) tuples (ImageNet's) cost each of 2 workers 132 MB of
# private memory over an epoch here, 7 MB in a SerializedList (throwaway cow.py).
_COPIED_OBJECTS = 1_000_000
_copy_warned = False


def _start_method(loader: DataLoader) -> str:
    context = loader.multiprocessing_context
    return (
        context.get_start_method()
        if context is not None
        else multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_all_start_methods()[0]  # the default, without fixing it
    )


def _warn_fork_in_distributed(loader: DataLoader) -> None:
    """Warns once per process when ``loader`` is about to fork workers from a torch.distributed
    process on a Python with gh-112275."""
    global _fork_warned
    if _fork_warned or not _FORK_DEADLOCK or loader.num_workers == 0:
        return
    if not distributed_initialized() or _start_method(loader) != "fork":
        return
    _fork_warned = True
    version = ".".join(map(str, sys.version_info[:3]))
    warnings.warn(
        f"torchfeed.loader: forking DataLoader workers in a torch.distributed process on Python "
        f"{version} can leave a worker deadlocked at its start (CPython gh-112275, fixed in "
        "3.12: the worker inherits an interpreter lock one of the process group's threads held "
        "at the fork), and the rank then waits for its batch forever. Pass "
        "multiprocessing_context='spawn' to the loader (a spawned worker also exits when its "
        "rank is killed; a forkserver's are kept alive by the server), or use Python 3.12+",
        RuntimeWarning,
        stacklevel=5,  # warn_before_forking, _epoch_iterator, __iter__, the user's loop
    )


def _datasets(dataset: Any) -> list[Any]:
    """The dataset and those it wraps (torchfeed's wrappers, Subset, ConcatDataset), outermost
    first."""
    found: list[Any] = []
    todo = [dataset]
    while todo and len(found) < 16:
        d = todo.pop(0)
        if any(d is f for f in found):
            continue
        found.append(d)
        try:  # (a dataset's own __getattr__ may raise anything: this check never fails a read)
            inner, parts = getattr(d, "dataset", None), getattr(d, "datasets", None)
        except Exception:
            continue
        todo.extend([inner] if inner is not None else [])
        todo.extend(parts[:16] if isinstance(parts, list | tuple) else [])
    return found


def _copied_containers(dataset: Any) -> list[tuple[str, int]]:
    """(name, length) of the lists, tuples, dicts and numpy arrays of objects, of at least
    _COPIED_OBJECTS objects, that the dataset holds (not numbers: a list of small ints writes to
    no page of its own)."""
    out: list[tuple[str, int]] = []
    seen: set[int] = set()
    for d in _datasets(dataset):
        try:
            attributes = vars(d)
        except TypeError:  # (no __dict__)
            continue
        for name, value in attributes.items():
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, np.ndarray):  # an array of objects holds references too
                if value.dtype == object and value.size >= _COPIED_OBJECTS:
                    out.append((f"{type(d).__name__}.{name}", value.size))
                continue
            if not isinstance(value, list | tuple | dict) or len(value) < _COPIED_OBJECTS:
                continue
            first = next(iter(value.values() if isinstance(value, dict) else value))
            if first is None or isinstance(first, int | float | bool):
                continue
            out.append((f"{type(d).__name__}.{name}", len(value)))
    return out


def _warn_copied_metadata(loader: DataLoader) -> None:
    """Warns once per process when ``loader`` is about to fork workers over a dataset holding
    millions of Python objects, each worker copying those it reads."""
    global _copy_warned
    if _copy_warned or loader.num_workers == 0 or _start_method(loader) != "fork":
        return
    big = _copied_containers(loader.dataset)
    if not big:
        return
    _copy_warned = True
    name, n = big[0]
    attribute = name.split(".")[-1]
    also = "".join(f", {other} ({k:,})" for other, k in big[1:])
    warnings.warn(
        f"torchfeed.loader: {name} holds {n:,} Python objects{also}. Each of the "
        f"{loader.num_workers} forked workers copies the memory pages of the objects it reads "
        "(reading one writes its reference count: pytorch/pytorch#13246); an ImageFolder's "
        f"(path, label) tuples cost about 100 bytes each, {n * 100 / 1e6:,.0f} MB a worker "
        f"over an epoch. dataset.{attribute} = torchfeed.data.SerializedList(dataset."
        f"{attribute}), before the loader starts, keeps them in one buffer that the workers "
        "share and never write",
        RuntimeWarning,
        stacklevel=5,  # warn_before_forking, _epoch_iterator, __iter__, the user's loop
    )


def warn_before_forking(loader: DataLoader) -> None:
    _warn_fork_in_distributed(loader)
    _warn_copied_metadata(loader)
