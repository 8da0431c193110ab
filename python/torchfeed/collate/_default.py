"""``default_collate``'s batches, written once into memory the worker reuses:
:class:`DefaultCollate`, the ``collate_fn`` for per-sample pipelines (a dataset whose samples are
already the tensors a step takes: a torchvision or fused transform in ``__getitem__``)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import default_collate

from torchfeed._options import check_bool
from torchfeed.collate._fields import lazy_collate, leave_worker
from torchfeed.memory import SharedRing

__all__ = ["DefaultCollate"]


class DefaultCollate:
    """``default_collate``, with each batch written once into shared memory its DataLoader
    worker reuses: ``DataLoader(dataset, collate_fn=torchfeed.DefaultCollate())`` for a dataset
    whose samples are already what the step takes (a per-sample transform:
    ``ImageFolder(root, loader=torchfeed.decode.read_file, transform=torchfeed.fuse(compose))``).

    The batches are ``default_collate``'s: the same types (plain dicts, lists, tuples,
    namedtuples), values, dtypes and shapes, nested fields too. Only where they live changes. In
    a worker, ``default_collate`` stacks every tensor field into a fresh shared-memory file,
    which the worker faults in page by page, batch after batch (38.5 MB for 64 float images of
    224 x 224); here a dict, list, tuple or namedtuple batch is written once into a region of
    the worker's own shared memory (recycled, as :class:`~torchfeed.ImageCollate` and
    :class:`~torchfeed.PadCollate` do), which goes back to the worker once the main process has
    freed the batch. A consumer that keeps many batches never waits: what has no room takes the
    ordinary path, as does any batch of another type, outside workers, or ``recycle=False``.
    :func:`torchfeed.loader` uses it when given no ``collate_fn``; with ``zero_copy=True`` the
    batches are written into the loader's shared ring instead."""

    def __init__(self, recycle: bool = True, shared_ring: SharedRing | None = None) -> None:
        self.recycle = check_bool("recycle", recycle)
        # a torchfeed SharedRing: inside DataLoader workers, batches are collated into it
        self.shared_ring = shared_ring

    def with_shared_ring(self, shared_ring: SharedRing | None) -> DefaultCollate:
        """A copy of this collate that writes its batches into ``shared_ring`` inside DataLoader
        workers (``None``: a copy that does not)."""
        return DefaultCollate(self.recycle, shared_ring)

    def __call__(self, batch: list) -> Any:
        return leave_worker(
            lambda lazy: lazy_collate(batch) if lazy else default_collate(batch),
            self.shared_ring,
            self.recycle,
        )

    def __repr__(self) -> str:
        return "DefaultCollate()" if self.recycle else "DefaultCollate(recycle=False)"
