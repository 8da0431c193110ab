"""RaggedImages: a batch of uint8 images of different sizes in one buffer."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import get_worker_info

__all__ = [
    "Layout",
    "RaggedImages",
    "check_layout",
    "empty_for_batch",
    "image_shapes",
    "storage_views",
]

Layout = Literal["CHW", "HWC"]


def check_layout(layout: str) -> None:
    if layout not in ("CHW", "HWC"):
        raise ValueError(f"image_layout must be 'CHW' or 'HWC', got {layout!r}")


def empty_for_batch(numel: int, like: Tensor) -> Tensor:
    """A 1-D tensor for a collated batch: in a DataLoader worker it is allocated in shared memory,
    as default_collate does, so sending it to the main process copies nothing."""
    if get_worker_info() is not None and like.device.type == "cpu":
        storage = like._typed_storage()._new_shared(numel, device=like.device)
        return like.new(storage)[:numel]
    return like.new_empty(numel)


def storage_views(images: Sequence[Tensor], layout: Layout) -> tuple[list[Tensor], Layout]:
    """The images as they will be copied, and the layout that copy has: the order they already
    have in memory (decoders such as torchvision's return [C, H, W] views of HWC memory), so
    packing is a plain memcpy, never a transposition."""
    chw = [im if layout == "CHW" else im.permute(2, 0, 1) for im in images]
    if all(v.is_contiguous() for v in chw):
        return chw, "CHW"
    hwc = [v.permute(1, 2, 0) for v in chw]
    if all(v.is_contiguous() for v in hwc):
        return hwc, "HWC"
    return chw, "CHW"  # mixed or strided: copied into CHW order


def image_shapes(images: Sequence[Tensor], layout: Layout) -> list[tuple[int, int, int]]:
    """(C, H, W) of each image, after checking they can be packed together."""
    check_layout(layout)
    if not images:
        raise ValueError("images must hold at least one image, got none")
    for i, im in enumerate(images):
        if not isinstance(im, Tensor):
            raise TypeError(f"images[{i}] must be a tensor, got {type(im).__name__}")
        if im.dim() != 3:
            raise ValueError(
                f"images[{i}] must be 3-D ({'[C, H, W]' if layout == 'CHW' else '[H, W, C]'})"
                f", got shape {list(im.shape)}"
            )
        if im.dtype != images[0].dtype or im.device != images[0].device:
            raise TypeError(
                f"images[{i}] is {im.dtype} on {im.device} but images[0] is "
                f"{images[0].dtype} on {images[0].device}"
            )
    return [
        (im.shape[0], im.shape[1], im.shape[2])
        if layout == "CHW"
        else (im.shape[2], im.shape[0], im.shape[1])
        for im in images
    ]


class RaggedImages:
    """B images ``[C, H_i, W_i]`` (one channel count, one dtype, uint8 in practice) packed into
    one 1-D buffer; each image is stored whole, in ``layout`` order (``"CHW"`` or ``"HWC"``).

    Sizes live on the host, so the images can be viewed, sent to a device (one copy for the
    whole batch) and resampled without reading device memory. Picklable and pinnable.
    """

    __slots__ = ("_offsets", "_packed", "_shapes", "data", "layout")

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

    @classmethod
    def from_images(cls, images: Sequence[Tensor], layout: Layout = "CHW") -> RaggedImages:
        """Packs ``[C, H_i, W_i]`` images (``layout="CHW"``) or ``[H_i, W_i, C]`` ones
        (``"HWC"``, as PIL and numpy decode them) with one copy, keeping the order the pixels
        already have in memory (so ``.layout`` may differ from ``layout``)."""
        images = list(images)
        shapes = image_shapes(images, layout)
        views, stored = storage_views(images, layout)
        data = empty_for_batch(sum(im.numel() for im in images), images[0])
        torch.cat([v.reshape(-1) for v in views], out=data)
        return cls(data, shapes, stored)

    @classmethod
    def over(
        cls, data: Any, shapes: Sequence[tuple[int, int, int]], layout: Layout
    ) -> RaggedImages:
        """Images of checked ``shapes`` over ``data`` without checking it: a buffer that is
        not written yet (a :class:`torchfeed.tree.Lazy` that a ring fills)."""
        out = object.__new__(cls)
        out.data, out.layout = data, layout
        out._shapes = tuple((int(c), int(h), int(w)) for c, h, w in shapes)
        out._offsets = tuple(itertools.accumulate((c * h * w for c, h, w in shapes), initial=0))
        out._packed = None
        return out

    # --- facts, from the host ----------------------------------------------------------------
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

    # --- views and movement (and the torchfeed.tree protocol) ---------------------------------
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
