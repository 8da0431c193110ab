"""Seeding: randomness that follows the sample (:func:`seed_sample`, :class:`SeedPerSample`: the
augmentation of a sample is a function of (seed, epoch, index), whoever reads it, before or after
a resume), and rank- and worker-aware streams (:class:`WorkerSeeder`)."""

from __future__ import annotations

import ctypes
import functools
import operator
import pickle
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from numpy.random import mtrand
from torch.utils.data import Dataset, Subset, get_worker_info

from torchfeed.data._distributed import rank_and_world_size

__all__ = [
    "Occurrence",
    "SeedPerSample",
    "WorkerSeeder",
    "derive_seed",
    "sample_key",
    "seed_sample",
    "seed_worker",
]

_MASK = (1 << 64) - 1


_START = 0x6A09E667F3BCC909


def _mix(h: int, part: int) -> int:
    """One part mixed into ``h`` through SplitMix64's finalizer."""
    h = (h ^ (int(part) & _MASK)) + 0x9E3779B97F4A7C15 & _MASK
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK
    return h ^ (h >> 31)


def derive_seed(*parts: int) -> int:
    """A 64-bit seed mixing the parts, each through SplitMix64's finalizer: nearby inputs give
    unrelated seeds, unlike ``base + worker_id`` (a few microseconds: it runs per sample)."""
    h = _START
    for p in parts:
        h = _mix(h, p)
    return h


def run_seed(sampler: Any, generator: torch.Generator | None) -> int:
    """The seed a loader's samples draw from: its sampler's ``seed`` (a DistributedSampler's),
    else the initial seed of the loader's ``generator`` (PyTorch's reproducibility recipe seeds
    that generator, and the DataLoader seeds its workers from it), else ``torch.initial_seed()``."""
    seed = getattr(sampler, "seed", None)
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    return generator.initial_seed() if generator is not None else torch.initial_seed()


def _seed_generators(s: int) -> None:
    """torch's CPU generator, numpy's global generator and ``random``, from one 64-bit seed."""
    torch.default_generator.manual_seed(s)
    _seed_host_generators(s)


def _seed_host_generators(s: int) -> None:
    """numpy's global generator and ``random`` (5.8 us of the 7 us the three take), as
    :func:`_seed_generators` seeds them."""
    np.random.seed(s % (1 << 32))
    random.seed(s)


def _generator_states() -> tuple[Any, ...]:
    return torch.default_generator.get_state(), np.random.get_state(), random.getstate()


def _set_generator_states(states: tuple[Any, ...]) -> None:
    torch.default_generator.set_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])


@contextmanager
def kept_generators(keep: bool = True) -> Iterator[tuple[Any, ...] | None]:
    """Within it, torch's, numpy's and ``random``'s global generators may be seeded and drawn
    from; on leaving it (by an exception too) they are as they were, so a loop's own draws are
    its own (about 90 us: numpy's state 71 of it). ``keep=False``: nothing is saved or set back
    (a worker's generators are its reads'). Gives the saved states, or None."""
    saved = _generator_states() if keep else None
    try:
        yield saved
    finally:
        if saved is not None:
            _set_generator_states(saved)


# Whether a read drew from the three generators: seed them, note their states, read, and
# compare. After seeding, the first draw of any of them regenerates its whole Mersenne Twister
# key (and numpy's seeding drops its cached gaussian, so a legacy gaussian draws too), so
# comparing torch's state, numpy's key and random's state catches any draw.
@functools.cache  # per process, made at first use
def _numpy_key_reader() -> Callable[[], bytes]:
    """Reads the state of numpy's global generator: the bytes of its MT19937 key, through the
    bit generator's public ``ctypes.state_address`` (0.5 us; the key leads the state struct),
    when a self-test shows they are the key; else its whole state pickled (30-40 us; numpy
    before 1.25 has no ``get_bit_generator``)."""

    def slow() -> bytes:
        return pickle.dumps(np.random.get_state())

    get_bit_generator = getattr(mtrand, "get_bit_generator", None)
    if get_bit_generator is None:
        return slow
    bit_generator = get_bit_generator()
    try:
        address = bit_generator.ctypes.state_address
    except (AttributeError, TypeError, ValueError):
        return slow

    def fast() -> bytes:
        if get_bit_generator() is not bit_generator:  # np.random.set_bit_generator
            return slow()
        return ctypes.string_at(address, 624 * 4)

    def key() -> bytes:
        return bit_generator.state["state"]["key"].tobytes()

    saved = np.random.get_state()  # with the legacy generator's cached gaussian
    try:
        np.random.seed(1)
        one = fast()
        ok = one == key()
        np.random.random()
        ok = ok and fast() == key() != one
    except (KeyError, TypeError, ValueError):
        ok = False
    finally:
        np.random.set_state(saved)
    return fast if ok else slow


def _fingerprint() -> tuple[bytes, bytes, tuple[int, ...]]:
    """The three generators' states as :func:`_read_drawing_nothing` compares them: torch's
    bytes, then :func:`_host_fingerprint`."""
    return (torch.default_generator.get_state().numpy().tobytes(), *_host_fingerprint())


def _host_fingerprint() -> tuple[bytes, tuple[int, ...]]:
    """numpy's and ``random``'s states as a draw changes them after seeding: numpy's key bytes;
    of ``random``'s, three key words and the position (seeded, the position is at the key's end,
    and the first draw regenerates the key: 9 us with torch's, against 15 us for the whole
    state compared)."""
    key = random.getstate()[1]
    return _numpy_key_reader()(), (key[0], key[1], key[623], key[-1])


def _own_batched_read(dataset: Any) -> Callable[[list[int]], Any] | None:
    """``dataset.__getitems__``, unless it only passes the batch on to reads by index: a
    ``Subset`` (what ``random_split`` makes) has one whatever it wraps, and over a dataset read
    by index it is that dataset's ``__getitem__`` per sample, which the reads by index seed for
    less (torch's generator per sample, not all three, once a sample drew)."""
    inner = dataset
    while isinstance(inner, Subset):
        inner = inner.dataset
    if inner is not dataset and not callable(getattr(inner, "__getitems__", None)):
        return None
    return getattr(dataset, "__getitems__", None)


def _read_drawing_nothing(
    batched: Callable[[list[int]], Any], indices: list[int], seed: int
) -> list | None:
    """``batched(indices)``, read with the generators seeded from ``seed``: the list of samples
    it returns, or None when the read drew from a generator or returned something other than a
    list. (A read that draws nothing but derives a generator of its own from
    ``torch.initial_seed()`` is not seen; it gets ``seed``.)"""
    _seed_generators(seed)
    before = _fingerprint()
    got = batched(indices)
    return got if isinstance(got, list) and _fingerprint() == before else None


def seed_sample(seed: int, epoch: int, index: int, sample: int = 0) -> None:
    """Seeds torch's CPU generator, numpy's global generator and ``random`` for one sample from
    what it is (the seed, the epoch, its index and which of its reads in the epoch: ``sample``,
    0 for a first read, a repeated one's :class:`Occurrence` part), not from where it is read:
    its augmentation is then the same whichever rank or worker reads it, before or after a
    resume. (torch's CPU generator only, as torch.manual_seed also seeds every GPU, which costs
    hundreds of microseconds; a Dataset draws on the host.)"""
    _seed_generators(derive_seed(seed, epoch, index, sample))


class Occurrence(int):
    """A dataset index the sampler yields again in an epoch (``WeightedRandomSampler`` with
    replacement, repeated augmentation), or on another rank, with its read's place among that
    index's reads (``part``, :func:`seed_sample`'s ``sample``): each read draws anew, as under a
    DataLoader. torchfeed.loader gives them to a :class:`SeedPerSample`, which reads the plain
    index; an index read once is a plain int (part 0)."""

    part: int

    def __new__(cls, index: int, part: int) -> Occurrence:
        self = super().__new__(cls, index)
        self.part = part
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return Occurrence, (int(self), self.part)


def sample_key(index: Any) -> int:
    """The key a sample's own draws are made from: its index, or for a repeated read, a 63-bit
    key of (index, part)."""
    if isinstance(index, Occurrence):
        return derive_seed(int(index), index.part) >> 1
    return operator.index(index)


# What a SeedPerSample learns in a process, never pickled: its epoch's view and mixed prefix,
# and what its reads were seen to draw
_PER_PROCESS = ("_epoch_view", "_prefix", "_checked", "_drew", "_loop_kept")


class SeedPerSample(Dataset):
    """A map-style dataset whose sample i is read after :func:`seed_sample` (seed, epoch, i):
    whatever random numbers its ``__getitem__`` draws (torch, numpy, ``random``; torchfeed's and
    torchvision's transforms with the global generator) follow the sample, so a resumed run, an
    elastic one and one with another worker count draw the same augmentation for the same
    sample. :func:`torchfeed.loader` wraps map-style datasets in it by default
    (``seed_samples=``) and sets its epoch; ``set_epoch`` reaches persistent workers (shared
    memory). In the main process (``num_workers=0``) the three generators' states are restored
    after each batch (after each sample read by ``dataset[i]``), so the training loop's own draws
    are not disturbed: by torchfeed.loader after the collate, which then draws as in a worker
    (the same after a resume), else by this dataset after the reads. The DataLoader's batched
    read (:meth:`__getitems__`) seeds numpy's generator and ``random`` once a batch while the
    reads leave them untouched, and keeps a dataset's own batched read (``__getitems__``, as a
    Hugging Face dataset has) while it draws nothing. Other attributes are the wrapped
    dataset's."""

    def __init__(self, dataset: Any, seed: int = 0) -> None:
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {type(seed).__name__}")
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(
                f"SeedPerSample wraps a map-style dataset (with __getitem__ and __len__), got "
                f"{type(dataset).__name__}"
            )
        self.dataset = dataset
        self.seed = seed
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def _sample_seed(self, index: int) -> int:
        return self._sample_seeds([index])[0]

    def _sample_seeds(self, indices: Any) -> list[int]:
        """derive_seed(seed, epoch, index, 0) of each index, with (seed, epoch)'s part mixed once
        per epoch and the epoch read through a numpy view of its shared memory (per process: not
        pickled), once a call (0.9 us a sample)."""
        view = self.__dict__.get("_epoch_view")
        if view is None:
            view = self.__dict__["_epoch_view"] = self._epoch.numpy()
        epoch = int(view[0])
        prefix = self.__dict__.get("_prefix")
        if prefix is None or prefix[0] != epoch:
            prefix = self.__dict__["_prefix"] = (epoch, _mix(_mix(_START, self.seed), epoch))
        return [
            _mix(_mix(prefix[1], int(i)), i.part if type(i) is Occurrence else 0) for i in indices
        ]

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _PER_PROCESS}

    def __len__(self) -> int:
        return len(self.dataset)

    def _in_worker(self) -> bool:
        """Whether the generators are left as seeding and reading leave them: in a worker, and
        while torchfeed.loader, which sets them back after each batch, makes one in the main
        process (``_loop_kept``)."""
        return get_worker_info() is not None or bool(self.__dict__.get("_loop_kept"))

    def __getitem__(self, index: int) -> Any:
        seed = self._sample_seed(index)
        index = int(index) if type(index) is Occurrence else index
        if self._in_worker():
            _seed_generators(seed)
            return self.dataset[index]
        with kept_generators():
            _seed_generators(seed)
            return self.dataset[index]

    def __getitems__(self, indices: Any) -> list[Any]:
        """The DataLoader's batched read. Every sample's draws are those :func:`seed_sample`
        gives it, but the generators are seeded before every sample only where that is needed:

        - a dataset read by index: torch's generator before every sample (its draws and
          ``torch.initial_seed()`` then follow the sample), numpy's and ``random``'s once, as
          for the batch's first sample, their states compared after the batch;
        - a dataset with a batched read of its own (``__getitems__``: a Hugging Face dataset
          reads a batch as one slice of its table, 2-3x faster than row by row; a ``Subset``
          passes batches on to one): that read, all three seeded as for its first sample and
          compared. A ``Subset`` of a dataset read by index is read by index.

        A batch whose reads drew from a generator seeded once is read again sample by sample,
        all three seeded before each, as every later batch in this process is. A process's
        first batch reads its first sample alone first, so a dataset that draws reads one
        sample twice, not a batch. A worker's generators are then as reads by index leave them
        (seeded for the last sample, then its draws), so what it draws next (a collate's random
        transform) is what it drew after them, and so are the main process's while
        torchfeed.loader makes a batch there (it sets them back after the collate); otherwise
        the main process gets its own states back, once a batch."""
        if not hasattr(indices, "__len__") or not hasattr(indices, "__getitem__"):
            indices = list(indices)  # (a batch sampler may yield any iterable of indices)
        if len(indices) == 0:  # (or an array, or a tensor: kept for a batched read of its own)
            return []
        seeds = self._sample_seeds(indices)
        if isinstance(indices, list) and any(type(i) is Occurrence for i in indices):
            indices = [int(i) for i in indices]  # (the dataset reads the plain index)
        # the main process's own draws stay undisturbed
        with kept_generators(not self._in_worker()) as saved:
            batch = None
            if not self.__dict__.get("_drew"):
                batch = self._read_checked(indices, seeds, saved)
            if batch is None:  # sample by sample, every generator seeded
                self.__dict__["_drew"] = True
                batch = []
                for i, seed in zip(indices, seeds, strict=True):
                    _seed_generators(seed)
                    batch.append(self.dataset[i])
            return batch

    def _read_checked(self, indices: Any, seeds: list[int], saved: Any) -> list[Any] | None:
        """The batch read with the generators seeded as :meth:`__getitems__` says, or None when
        a generator seeded once was drawn from (or the dataset's batched read returned no
        list)."""
        batched = _own_batched_read(self.dataset)
        checked = self.__dict__.get("_checked")  # per process: None until a first read
        batch: list[Any] = []
        for cut in [slice(None)] if checked else [slice(1), slice(1, None)]:
            part, part_seeds = indices[cut], seeds[cut]
            if len(part) == 0:
                continue
            # seeded as its first sample is: a batched read that derives a generator of its own
            # from torch.initial_seed() gets a seed per batch, never one for all
            if batched:
                got = _read_drawing_nothing(batched, part, part_seeds[0])
            else:
                got = self._read_by_index_drawing_torch_only(part, part_seeds)
            self.__dict__["_checked"] = True
            if got is None:
                return None
            batch.extend(got)
        if saved is None:  # a worker: seeded for the last sample, as reads by index leave it
            if batched:
                _seed_generators(seeds[-1])  # (the read drew nothing)
            else:
                _seed_host_generators(seeds[-1])  # (torch's is there, with that sample's draws)
        return batch

    def _read_by_index_drawing_torch_only(self, part: Any, seeds: list[int]) -> list | None:
        """The samples of ``part``, torch's generator seeded for each from ``seeds``, numpy's and
        ``random``'s for the first: None when the reads drew from either of those (1.1 us a
        sample, against the 7 us of seeding all three)."""
        _seed_host_generators(seeds[0])
        before = _host_fingerprint()
        got = []
        for i, seed in zip(part, seeds, strict=True):
            torch.default_generator.manual_seed(seed)
            got.append(self.dataset[i])
        return got if _host_fingerprint() == before else None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "seed", "_epoch"):
            raise AttributeError(name)  # (unpickling looks these up before __dict__ exists)
        return getattr(self.dataset, name)

    def __repr__(self) -> str:
        return f"SeedPerSample({self.dataset!r}, seed={self.seed})"


class WorkerSeeder:
    """A DataLoader ``worker_init_fn`` that seeds ``torch``, ``numpy`` and ``random`` in each
    worker from the loader's per-epoch base seed, the worker id AND the distributed rank.

    PyTorch gives each worker ``base_seed + worker_id`` for torch (and numpy since 1.9), but not
    per rank: with the same ``torch.manual_seed`` on every rank (the usual DDP setup), worker k of
    every rank draws the same augmentations. The rank is read when the seeder is made (in the
    main process, where torch.distributed is initialized), so it works with fork and spawn.
    ``then`` runs after seeding (your own worker_init_fn).
    """

    def __init__(self, rank: int | None = None, then: Callable[[int], None] | None = None) -> None:
        self.rank = rank_and_world_size()[0] if rank is None else int(rank)
        self.then = then

    def state_dict(self) -> dict[str, int]:
        """The seeder's own state: its rank (the streams follow from the loader's seed, which
        torchfeed.loader saves, the rank and the worker)."""
        return {"rank": self.rank}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.rank = int(state["rank"])

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        base = info.seed if info is not None else torch.initial_seed()
        seed = derive_seed(base, self.rank, worker_id)
        torch.manual_seed(seed)
        np.random.seed(seed % (1 << 32))
        random.seed(seed)
        if self.then is not None:
            self.then(worker_id)


def seed_worker(worker_id: int) -> None:
    """:class:`WorkerSeeder` as a plain function, taking the rank from torch.distributed or
    the RANK environment variable (set by torchrun) inside the worker."""
    WorkerSeeder()(worker_id)
