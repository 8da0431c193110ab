"""A map-style distributed sampler that resumes mid-epoch, on the same or another world size."""

from __future__ import annotations

import operator
from collections.abc import Iterator, Sized
from typing import Any, Literal

import torch
from torch.utils.data import BatchSampler, IterableDataset, RandomSampler
from torch.utils.data.distributed import DistributedSampler as TorchDistributedSampler

from torchfeed.data._distributed import rank_and_world_size
from torchfeed.data._plan import EpochPlan
from torchfeed.data._seeding import SeedPerSample, run_seed

__all__ = ["DistributedSampler", "EpochShuffle"]


def _permutation(length: int, seed: int) -> list[int]:
    """torch's DistributedSampler's shuffle: ``randperm(length)`` from a generator seeded
    ``seed`` (its seed plus the epoch)."""
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(length, generator=g).tolist()


class EpochShuffle(RandomSampler):
    """``shuffle=True``'s sampler in ``torchfeed.loader``: torch's ``RandomSampler`` (a new
    order each ``iter()``, drawn from the loader's ``generator``, else torch's global one), until
    a trainer calls :meth:`set_epoch` on it (PyTorch Lightning does, on a loader's sampler, each
    epoch). From then on, on a world size of 1, epoch e's order is a permutation from
    ``seed + e``, as a ``DistributedSampler``'s on one rank. Lightning neither restores the
    random state nor loads a loader's state when it resumes from an end-of-epoch checkpoint
    (``ModelCheckpoint``'s default); a plain ``RandomSampler`` then gave the resumed epoch epoch
    0's order (the seed set again), and so does a DataLoader there. ``seed`` is the loader's
    per-sample seed. On several ranks the order stays drawn from the generator: Hugging Face
    Accelerate shards one order over its processes by keeping the sampler's generator in step
    across them, and ranks seeded apart would otherwise shard different orders. The epoch is
    also the per-sample seeds' (a ``SeedPerSample`` dataset's ``set_epoch``), which Accelerate
    does not set when the sampler takes one."""

    each_index_once = True  # an epoch is a permutation (no per-read seeds needed)

    def __init__(self, data_source: Sized, seed: int, generator: torch.Generator | None) -> None:
        super().__init__(data_source, generator=generator)
        self.seed = seed
        self.epoch: int | None = None

    @classmethod
    def in_place_of_shuffle(cls, dataset: Any, kwargs: dict[str, Any]) -> None:
        """DataLoader's keyword arguments (after ``dataset``) with ``shuffle=True`` as one of
        these over ``dataset``, where DataLoader would make a RandomSampler: a map-style dataset,
        neither a ``sampler`` nor a ``batch_sampler`` given (with either, DataLoader's own error
        stands). Its seed is the per-sample one (a ``SeedPerSample`` dataset's), else the run's."""
        if not kwargs.get("shuffle") or isinstance(dataset, IterableDataset):
            return
        if kwargs.get("sampler") is not None or kwargs.get("batch_sampler") is not None:
            return
        generator = kwargs.get("generator")
        seed = dataset.seed if isinstance(dataset, SeedPerSample) else run_seed(None, generator)
        kwargs["sampler"] = cls(dataset, seed, generator)
        kwargs["shuffle"] = False

    @staticmethod
    def batches_with_epoch(loader: Any) -> None:
        """After ``DataLoader.__init__``: the BatchSampler it made over an EpochShuffle takes
        ``set_epoch`` too, passed on to the sampler. The Hugging Face Trainer resumes mid-epoch
        through Accelerate's ``skip_first_batches``, which rebuilds the loader as a plain
        DataLoader over this batch sampler; the Trainer then sets the epoch on
        ``loader.batch_sampler.batch_sampler``, this one, and the resumed epoch gets its order
        and per-sample draws instead of a fresh draw from torch's generator. The method stays
        this EpochShuffle's, which sets the per-sample seeds' epoch too: Accelerate's
        ``prepare`` puts a sampler of its own into this batch sampler and then sets the epoch on
        the batch sampler, and the samples still get it."""
        batches = loader.batch_sampler
        if type(batches) is BatchSampler and isinstance(batches.sampler, EpochShuffle):
            # an attribute, not a subclass: PyTorch Lightning and Accelerate tell a batch sampler
            # of one's own by its type, and rebuild a loader differently around one
            batches.set_epoch = batches.sampler.set_epoch  # type: ignore[attr-defined]

    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not hasattr(type(epoch), "__index__"):
            raise TypeError(f"set_epoch: epoch must be an int, got {type(epoch).__name__}")
        self.epoch = operator.index(epoch)  # (a numpy integer too)
        if isinstance(self.data_source, SeedPerSample):
            self.data_source.set_epoch(self.epoch)

    def __iter__(self) -> Iterator[int]:
        if self.epoch is None or rank_and_world_size()[1] > 1:
            yield from super().__iter__()
            return
        # (an initial_seed() may be 2**64 - 1)
        yield from _permutation(len(self.data_source), (self.seed + self.epoch) % (1 << 64))


class DistributedSampler(TorchDistributedSampler[int]):
    """``torch.utils.data.DistributedSampler``'s semantics (the same indices for the same seed,
    epoch, rank and world size: a permutation from ``seed + epoch``, padded by repeating, or with
    ``drop_last`` cut, to equal shares, rank r taking every world-th), plus checkpoints.

    It is a subclass of torch's, so that a trainer which shards a loader whose sampler is not
    one (PyTorch Lightning under DDP, Ignite) keeps it as it is, instead of sharding its rank's
    share again (half of every epoch lost on 2 ranks). ``num_samples`` and ``total_size`` are
    torch's: a fresh epoch's share of one rank, and of all.

    ``num_replicas`` and ``rank`` default to torch.distributed's, else torchrun's RANK and
    WORLD_SIZE. Call :meth:`set_epoch` at the start of each epoch.

    Checkpoints: ``torchfeed.loader`` saves the position with its ``state_dict`` (ranks advance
    in lockstep, so any rank's checkpoint describes every rank); inside torchdata's
    ``StatefulDataLoader``, :meth:`state_dict` / :meth:`load_state_dict` are this rank's. On the
    same world size the epoch continues as if never stopped; on another, the indices not yet
    consumed this epoch are dealt out again in shares of equal length, so that every rank yields
    the same number of batches (under DDP an extra batch on one rank is a hang): with
    ``drop_last=False`` the shortfall is made up by repeating the first indices of the rest (as
    torch pads an epoch), with ``drop_last=True`` the last ``rest % num_replicas`` are left out;
    every other index is read exactly once. The next epoch is a fresh plan again.
    """

    def __init__(
        self,
        dataset: Sized | int,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        n = dataset if isinstance(dataset, int) and not isinstance(dataset, bool) else None
        if n is None:
            if not hasattr(dataset, "__len__"):
                raise TypeError(
                    f"dataset must be a sized dataset or its length, got {type(dataset).__name__}"
                )
            n = len(dataset)
        env_rank, env_world = rank_and_world_size()
        world = env_world if num_replicas is None else num_replicas
        rank = env_rank if rank is None else rank
        if isinstance(world, bool) or not isinstance(world, int) or world < 1:
            raise ValueError(f"num_replicas must be an int >= 1, got {world!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world:
            raise ValueError(f"rank must be an int in [0, {world}), got {rank!r}")
        if n < 1:
            raise ValueError("the dataset is empty: there is nothing to sample")
        # torch's __init__ is not called: it requires torch.distributed for the defaults above
        self.dataset = dataset  # type: ignore[assignment]  # torch's attribute; an int here too
        self.length = n
        self.num_replicas = world
        self.rank = rank
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._resume: dict[str, Any] | None = None
        self._yielded = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    @property
    def num_samples(self) -> int:  # type: ignore[override]  # torch's, computed
        return self._fresh_share()

    @property
    def total_size(self) -> int:  # type: ignore[override]
        return self._fresh_share() * self.num_replicas

    def _order(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.length))
        return _permutation(self.length, self.seed + self.epoch)

    def _current(self) -> dict[str, Any] | None:
        r = self._resume
        return r if r is not None and r["epoch"] == self.epoch else None

    def plan(self) -> EpochPlan:
        """This epoch's plan over the ranks, the checkpoint being resumed included."""
        uneven: Literal["drop", "pad"] = "drop" if self.drop_last else "pad"
        resume = self._current()
        if resume is None:
            return EpochPlan.fresh([1] * self.length, self.num_replicas, uneven)
        history = resume["history"]
        plan = EpochPlan.fresh([1] * self.length, history[0][0], uneven)
        for count, consumed in history[1:]:
            plan = plan.resumed(consumed, count)
        if plan.consumers != self.num_replicas:
            plan = plan.resumed(resume["consumed"], self.num_replicas)
        return plan

    def progress(self) -> tuple[list[int], list[int]]:
        """Per rank, for the iteration starting now: indices consumed already, indices left."""
        resume = self._current()
        if resume is None:  # a fresh epoch: equal shares, no plan to build (O(1), not O(N))
            return [0] * self.num_replicas, [self._fresh_share()] * self.num_replicas
        plan, base = self._resumed(resume)
        return base, [plan.length(r) - base[r] for r in range(self.num_replicas)]

    def _resumed(self, resume: dict[str, Any]) -> tuple[EpochPlan, list[int]]:
        """The plan of a resumed epoch and what each rank consumed of it already (nothing, when
        the plan was redealt to another world size)."""
        same = resume["consumers"] == self.num_replicas
        consumed = list(resume["consumed"]) if same else [0] * self.num_replicas
        return self.plan(), consumed

    def _fresh_share(self) -> int:
        n, r = self.length, self.num_replicas
        return n // r if self.drop_last else -(-n // r)

    def __iter__(self) -> Iterator[int]:
        order = self._order()
        resume = self._current()
        if resume is None:  # the plan's fresh share, read off directly
            n, r = len(order), self.num_replicas
            self._yielded = 0
            for k in range(self._fresh_share()):
                self._yielded += 1
                yield order[(self.rank + k * r) % n]
            return
        plan, base = self._resumed(resume)
        self._yielded = base[self.rank]
        for position, _, _ in plan.remaining(self.rank, base[self.rank]):
            self._yielded += 1
            yield order[position]

    def __len__(self) -> int:
        return self.progress()[1][self.rank]

    def checkpoint(self, consumed: list[int]) -> dict[str, Any]:
        """The state after rank r consumed ``consumed[r]`` indices of this epoch."""
        resume = self._current()
        history = [list(h) for h in resume["history"]] if resume else [[self.num_replicas, []]]
        if resume and resume["consumers"] != self.num_replicas:
            history.append([self.num_replicas, list(resume["consumed"])])
        return {
            "kind": "DistributedSampler",
            "epoch": self.epoch,
            "length": self.length,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "consumers": self.num_replicas,
            "consumed": [int(n) for n in consumed],
            "history": history,
        }

    def state_dict(self) -> dict[str, Any]:
        """This rank's position: the indices handed out this epoch (torchdata's protocol)."""
        consumed = [0] * self.num_replicas
        consumed[self.rank] = self._yielded
        return {**self.checkpoint(consumed), "only": self.rank}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a checkpoint at the next ``iter()``."""
        if state.get("kind") != "DistributedSampler" or state.get("length") != self.length:
            raise ValueError(
                "DistributedSampler.load_state_dict: the state is not a checkpoint of a "
                f"DistributedSampler over {self.length} indices"
            )
        for key in ("seed", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"DistributedSampler.load_state_dict: the checkpoint's {key}={state[key]!r} "
                    f"differs from this sampler's {getattr(self, key)!r}: the order would differ"
                )
        if "only" in state and state["consumers"] != self.num_replicas:
            raise ValueError(
                "DistributedSampler.load_state_dict: a single rank's state cannot resume on "
                "another world size; save torchfeed.loader's state_dict, which holds every rank's"
            )
        self._resume = {**state, "history": [list(h) for h in state["history"]]}
        self.epoch = state["epoch"]

    def resuming(self) -> bool:
        """Whether the current epoch continues a loaded checkpoint (its indices: the rest)."""
        return self._current() is not None

    def resume_done(self) -> None:
        """Forgets the checkpoint being resumed (the loader calls it when that epoch ends)."""
        self._resume = None
