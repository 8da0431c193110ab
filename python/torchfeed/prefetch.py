"""DevicePrefetcher: prepares batch i+1 (stage, copy, transform) while the step uses batch i."""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import torch
from torch import Tensor

from torchfeed._batch_rng import drawing_from
from torchfeed._tree import map_tensors, tensors_of
from torchfeed.data._distributed import rank_and_world_size
from torchfeed.data._seeding import SeedPerSample, derive_seed, run_seed, sample_key
from torchfeed.data._sharding import ShardedIterableDataset
from torchfeed.memory._pinned_ring import PinnedRing

__all__ = ["DevicePrefetcher"]


_END = object()


def _signed(seed: int) -> int:
    """A 64-bit seed as the int64 an op's ``int`` argument takes (the same bits)."""
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def _default_seed(loader: Any) -> int:
    """The seed the loader's samples draw from: a torchfeed loader's per-sample seed or a
    sharded stream's, else its sampler's, its generator's, or torch's (:func:`run_seed`)."""
    dataset = getattr(loader, "dataset", None)
    if isinstance(dataset, SeedPerSample | ShardedIterableDataset):
        return dataset.seed
    return run_seed(getattr(loader, "sampler", None), getattr(loader, "generator", None))


def _listed(keys: Any) -> list[Any]:
    """A batch's indices as a list (one index: a loader without automatic batching)."""
    if isinstance(keys, torch.Tensor):
        return keys.reshape(-1).tolist()
    return list(keys) if hasattr(keys, "__len__") and not isinstance(keys, str) else [keys]


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _InLoop:
    """A batch for another device (not the CPU, not CUDA): copied there and transformed in the
    training loop's thread, with the draws it would have had in the prefetcher's."""

    def __init__(self, seed: int | None, keys: list[int] | None) -> None:
        self.seed, self.keys = seed, keys


class DevicePrefetcher:
    """Iterates ``loader`` (a DataLoader or any iterable of batches) one step ahead of the
    training loop, in a background thread:

    - on a GPU: each batch is staged into ``pinned_ring`` (page-locked, reused, fenced),
      copied to ``device`` on the prefetcher's own CUDA stream (one per prefetcher, made once),
      and passed through ``transform`` there (e.g. the fused crop/flip/normalize, or
      ``RaggedBatch.pad``); the batch handed out is safe to use on the consumer's current
      stream (it waits for the copy stream, and the tensors are marked as used by it);
    - on a CPU-only machine: loading and ``transform`` still overlap with the step;
    - on another device (``mps``, ``xpu``): each batch is copied there and passed through
      ``transform`` in the training loop's thread as it is handed out, with the draws it would
      have had in the prefetcher's thread (MPS aborts the process when two threads run ops at
      once); only the reading overlaps the step.

    ``pinned_ring=None`` uses the device's shared arena (:meth:`PinnedRing.for_device`, made on
    the first GPU batch for ``depth + 2`` batches of that size, grown when a later prefetcher's
    first batch needs more; every prefetcher on the device shares it, so one made per epoch
    page-locks nothing new);
    ``pinned_ring=False``: plain copies; or a :class:`PinnedRing` of your own. Batches already in
    page-locked memory (``pin_memory=True``, a zero-copy loader's ring, whose memory fences
    itself after every copy from it) are copied from there, with no staging. Up to
    ``depth`` batches are prepared ahead. ``len()`` is the loader's; each ``iter()`` is an epoch.
    An exception in the loader (a worker's, say) is raised in the training loop; leaving the loop
    (its end, ``break``, an exception) stops the thread. Over a torchfeed loader
    (:class:`ResumableLoader`, what :func:`torchfeed.loader` returns), the loader's
    ``state_dict()`` records the batches handed to the loop, not those read ahead.

    ``transform`` runs in the prefetcher's thread, beside the training loop's: torchfeed's
    random transforms given no ``generator`` draw there from their own streams, not from
    torch's global generator, which the loop's thread draws from too (in an order that changed
    from run to run); so do torch's random functions called there without a generator
    (``torch.rand``, ``Tensor.uniform_``, ...: a torchvision ``v2.Compose``, ``MixUp``, code of
    your own), from the batch's generator (on another device, one of the same seed). So the
    same seeds give the same augmentation, and the loop's own draws are its own. Python's
    ``random`` and numpy's global generator cannot be given to one thread: a transform drawing
    from them (torchvision v1's ``RandomOrder``, ``RandomChoice``) shares them with the loop.
    Over a torchfeed loader of a map-style dataset, which tells the prefetcher
    each batch's dataset indices, a transform of the whole batch draws image j's parameters
    from (``seed``, epoch, its index): the same augmentation for the same sample in whatever
    batch, rank or world size it comes, resumed, elastic or not. Otherwise (a stream, a plain
    DataLoader, a transform of part of the batch, torchvision's transforms) from a generator
    seeded for the batch from (``seed``, epoch, rank, batch): ranks seeded alike draw apart, and
    over a torchfeed loader a run resumed on the same world size draws what the uninterrupted
    one drew.

    A DataLoader without workers (``num_workers=0``, torchfeed's or a plain one) reads in this
    process, where its samples' augmentation draws from torch's, numpy's and ``random``'s global
    generators (a torchfeed loader seeds them for each sample): it is read in the training
    loop's thread (``depth`` batches ahead, at each step), where those draws and the loop's take
    turns; read in the prefetcher's thread, the samples' augmentation and the loop's own draws
    changed from run to run. Its reads then do not overlap the step: give it workers for that
    (``num_workers=1`` is enough for pre-tokenized text). Any other iterable (a generator of
    batches) is read in the prefetcher's thread; one whose reads draw from those generators in
    this process shares them with a loop that draws too.
    ``seed=None``: the seed the loader's samples draw from (a torchfeed loader's, its
    sampler's ``seed``, its ``generator``'s initial seed), else ``torch.initial_seed()`` when
    the prefetcher is made: ranks seeded apart (``torch.manual_seed(rank)``) whose sampler or
    generator is seeded alike draw alike for a sample.
    """

    def __init__(
        self,
        loader: Iterable,
        device: torch.device | str | None = None,
        pinned_ring: PinnedRing | bool | None = None,
        transform: Callable[[Any], Any] | None = None,
        depth: int = 2,
        seed: int | None = None,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be an int >= 1, got {depth!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        if pinned_ring is not None and not isinstance(pinned_ring, PinnedRing | bool):
            raise TypeError(
                f"pinned_ring must be a PinnedRing, None or False, got {type(pinned_ring).__name__}"
            )
        self.loader = loader
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError(f"device {self.device} requested but no CUDA GPU is usable")
            if self.device.index is None:
                self.device = torch.device("cuda", torch.cuda.current_device())
            self.stream: torch.cuda.Stream | None = torch.cuda.Stream(self.device)
        else:
            self.stream = None
        # Another device (mps, xpu): the copy and the transform run in the loop's thread, where
        # its work already runs (MPS aborts the process when two threads run ops at once:
        # pytorch/pytorch#197805); the prefetcher's thread reads ahead on the host.
        self._in_loop = self.device.type not in ("cpu", "cuda")
        self.pinned_ring = pinned_ring if isinstance(pinned_ring, PinnedRing) else None
        self._auto_ring = pinned_ring is None and self.device.type == "cuda"
        self._warned_oversize = False
        self.transform = transform
        self.depth = depth
        self.seed = _default_seed(loader) if seed is None else seed
        self._epochs = 0  # iterators made (the epoch of a loader that does not count its own)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        return _PrefetchIterator(self)

    def _ring_for(self, batch: Any) -> PinnedRing | None:
        if self.pinned_ring is None and self._auto_ring:
            nbytes = sum(t.numel() * t.element_size() for t in tensors_of(batch))
            if nbytes:
                # one arena per device for every prefetcher (grown once if a batch needs it):
                # a prefetcher made per epoch page-locks nothing new (capped there: a batch
                # larger than the ring is copied from pageable memory instead)
                need = int(nbytes * 1.25) * (self.depth + 2) + 4096
                self.pinned_ring = PinnedRing.for_device(self.device, need)
        return self.pinned_ring

    def _prepare(self, batch: Any) -> tuple[Any, Any]:
        if self.device.type != "cuda":
            if self.pinned_ring is not None:
                batch = self.pinned_ring.stage(batch)
            return self._transformed(batch), None
        with torch.cuda.stream(self.stream):
            on_device = self._transformed(self._copy(batch))
            ready = torch.cuda.Event()
            ready.record(self.stream)
        return on_device, ready

    def _moved(self, batch: Any, later: _InLoop, generator: torch.Generator, base: int) -> Any:
        """Another device's batch, in the loop's thread: copied there, then transformed."""
        batch = map_tensors(batch, lambda t: t.to(self.device))
        if self.transform is None or later.seed is None:
            return batch
        with drawing_from(generator.manual_seed(later.seed), later.keys, base):
            return self.transform(batch)

    def _transformed(self, batch: Any) -> Any:
        return batch if self.transform is None else self.transform(batch)

    def _copy(self, batch: Any) -> Any:
        """Enqueues the batch's copy to the device on the prefetch stream (the current one)."""
        leaves = tensors_of(batch)
        if leaves and all(t.is_cuda or t.is_pinned() for t in leaves):
            # already page-locked (DataLoader(pin_memory=True), or a zero-copy loader's ring,
            # whose tensors fence their region after this copy themselves): staging would only
            # add a copy
            return map_tensors(batch, lambda t: t.to(self.device, non_blocking=True))
        ring = self._ring_for(batch)
        if ring is not None:
            try:
                # staged and sent in chunks: chunk k's transfer overlaps staging chunk k + 1
                return ring.copy_to_device(batch, self.device, stream=self.stream)
            except ValueError:  # larger than the whole ring: copy without it, warn once
                if not self._warned_oversize:
                    self._warned_oversize = True
                    warnings.warn(
                        f"DevicePrefetcher: a batch is larger than the pinned ring "
                        f"({ring.capacity} bytes); such batches are copied from pageable memory",
                        RuntimeWarning,
                        stacklevel=2,
                    )
        return map_tensors(batch, lambda t: t.to(self.device, non_blocking=True))


class _Producer:
    """The background thread's side. The thread refers to this object only, never to the
    iterator the training loop holds, so dropping that iterator (a ``break``) collects it and
    its ``__del__`` stops the thread."""

    def __init__(self, owner: DevicePrefetcher) -> None:
        self.owner = owner
        self.queue: queue.Queue = queue.Queue(maxsize=owner.depth)
        self.stop = threading.Event()
        it = iter(owner.loader)
        # a torchfeed loader checkpoints the batches the loop has, not those read ahead
        track = getattr(owner.loader, "_track_consumption", None)
        self.counted: Any = cast(Any, owner.loader) if callable(track) else None
        if self.counted is not None:
            self.counted._track_consumption()
        # the transform's draws: each batch's from (seed, epoch, rank, batch) (_batch_rng), the
        # loader's own epoch and count where it keeps them (the same after a resume)
        owner._epochs += 1
        if self.counted is not None:
            self.epoch, self.first = self.counted._sample_epoch(), self.counted._resumed_from
        else:
            self.epoch, self.first = owner._epochs, 0
        # and the rank's: ranks seeded alike (the usual DDP setup) would otherwise crop and flip
        # image j of their batch k alike
        self.rank = rank_and_world_size()[0]
        # a batch of known samples (a map-style dataset through torchfeed.loader): image j's
        # draws from (seed, epoch, its index), whatever batch, rank or world size it comes in
        self.sample_base = _signed(derive_seed(owner.seed, self.epoch, -2))
        self.generator = torch.Generator()
        # A DataLoader without workers reads in this process (a torchfeed one seeds torch's,
        # numpy's and random's global generators for each sample; a dataset's augmentation
        # draws from them): read in the prefetcher's thread, beside the loop's, the two
        # threads' draws interleaved in another order every run. It is read in the loop's
        # thread, at each step for the batch `depth` ahead; the copy and the transform stay in
        # the prefetcher's.
        self.inline = (
            isinstance(owner.loader, torch.utils.data.DataLoader) and owner.loader.num_workers == 0
        )
        self.it: Iterator | None = it if self.inline else None
        self.raw: queue.Queue = queue.Queue()  # read batches for the thread (inline)
        self.in_flight = 0  # read, not yet handed on (inline)
        self.read = 0
        self.thread = threading.Thread(
            target=self.run_inline if self.inline else self.run,
            args=() if self.inline else (it,),
            name="torchfeed-prefetch",
            daemon=True,
        )
        self.thread.start()

    def put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def keys(self) -> list[int] | None:
        """The dataset indices of the batch the loader just yielded, if it knows them."""
        keys = None if self.counted is None else self.counted._batch_keys
        try:
            return None if keys is None else [sample_key(k) for k in _listed(keys)]
        except TypeError:  # (keys a dataset of the user's own takes that are not indices)
            return None

    def prepared(
        self, batch: Any, read: int, tag: int | None, keys: list[int] | None
    ) -> tuple[Any, Any, int | None]:
        """The batch copied and transformed, its ready event, and the loader's count with it
        (``tag``: the loop has that many once it is handed on)."""
        if self.owner.transform is None:  # nothing draws: no generator to seed
            if self.owner._in_loop:
                return batch, _InLoop(None, None), tag
            return (*self.owner._prepare(batch), tag)
        index = self.first + (read if tag is None else tag)
        seed = derive_seed(self.owner.seed, self.epoch, self.rank, index, -2)
        if self.owner._in_loop:
            return batch, _InLoop(seed, keys), tag
        # each image's draws from its sample, where the samples are known
        with drawing_from(self.generator.manual_seed(seed), keys, self.sample_base):
            return (*self.owner._prepare(batch), tag)

    def run(self, it: Iterator) -> None:
        try:
            if self.owner.device.type == "cuda":
                torch.cuda.set_device(self.owner.device)
            for read, batch in enumerate(it, 1):
                if self.stop.is_set():
                    return
                tag = None if self.counted is None else self.counted._batches
                item = self.prepared(batch, read, tag, self.keys())
                del batch
                if not self.put(item):
                    return
            self.put(_END)
        except BaseException as e:  # surfaces in the training loop
            self.put(_Failure(e))
        finally:
            del it  # a DataLoader iterator shuts its workers down here (unless persistent)

    def read_ahead(self) -> None:
        """Inline: reads, in the loop's thread, up to the batch ``depth`` ahead of the one
        about to be handed on; the end, or a read's error, follows the batches before it."""
        while self.it is not None and self.in_flight <= self.owner.depth:
            try:
                batch = next(self.it)
            except Exception as e:  # (an interrupt is raised at once)
                self.it = None
                self.raw.put(_END if isinstance(e, StopIteration) else _Failure(e))
                return
            self.read += 1
            tag = None if self.counted is None else self.counted._batches
            self.raw.put((batch, self.read, tag, self.keys()))
            self.in_flight += 1

    def run_inline(self) -> None:
        try:
            if self.owner.device.type == "cuda":
                torch.cuda.set_device(self.owner.device)
            while not self.stop.is_set():
                try:
                    item = self.raw.get(timeout=0.05)
                except queue.Empty:
                    continue
                if item is not _END and not isinstance(item, _Failure):
                    item = self.prepared(*item)
                if not self.put(item) or item is _END or isinstance(item, _Failure):
                    return
        except BaseException as e:
            self.put(_Failure(e))

    def close(self) -> None:
        self.stop.set()
        self.it = None
        while True:  # unblock a producer waiting to put
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        if self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join(timeout=10)


class _PrefetchIterator:
    def __init__(self, owner: DevicePrefetcher) -> None:
        self._owner = owner
        self._producer = _Producer(owner)
        self._done = False

    def __iter__(self) -> _PrefetchIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        producer = self._producer
        if producer.inline:
            producer.read_ahead()
        while True:
            try:
                item = producer.queue.get(timeout=0.1)
                break
            except queue.Empty:
                if not producer.thread.is_alive() and producer.queue.empty():
                    self.close()
                    raise RuntimeError(
                        "DevicePrefetcher: the prefetch thread ended unexpectedly"
                    ) from None
        if item is _END:
            self.close()
            if producer.counted is not None:  # the loop has the loader's epoch to its end
                producer.counted._ended = True
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        batch, ready, tag = item
        producer.in_flight -= 1
        if isinstance(ready, _InLoop):
            try:
                batch = self._owner._moved(batch, ready, producer.generator, producer.sample_base)
            except BaseException:
                self.close()
                raise
        if tag is not None:
            producer.counted._consumed = tag
        if ready is not None and not isinstance(ready, _InLoop):
            consumer = torch.cuda.current_stream(self._owner.device)
            consumer.wait_event(ready)
            for t in tensors_of(batch):
                if isinstance(t, Tensor) and t.is_cuda:
                    t.record_stream(consumer)  # not reused while the step still reads it
        return batch

    def close(self) -> None:
        """Stops the background thread (idempotent)."""
        self._done = True
        producer = getattr(self, "_producer", None)  # None: the loader failed to start
        if producer is not None:
            producer.close()

    def __del__(self) -> None:
        self.close()
