"""RaggedImages: a batch of uint8 images of different sizes in one buffer, and its collate."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torch.utils.data import default_collate, get_worker_info

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
        tuple(im.shape) if layout == "CHW" else (im.shape[2], im.shape[0], im.shape[1])
        for im in images
    ]


class RaggedImages:
    """B images ``[C, H_i, W_i]`` (one channel count, one dtype, uint8 in practice) packed into
    one 1-D buffer; each image is stored whole, in ``layout`` order (``"CHW"`` or ``"HWC"``).

    Sizes live on the host, so the images can be viewed, sent to a device (one copy for the
    whole batch) and resampled without reading device memory. Picklable and pinnable.
    """

    __slots__ = ("_offsets", "_shapes", "data", "layout")

    def __init__(
        self, data: Tensor, shapes: Sequence[tuple[int, int, int]], layout: Layout = "CHW"
    ) -> None:
        check_layout(layout)
        if not isinstance(data, Tensor) or data.dim() != 1:
            raise TypeError("data must be a 1-D tensor holding the packed images")
        shapes = [tuple(int(v) for v in s) for s in shapes]
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

    # --- views and movement ------------------------------------------------------------------
    def __getitem__(self, i: int) -> Tensor:
        """Image i as a ``[C, H, W]`` view (strided when the layout is HWC)."""
        c, h, w = self._shapes[i]
        flat = self.data[self._offsets[i] : self._offsets[i + 1]]
        if self.layout == "CHW":
            return flat.view(c, h, w)
        return flat.view(h, w, c).permute(2, 0, 1)

    def images(self) -> list[Tensor]:
        return [self[i] for i in range(len(self))]

    def to(self, *args, non_blocking: bool = False, **kwargs) -> RaggedImages:
        return self._with(self.data.to(*args, non_blocking=non_blocking, **kwargs))

    def pin_memory(self) -> RaggedImages:
        return self._with(self.data.pin_memory())

    def is_pinned(self) -> bool:
        return self.data.is_pinned()

    def _with(self, data: Tensor) -> RaggedImages:
        out = object.__new__(RaggedImages)
        out.data, out.layout, out._shapes, out._offsets = (
            data,
            self.layout,
            self._shapes,
            self._offsets,
        )
        return out

    def __repr__(self) -> str:
        return (
            f"RaggedImages(batch_size={len(self)}, channels={self.channels}, layout={self.layout!r}"
            f", dtype={self.data.dtype}, device={self.data.device})"
        )


class ImageCollate:
    """A ``collate_fn`` for samples holding one image of any size: the image field becomes a
    :class:`RaggedImages` (one buffer, in shared memory inside a worker), every other field goes
    through ``default_collate``. Samples are dicts (``image_key`` a key), tuples (a position) or
    bare images."""

    def __init__(
        self,
        image_key: str | int = 0,
        layout: Layout = "CHW",
        ring: Any = None,
        transform: Any = None,
    ) -> None:
        check_layout(layout)
        if transform is not None:
            if not hasattr(transform, "apply") or not hasattr(transform, "output_shape"):
                raise TypeError(
                    "transform must be a torchfeed batch transform "
                    "(RandomResizedCropFlipNormalize, ResizeFlipNormalize or "
                    f"ResizeCenterCropNormalize), got {type(transform).__name__}"
                )
            if transform.image_layout != layout:
                raise ValueError(
                    f"transform.image_layout={transform.image_layout!r} but the collate's "
                    f"layout={layout!r}: they must agree"
                )
        self.image_key = image_key
        self.layout = layout
        self.ring = ring  # a torchfeed.shared.SharedRing: workers collate into it (zero copy)
        self.transform = transform  # applied to the batch here (in the workers)

    def __call__(self, batch: Sequence[Any]) -> Any:
        if not batch:
            raise ValueError("ImageCollate: batch is empty")
        zero_copy = self.ring is not None and get_worker_info() is not None
        if self.transform is not None:
            pack_images = self._lazy_transformed if zero_copy else self._transformed
        else:
            pack_images = _lazy_images if zero_copy else RaggedImages.from_images
        other = private_collate if zero_copy else default_collate
        first = batch[0]
        if isinstance(first, Tensor):
            out: Any = pack_images(batch, self.layout)
        elif isinstance(first, Mapping):
            if self.image_key not in first:
                raise KeyError(f"ImageCollate: samples have no field {self.image_key!r}")
            out = {
                k: pack_images([s[k] for s in batch], self.layout)
                if k == self.image_key
                else other([s[k] for s in batch])
                for k in first
            }
        elif isinstance(first, tuple | list):
            key = self.image_key
            if not isinstance(key, int) or not 0 <= key < len(first):
                raise KeyError(f"ImageCollate: samples have no position {key!r}")
            fields = [
                pack_images([s[j] for s in batch], self.layout)
                if j == key
                else other([s[j] for s in batch])
                for j in range(len(first))
            ]
            out = type(first)(fields) if isinstance(first, tuple) else fields
        else:
            raise TypeError(
                f"ImageCollate: samples must be images, dicts or tuples, got {type(first).__name__}"
            )
        return self.ring.pack(out) if zero_copy else out

    def _transformed(self, images: Sequence[Tensor], layout: Layout) -> Tensor:
        return self.transform.apply(list(images))[0]

    def _lazy_transformed(self, images: Sequence[Tensor], layout: Layout) -> Any:
        """The transform's output, written by the fused kernel straight into the ring."""
        from torchfeed.shared import Lazy

        images = list(images)
        channels = image_shapes(images, layout)[0][0]
        b, c, h, w = self.transform.output_shape(len(images), channels)
        if self.transform.channels_last:  # stored as [B, H, W, C], viewed as [B, C, H, W]
            shape, permute = (b, h, w, c), (0, 3, 1, 2)
        else:
            shape, permute = (b, c, h, w), None
        return Lazy(
            self.transform.dtype,
            shape,
            lambda out: self.transform.apply(images, out=out),
            lambda: self._transformed(images, layout),
            permute,
        )


def _lazy_images(images: Sequence[Tensor], layout: Layout) -> RaggedImages:
    """RaggedImages whose buffer ``SharedRing.pack`` writes straight into the ring."""
    from torchfeed.shared import concat

    images = list(images)
    shapes = image_shapes(images, layout)
    views, stored = storage_views(images, layout)
    out = object.__new__(RaggedImages)
    out.data = concat(views)
    out.layout = stored
    out._shapes = tuple(shapes)
    out._offsets = tuple(itertools.accumulate((c * h * w for c, h, w in shapes), initial=0))
    return out


def private_collate(values: list) -> Any:
    """default_collate for the other fields of a zero-copy batch, in private memory
    (default_collate allocates shared memory inside a worker, which the ring replaces)."""
    first = values[0]
    if isinstance(first, Tensor):
        return torch.stack(values)
    if isinstance(first, bool | int | float) and all(type(v) is type(first) for v in values):
        return torch.tensor(values, dtype=torch.float64 if isinstance(first, float) else None)
    return default_collate(values)
