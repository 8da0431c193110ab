"""How images are packed into one buffer: their layout, their shapes checked for packing, the
memory order a copy keeps, and where a collated buffer lives (shared memory in a worker)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from torch import Tensor
from torch.utils.data import get_worker_info

__all__ = ["Layout", "check_layout", "empty_for_batch", "image_shapes", "storage_views"]

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
        if im.dtype != images[0].dtype:
            raise TypeError(f"images[{i}] is {im.dtype} but images[0] is {images[0].dtype}")
        if im.device != images[0].device:
            raise ValueError(
                f"images[{i}] is on {im.device} but images[0] is on {images[0].device}"
            )
    return [
        (im.shape[0], im.shape[1], im.shape[2])
        if layout == "CHW"
        else (im.shape[2], im.shape[0], im.shape[1])
        for im in images
    ]
