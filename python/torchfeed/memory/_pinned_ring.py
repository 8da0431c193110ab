"""PinnedRing: a bounded, exact-size, fenced ring of page-locked host memory."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from torchfeed._extension import C
from torchfeed._tree import carve, field_layout, map_tensors, tensors_of
from torchfeed.memory._budget import memory_budget
from torchfeed.memory._fenced import fenced
from torchfeed.memory._ring_base import DEFAULT, RingBase, check_timeout

__all__ = ["CHUNK_BYTES", "PinnedRing"]

# Chunks of a pipelined copy: small enough that staging the first one is short, large enough
# that each transfer runs near the bus's peak.
CHUNK_BYTES = 4 << 20
_SHARED: dict[str, PinnedRing] = {}


class PinnedRing(RingBase):
    """One arena of ``capacity`` bytes, allocated once: page-locked through the CUDA runtime
    when a GPU is usable (``pinned=None``), page-aligned host memory otherwise (optionally
    ``mlock``-ed: without CAP_IPC_LOCK, a capacity beyond RLIMIT_MEMLOCK is refused with both
    numbers, never handed back unlocked). Blocks of exact sizes (rounded up to ``alignment``)
    are handed out in FIFO order with wrap-around.

    A block's bytes are reused only after its fence completed: every host tensor viewing it has
    been freed (the consumer released it) and every copy that reads it (:meth:`to_device`,
    :meth:`copy_to_device`) has run: a host function queued on the copy's stream after it frees
    the block, so no event is recorded or polled. A full ring blocks the producer for up to
    ``timeout`` seconds, then raises ``TimeoutError`` naming the capacity, the bytes in flight
    and the request; a request larger than the arena raises ``ValueError`` at once.
    Thread-safe: one thread can stage while another consumes.
    """

    def __init__(
        self,
        capacity: int,
        *,
        alignment: int = 256,
        pinned: bool | None = None,
        mlock: bool = False,
        timeout: float | None = 30.0,
    ) -> None:
        for name, value in (("capacity", capacity), ("alignment", alignment)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        self.timeout = check_timeout(timeout)
        flag = -1 if pinned is None else int(bool(pinned))
        self._ring = C._PinnedRing(capacity, alignment, flag, bool(mlock))
        self._base = self._ring.data_address

    def allocate(self, nbytes: int, timeout: float | None = DEFAULT) -> Tensor:
        """A uint8 tensor ``[nbytes]`` over a fresh block, held until it (and every view of it)
        is freed."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__}")
        return fenced(self._ring.allocate(nbytes, self._wait(timeout)), self)

    @property
    def alignment(self) -> int:
        return self._ring.alignment

    def stats(self) -> dict[str, Any]:
        """capacity, bytes_in_use, high_water, blocks_in_flight, allocations, waits,
        wait_seconds, pinned, locked."""
        return self._ring.stats()

    def blocks(self) -> list[tuple[int, int, int, bool, int]]:
        """(id, offset, size, held by a host tensor, copies pending) of each live block."""
        return self._ring.blocks()

    def stage(self, batch: Any, timeout: float | None = DEFAULT) -> Any:
        """Copies every CPU tensor of a nested batch into ONE ring block and returns the same
        structure viewing ring memory (``is_pinned()`` on a GPU machine). Tensors already on a
        device are left as they are."""
        leaves = [t for t in tensors_of(batch) if t.device.type == "cpu"]
        if not leaves:
            return batch
        offsets, total = field_layout(leaves)
        block = self.allocate(total, timeout)

        def place(t: Tensor) -> Tensor:
            if t.device.type != "cpu":
                return t
            view = carve(block, offsets[id(t)], t.nbytes, t.dtype, t.shape)
            view.copy_(t)
            return view

        return map_tensors(batch, place)

    def to_device(
        self,
        staged: Any,
        device: torch.device | str,
        non_blocking: bool = True,
        stream: torch.cuda.Stream | None = None,
    ) -> Any:
        """Enqueues the copies of a staged batch to ``device`` on ``stream`` (default: the
        current stream), records the blocks' fences after them, and returns the device batch.

        If ``stream`` is not the current stream, the current stream is made to wait for it and
        every device tensor is marked as used by the current stream (``record_stream``), so the
        batch is safe to use right away on the current stream."""
        device = torch.device(device)
        if device.type != "cuda":
            return map_tensors(staged, lambda t: t.to(device))
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        consumer = torch.cuda.current_stream(device)
        stream = consumer if stream is None else stream
        with torch.cuda.stream(stream):  # the ring's tensors fence themselves after the copies
            out = map_tensors(staged, lambda t: t.to(device, non_blocking=non_blocking))
        if stream != consumer:
            consumer.wait_stream(stream)
            for t in tensors_of(out):
                if t.is_cuda:
                    t.record_stream(consumer)
        return out

    def copy_to_device(
        self,
        batch: Any,
        device: torch.device | str,
        stream: torch.cuda.Stream | None = None,
        timeout: float | None = DEFAULT,
        chunk_bytes: int = CHUNK_BYTES,
    ) -> Any:
        """Stages every CPU tensor of a nested batch into ONE block and copies the block to
        ``device`` in chunks of ``chunk_bytes``: each chunk's copy starts as soon as that chunk
        is staged (staging chunk k + 1 overlaps the transfer of chunk k; the staging of a chunk
        is split over the intra-op threads), and the block is fenced once. Returns the batch on
        the device, its tensors views of one device buffer, safe to use on the current stream
        (as with :meth:`to_device`). A pageable batch thus costs about one transfer, not a copy
        into pinned memory followed by a transfer."""
        device = torch.device(device)
        if device.type != "cuda":
            return map_tensors(self.stage(batch, timeout), lambda t: t.to(device))
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        leaves = [t for t in tensors_of(batch) if t.device.type == "cpu"]
        if not leaves:
            return batch
        offsets, total = field_layout(leaves)
        block = self.allocate(total, timeout)
        consumer = torch.cuda.current_stream(device)
        stream = consumer if stream is None else stream
        with torch.cuda.stream(stream):
            target = torch.empty(total, dtype=torch.uint8, device=device)
        self._ring.stage_and_copy(
            leaves, [offsets[id(t)] for t in leaves], block, target, stream.cuda_stream, chunk_bytes
        )
        del block  # the fence keeps the block until the copies are done

        def place(t: Tensor) -> Tensor:
            if t.device.type != "cpu":
                return t
            return carve(target, offsets[id(t)], t.nbytes, t.dtype, t.shape)

        out = map_tensors(batch, place)
        if stream != consumer:
            consumer.wait_stream(stream)
            target.record_stream(consumer)  # every tensor of `out` views it
        return out

    @classmethod
    def for_device(cls, device: torch.device | str, capacity: int) -> PinnedRing:
        """A process-wide page-locked ring for copies to ``device`` with at least ``capacity``
        bytes: the one made before if it is big enough (grown once, otherwise), so that a
        prefetcher made per epoch does not page-lock a new arena each time (that costs
        milliseconds). Safe to share: blocks return to the ring as soon as their copies are
        done. Every byte of it is page-locked, so it gets at most half the memory this process
        may use (the machine's, or the container's limit where lower, divided among the ranks
        torchrun started here: ``LOCAL_WORLD_SIZE``), whatever ``capacity`` asks."""
        most = memory_budget().share(2)
        key = str(torch.device(device))
        ring = _SHARED.get(key)
        if ring is None or ring.closed or ring.capacity < min(capacity, most):
            grown = max(capacity, 2 * ring.capacity if ring is not None else 0)
            ring = cls(min(grown, most))
            _SHARED[key] = ring
        return ring

    def close(self, timeout: float | None = DEFAULT) -> None:
        """No more allocations; frees the arena once no copy from it is pending (waiting up to
        ``timeout`` seconds for those). Tensors still viewing the ring keep the arena alive
        until they are freed."""
        self._ring.close(self._wait(timeout))

    @property
    def closed(self) -> bool:
        return self._ring.closed

    def __enter__(self) -> PinnedRing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"PinnedRing(capacity={s['capacity']}, pinned={s['pinned']}, "
            f"bytes_in_use={s['bytes_in_use']}, blocks_in_flight={s['blocks_in_flight']})"
        )
