"""RaggedImages: a batch of uint8 images of different sizes in one buffer."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch import Tensor

from torchfeed._packing import (
    Layout,
    check_layout,
    empty_for_batch,
    image_shapes,
    storage_views,
)
from torchfeed.memory import _recycled

__all__ = ["RaggedImages"]


class RaggedImages:
    """B images ``[C, H_i, W_i]`` (one channel count, one dtype, uint8 in practice) packed into
    one 1-D buffer; each image is stored whole, in ``layout`` order (``"CHW"`` or ``"HWC"``).

    Sizes live on the host, so the images can be viewed, sent to a device (one copy for the
    whole batch) and resampled without reading device memory. Picklable and pinnable.
    """

    __slots__ = ("_lent", "_offsets", "_packed", "_shapes", "data", "layout")

    def __init__(
        self, data: Tensor, shapes: Sequence[tuple[int, int, int]], layout: Layout = "CHW"
    ) -> None:
        check_layout(layout)
        if not isinstance(data, Tensor) or data.dim() != 1:
            raise TypeError("data must be a 1-D tensor holding the packed images")
        shapes = [tuple(int(v) for v in s) for s in shapes]  # type: ignore[misc]
        for i, s in enumerate(shapes):
            if len(s) != 3 or min(s) < 0:
                raise ValueError(f"shapes[{i}] must be (C, H, W) with sizes >= 0, got {s}")
            if s[0] != shapes[0][0]:
                raise ValueError(
                    f"shapes[{i}] has {s[0]} channels but shapes[0] has {shapes[0][0]}"
                )
        offsets = [0, *itertools.accumulate(c * h * w for c, h, w in shapes)]
        if offsets[-1] != data.shape[0]:
            raise ValueError(
                f"data holds {data.shape[0]} elements but the shapes need {offsets[-1]}"
            )
        self.data = data
        self.layout = layout
        self._shapes = tuple(shapes)
        self._offsets = tuple(offsets)
        self._packed: Tensor | None = None
        self._lent: _recycled.Lent | None = None

    @classmethod
    def from_images(
        cls, images: Sequence[Tensor], layout: Layout = "CHW", *, recycle: bool = False
    ) -> RaggedImages:
        """Packs ``[C, H_i, W_i]`` images (``layout="CHW"``) or ``[H_i, W_i, C]`` ones
        (``"HWC"``, as PIL and numpy decode them) with one copy, keeping the order the pixels
        already have in memory (so ``.layout`` may differ from ``layout``). In a DataLoader
        worker the buffer is in shared memory; with ``recycle``, in the worker's own reused
        shared memory when it has room (:mod:`torchfeed.memory._recycled`)."""
        images = list(images)
        shapes = image_shapes(images, layout)
        views, stored = storage_views(images, layout)
        numel = sum(im.numel() for im in images)
        first = images[0]
        recycled = recycle and first.device.type == "cpu"
        lent = _recycled.lend(numel * first.element_size()) if recycled else None
        data = lent[0].view(first.dtype) if lent is not None else empty_for_batch(numel, first)
        torch.cat([v.reshape(-1) for v in views], out=data)
        out = cls(data, shapes, stored)
        out._lent = None if lent is None else lent[1]
        return out

    @classmethod
    def over(
        cls, data: Any, shapes: Sequence[tuple[int, int, int]], layout: Layout
    ) -> RaggedImages:
        """Images of checked ``shapes`` over ``data`` without checking it: a buffer that is
        not written yet (a :class:`torchfeed._tree.Lazy` that a ring fills)."""
        out = object.__new__(cls)
        out.data, out.layout = data, layout
        out._shapes = tuple((int(c), int(h), int(w)) for c, h, w in shapes)
        out._offsets = tuple(itertools.accumulate((c * h * w for c, h, w in shapes), initial=0))
        out._packed = None
        out._lent = None
        return out

    def __len__(self) -> int:
        return len(self._shapes)

    @property
    def shapes(self) -> tuple[tuple[int, int, int], ...]:
        """(C, H, W) of each image."""
        return self._shapes

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """(H, W) of each image."""
        return [(h, w) for _, h, w in self._shapes]

    @property
    def channels(self) -> int:
        return self._shapes[0][0] if self._shapes else 0

    @property
    def device(self) -> torch.device:
        return self.data.device

    def __getitem__(self, i: int) -> Tensor:
        """Image i as a ``[C, H, W]`` view (strided when the layout is HWC)."""
        c, h, w = self._shapes[i]
        flat = self.data[self._offsets[i] : self._offsets[i + 1]]
        if self.layout == "CHW":
            return flat.view(c, h, w)
        return flat.view(h, w, c).permute(2, 0, 1)

    def images(self) -> list[Tensor]:
        return [self[i] for i in range(len(self))]

    def tensors(self) -> tuple[Tensor]:
        return (self.data,)

    def with_tensors(self, tensors: Sequence[Tensor]) -> RaggedImages:
        """The same images over another buffer (a moved or staged copy of ``data``)."""
        out = object.__new__(RaggedImages)
        (out.data,) = tensors
        out.layout, out._shapes, out._offsets = self.layout, self._shapes, self._offsets
        out._packed = self._packed
        out._lent = None
        return out

    def packed_shapes(self) -> Tensor:
        """``[B, 4]`` int64 on the host: (offset into ``data``, C, H, W) of each image, as the
        crop op takes a packed batch (made once per batch)."""
        if self._packed is None:
            self._packed = torch.tensor(
                [(o, *s) for o, s in zip(self._offsets, self._shapes, strict=False)],
                dtype=torch.int64,
            ).reshape(-1, 4)
        return self._packed

    def __getstate__(self) -> tuple:
        return self.data, self.layout, self._shapes, self._offsets

    def __setstate__(self, state: tuple) -> None:
        self.data, self.layout, self._shapes, self._offsets = state
        self._packed = None
        self._lent = None

    def to(self, *args: Any, non_blocking: bool = False, **kwargs: Any) -> RaggedImages:
        data = self.data.to(*args, non_blocking=non_blocking, **kwargs)  # type: ignore[call-overload]
        return self.with_tensors((data,))

    def pin_memory(self) -> RaggedImages:
        return self.with_tensors((self.data.pin_memory(),))

    def is_pinned(self) -> bool:
        return self.data.is_pinned()

    def __repr__(self) -> str:
        return (
            f"RaggedImages(batch_size={len(self)}, channels={self.channels}, layout={self.layout!r}"
            f", dtype={self.data.dtype}, device={self.data.device})"
        )


def _reduce_for_queue(images: RaggedImages) -> Any:
    """How a RaggedImages crosses a multiprocessing queue (a DataLoader worker's): a batch in its
    worker's recycled memory as the region's handle, once; anything else as it pickles."""
    lent = getattr(images, "_lent", None)
    data = images.data
    if (
        lent is not None
        and data.data_ptr() == lent.address
        and data.numel() * data.element_size() == lent.nbytes
        and lent.hand_over()
    ):
        return _received, (*lent.reduce_args(), data.dtype, images._shapes, images.layout)
    return images.__reduce_ex__(4)


def _received(
    ref: _recycled.RingRef,
    slot: int,
    generation: int,
    nbytes: int,
    owner: int,
    dtype: torch.dtype,
    shapes: tuple[tuple[int, int, int], ...],
    layout: Layout,
) -> RaggedImages:
    data = _recycled.receive(ref, slot, generation, nbytes, owner).view(dtype)
    return RaggedImages(data, shapes, layout)


ForkingPickler.register(RaggedImages, _reduce_for_queue)
