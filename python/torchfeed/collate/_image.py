"""ImageCollate: a ``collate_fn`` for samples holding one image of any size."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import PIL.Image
import torch
from torch import Tensor
from torch.utils.data import default_collate

from torchfeed._packing import Layout, check_layout, image_shapes, storage_views
from torchfeed._pil import OP_IMAGE_TYPES, as_op_image
from torchfeed._tree import Lazy, concat
from torchfeed.collate._fields import lazy_collate, leave_worker
from torchfeed.images import RaggedImages
from torchfeed.memory import SharedRing

__all__ = ["BatchTransform", "ImageCollate"]


class BatchTransform(Protocol):
    """What ImageCollate needs of a transform to run it on the batch (torchfeed's batch
    transforms): the output's shape, dtype and memory format known before it is written, and
    ``apply`` writing it into a given buffer (a zero-copy ring's region)."""

    @property
    def image_layout(self) -> Layout: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def channels_last(self) -> bool: ...

    def output_shape(self, images: Sequence[Tensor]) -> tuple[int, int, int, int]: ...

    def apply(self, images: Any, out: Tensor | None = None) -> tuple[Tensor, Any, Any]: ...


def _as_tensor(image: Any, hwc: bool) -> Any:
    """An image as a tensor in the collate's layout, as a transform takes it (a PIL image's
    pixels, a numpy array wrapped); anything else as it is, for the packing's own checks."""
    return as_op_image(image, hwc) if isinstance(image, OP_IMAGE_TYPES) else image


def _is_batch_transform(t: Any) -> bool:
    return hasattr(t, "apply") and hasattr(t, "output_shape")


def _batch_transform(transform: Any) -> BatchTransform:
    """ImageCollate's ``transform``: a torchfeed batch transform, or ``torchfeed.fuse(compose)``
    of a Compose that fused whole (one fused step, which runs on a batch as it does per sample).
    Anything else is refused, saying where a per-sample Compose goes."""
    if _is_batch_transform(transform):
        return transform
    steps = getattr(transform, "transforms", None)
    if isinstance(steps, list) and len(steps) == 1 and _is_batch_transform(steps[0]):
        return steps[0]
    fused = isinstance(steps, list) and any(_is_batch_transform(t) for t in steps)
    hint = (
        f"; this fused Compose keeps {len(steps or [])} steps, of which torchfeed runs only the "
        "fused ones on a batch: give the dataset the Compose (per sample), or the collate a "
        "torchfeed transform with the steps it can fuse"
        if fused
        else "; a torchvision Compose runs per sample: give it to the dataset "
        "(ImageFolder(transform=torchfeed.fuse(compose))), or the collate "
        "torchfeed.fuse(compose) when every step fuses"
    )
    raise TypeError(
        "transform must be a torchfeed batch transform (RandomResizedCropFlipNormalize, "
        "ResizeRandomFlipNormalize, ResizeCenterCropNormalize, or torchfeed.fuse of a Compose "
        f"that fuses whole), got {type(transform).__name__}" + ("" if steps is None else hint)
    )


def _no_image_field(sample: Mapping, key: Any) -> str:
    """What ImageCollate says when a dict sample has no ``image_key``: its keys, and the ones
    holding an image (a 3-D tensor or a PIL image) to name instead (ImageCollate's default, 0,
    is a tuple's first field: a dict sample needs its key named)."""
    images = [
        k
        for k, v in sample.items()
        if (isinstance(v, Tensor) and v.dim() == 3) or isinstance(v, PIL.Image.Image)
    ]
    hint = f"; the image is under {images[0]!r}: pass image_key={images[0]!r}" if images else ""
    return (
        f"ImageCollate: samples are dicts with the keys {list(sample)}, and image_key={key!r} is "
        f"not one of them{hint}"
    )


class ImageCollate:
    """A ``collate_fn`` for samples holding one image of any size: the image field becomes a
    :class:`RaggedImages` (one buffer, in shared memory inside a worker), every other field goes
    through ``default_collate``. Samples are dicts (``image_key`` a key), tuples or lists (a
    position), namedtuples (a position or a field name) or bare images. Images are uint8
    tensors (``[C, H, W]``, or ``[H, W, C]`` with ``layout="HWC"``), PIL images or numpy arrays
    ``[H, W, C]``, as a v2 transform takes them (an ``ImageFolder``'s default loader and a
    Hugging Face image column give PIL images). ``transform``, run on the batch: a torchfeed
    batch transform, or ``torchfeed.fuse`` of a v2 Compose whose steps all fuse.

    In an ordinary DataLoader's workers, ``recycle=True`` (the default) packs the batch (the images,
    or the transform's output, with the other fields beside them, each written there once) into
    shared memory each worker reuses, batch after batch, rather than a fresh shared-memory file per
    tensor and batch: the main process gets a batch viewing it, and the memory goes back to the
    worker when that batch is freed. Fields of at most 64 KiB (labels) arrive as copies of their
    own, so that keeping them holds none of the batch's memory. The pages a worker has written stay
    allocated for reuse (at most about the batches it has in flight at once), and the main process
    keeps them mapped while the worker lives, so reading the next batch faults nothing in (its
    resident size counts them; they are the worker's memory, not a copy); ``recycle=False`` gives
    the ordinary path."""

    def __init__(
        self,
        image_key: str | int = 0,
        layout: Layout = "CHW",
        transform: BatchTransform | None = None,
        *,
        shared_ring: SharedRing | None = None,
        recycle: bool = True,
    ) -> None:
        check_layout(layout)
        if not isinstance(recycle, bool):
            raise TypeError(f"recycle must be True or False, got {recycle!r}")
        if transform is not None:
            transform = _batch_transform(transform)
            if transform.image_layout != layout:
                raise ValueError(
                    f"transform.image_layout={transform.image_layout!r} but the collate's "
                    f"layout={layout!r}: they must agree"
                )
        self.image_key = image_key
        self.layout = layout
        # a torchfeed.SharedRing: inside DataLoader workers, batches are collated into it
        self.shared_ring = shared_ring
        self.transform = transform  # applied to the batch here (in the workers)
        self.recycle = recycle

    def with_shared_ring(self, shared_ring: SharedRing | None) -> ImageCollate:
        """A copy of this collate that packs its batches into ``shared_ring`` inside DataLoader
        workers (``None``: a copy that does not); this one is left as it is."""
        bound = copy.copy(self)
        bound.shared_ring = shared_ring
        return bound

    def __call__(self, batch: Sequence[Any]) -> Any:
        if not batch:
            raise ValueError("ImageCollate: batch is empty")
        # In a worker, every field in one region of the zero-copy ring or of the worker's
        # recycled memory: the images (or the transform's output) written there once, the
        # labels beside them, where the ordinary path takes a fresh shared-memory file per
        # tensor. A batch that cannot cross recycled (no room now; bare images, a RaggedImages
        # alone) takes the ordinary path, its images in memory of their own.
        return leave_worker(lambda lazy: self._collate(batch, lazy), self.shared_ring, self.recycle)

    def _collate(self, batch: Sequence[Any], lazy: bool) -> Any:
        """The batch, with ``lazy``: its images (or the transform's output) as buffers written
        once their memory is known (a ring's region), and the other fields' tensors too."""
        if self.transform is not None:
            pack_tensors = self._lazy_transformed if lazy else self._transformed
        else:
            pack_tensors = _lazy_images if lazy else self._packed
        other = lazy_collate if lazy else default_collate
        hwc = self.layout == "HWC"

        def pack_images(images: Sequence[Any], layout: Layout) -> Any:
            # PIL images and numpy arrays ([H, W, C]) as tensors, as a transform takes them
            return pack_tensors([_as_tensor(im, hwc) for im in images], layout)

        first = batch[0]
        if isinstance(first, OP_IMAGE_TYPES):
            out: Any = pack_images(batch, self.layout)
        elif isinstance(first, Mapping):
            if self.image_key not in first:
                raise KeyError(_no_image_field(first, self.image_key))
            out = {
                k: pack_images([s[k] for s in batch], self.layout)
                if k == self.image_key
                else other([s[k] for s in batch])
                for k in first
            }
        elif isinstance(first, tuple | list):
            key = self.image_key
            named = getattr(type(first), "_fields", None)  # a namedtuple: a field name too
            if isinstance(key, str) and isinstance(named, tuple) and key in named:
                key = named.index(key)
            if not isinstance(key, int) or not 0 <= key < len(first):
                raise KeyError(
                    f"ImageCollate: samples are {type(first).__name__}s of {len(first)} fields, "
                    f"and image_key={key!r} is none of them: image_key must be a position, 0 to "
                    f"{len(first) - 1}" + (f", or a field name of {named}" if named else "")
                )
            fields = [
                pack_images([s[j] for s in batch], self.layout)
                if j == key
                else other([s[j] for s in batch])
                for j in range(len(first))
            ]
            if named is not None:
                out = type(first)(*fields)
            else:
                out = type(first)(fields) if isinstance(first, tuple) else fields
        else:
            raise TypeError(
                f"ImageCollate: samples must be images, dicts or tuples, got {type(first).__name__}"
            )
        return out

    def _packed(self, images: Sequence[Tensor], layout: Layout) -> RaggedImages:
        return RaggedImages.from_images(images, layout, recycle=self.recycle)

    def _transformed(self, images: Sequence[Tensor], layout: Layout) -> Tensor:
        assert self.transform is not None  # chosen only with a transform
        return self.transform.apply(list(images))[0]

    def _lazy_transformed(self, images: Sequence[Tensor], layout: Layout) -> Any:
        """The transform's output, written by the fused kernel straight into the ring."""
        transform = self.transform
        assert transform is not None  # chosen only with a transform
        images = list(images)
        image_shapes(images, layout)  # packable: one channel count, dtype and device
        b, c, h, w = transform.output_shape(images)
        if transform.channels_last:  # stored as [B, H, W, C], viewed as [B, C, H, W]
            shape, permute = (b, h, w, c), (0, 3, 1, 2)
        else:
            shape, permute = (b, c, h, w), None
        return Lazy(
            transform.dtype,
            shape,
            lambda out: transform.apply(images, out=out),
            lambda: self._transformed(images, layout),
            permute,
        )


def _lazy_images(images: Sequence[Tensor], layout: Layout) -> RaggedImages:
    """RaggedImages whose buffer ``SharedRing.pack`` writes straight into the ring."""
    images = list(images)
    shapes = image_shapes(images, layout)
    views, stored = storage_views(images, layout)
    return RaggedImages.over(concat(views), shapes, stored)
