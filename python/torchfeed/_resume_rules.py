"""What a fast-forwarded checkpoint (a generic sampler or IterableDataset) resumes: on which
world size and workers it may, and whether the next ``iter()`` reads the rest of its epoch or the
next epoch whole."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import IterableDataset

from torchfeed._loader_iterators import worker_batches
from torchfeed.data._distributed import rank_and_world_size

__all__ = [
    "check_generic",
    "moves_on",
    "other_generators",
    "resumed_length",
    "set_other_generators",
    "sharded_checkpoint",
]


def resumed_length(loader: Any, rest: int, sampler: Any) -> int:
    """``len()`` of a loader whose epoch's sampler yields ``rest`` batches: plus the batches a
    resumed epoch had consumed before its checkpoint (``sampler``, the loader's torchfeed
    DistributedSampler if it has one: the checkpoint's count; another sampler: the fast-forward's
    skip; an IterableDataset: none, its ``len()`` is the dataset's). Resumed on fewer ranks
    than the checkpoint's, where that is less than a fresh epoch on this world size, it is the
    fresh epoch's: Lightning reads ``len()`` once, and would end every later epoch that much
    early."""
    if sampler is None:
        skipped = 0 if isinstance(loader.dataset, IterableDataset) else loader._skip_batches
        return rest + skipped
    if not sampler.resuming():
        return rest
    pending = loader._pending
    n = rest + (int(pending["batches"]) if pending is not None else loader._resumed_from)
    size, share = loader.batch_size, sampler.num_samples
    if size:
        n = max(n, share // size if loader.drop_last else -(-share // size))
    return n


def moves_on(loader: Any, pending: dict[str, Any]) -> bool:
    """Whether a fast-forwarded checkpoint's epoch is over for the loader's next ``iter()``,
    which then reads the next epoch whole: the sampler was set to another epoch since it was
    taken (its order is another), or, for a sampler without epochs, it was taken after the
    training loop reached the epoch's end (a loop that saves after its ``for``)."""
    epoch, then = loader._sampler_epoch(), pending.get("sampler_epoch")
    if epoch is not None and then is not None:
        return epoch != then
    return bool(pending.get("ended"))


def check_generic(loader: Any, state: dict[str, Any]) -> None:
    """A generic source is fast-forwarded: the same batches in the same order only on the same
    world size (and, for an IterableDataset, the same workers, which deal its stream)."""
    world = rank_and_world_size()[1]
    if state.get("world", world) != world:
        raise ValueError(
            f"load_state_dict: the checkpoint was taken on a world size of {state['world']}, "
            f"this run has {world}: a {_generic_name(loader)} resumes on the same world size "
            "only (torchfeed.data.DistributedSampler, or ShardedIterableDataset, resume on "
            "another)"
        )
    if isinstance(loader.dataset, IterableDataset) and state["num_workers"] != loader.num_workers:
        raise ValueError(
            f"load_state_dict: the checkpoint's num_workers {state['num_workers']} differs "
            f"from this loader's {loader.num_workers}: an IterableDataset's stream is dealt "
            "over the workers, so it resumes with the same num_workers only "
            "(torchfeed.data.ShardedIterableDataset resumes on any)"
        )


def _generic_name(loader: Any) -> str:
    if isinstance(loader.dataset, IterableDataset):
        return f"{type(loader.dataset).__name__} (an IterableDataset)"
    return f"loader with a {type(loader.sampler).__name__}"


def sharded_checkpoint(loader: Any, source: Any, batches: int) -> dict[str, Any]:
    """A ShardedIterableDataset's checkpoint after the epoch's first ``batches`` batches: what
    each consumer (rank x worker) had read. Ranks advance in lockstep (every rank yielded as
    many), and worker w reads consumer ``rank * workers + (w + rotation) % workers``."""
    _, world, workers = loader._consumers()
    size = loader.batch_size or 1
    base, left = loader._progress or source.progress(world * workers)
    rotation = source.rotation(world * workers)
    consumed = list(base)
    for r in range(world):
        ids = [r * workers + (w + rotation) % workers for w in range(workers)]
        made, next_worker = worker_batches([left[c] for c in ids], size, loader.drop_last, batches)
        for w, c in enumerate(ids):
            consumed[c] = base[c] + min(left[c], made[w] * size)
    # resumed, the loader's first worker must read the consumer whose batch is next
    return source.checkpoint(world * workers, consumed, (rotation + next_worker) % workers)


def other_generators(loader: Any) -> dict[str, torch.Tensor]:
    """The states, now, of the generators a sampler may draw its order from besides the one a
    fast-forward replays (the loader's ``generator=``, else torch's global one): torch's global
    one when the loader has a generator (a WeightedRandomSampler draws there, and the loader's
    generator only seeds its workers), and a generator of the sampler's own. Without them a
    resumed epoch was fast-forwarded over another order (samples read twice, others never)."""
    states = {}
    if loader.generator is not None:
        states["global"] = torch.get_rng_state()
    own = _samplers_own_generator(loader)
    if own is not None:
        states["sampler"] = own.get_state()
    return states


def set_other_generators(loader: Any, states: dict[str, torch.Tensor]) -> None:
    """The sampler's own generator set back to ``states`` (torch's global one is set by the
    loader, with the rest of its resume)."""
    own = _samplers_own_generator(loader)
    if "sampler" in states and own is not None:
        own.set_state(states["sampler"])


def _samplers_own_generator(loader: Any) -> torch.Generator | None:
    """The epoch sampler's ``generator``, when it has one that is not the loader's."""
    own = getattr(loader._epoch_sampler(), "generator", None)
    return own if isinstance(own, torch.Generator) and own is not loader.generator else None
