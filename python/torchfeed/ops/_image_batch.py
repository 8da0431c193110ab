"""The images of a batch as the crop/flip/normalize op takes them, and its per-image parameters
on the host (:mod:`torchfeed.ops.crop_flip_normalize`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from torchfeed.images import Layout, RaggedImages, check_layout

__all__ = ["ImageBatch", "check_flips", "host_parameter"]


def _plain(t: Tensor) -> Tensor:
    # tv_tensors.Image and other subclasses: the op takes plain tensors (no __torch_function__)
    return t if type(t) is Tensor else t.as_subclass(Tensor)


class ImageBatch:
    """The images of a batch as the ops take them, with no per-image step on the fast path: a
    dense ``[B, C, H, W]`` uint8 tensor (any strides; ``[B, H, W, C]`` with layout "HWC"), a list
    of ``[C, H_i, W_i]`` (or ``[H_i, W_i, C]``) images, or :class:`RaggedImages` (its packed
    buffer, never split into views). The per-image checks run in C++, once for the batch."""

    __slots__ = ("channels", "dense", "device", "hwc", "images", "packed", "shapes", "size")

    def __init__(self, images: Any, image_layout: Layout) -> None:
        check_layout(image_layout)
        self.dense: Tensor | None = None
        self.images: list[Tensor] | None = None
        self.packed: Tensor | None = None
        self.shapes: Tensor | None = None  # packed: [B, 4] (offset, C, H, W) on the host
        self.hwc = image_layout == "HWC"
        if isinstance(images, RaggedImages):
            self.packed, self.shapes = images.data, images.packed_shapes()
            self.hwc = images.layout == "HWC"
            self.size, self.channels, self.device = len(images), images.channels, images.device
        elif isinstance(images, Tensor):
            if images.dim() != 4:
                raise ValueError(
                    f"images must be a [B, C, H, W] batch ([B, H, W, C] with image_layout='HWC'), "
                    f"a list of images or RaggedImages, got a tensor of shape {list(images.shape)}"
                )
            if images.dtype != torch.uint8:
                raise TypeError(f"images must be uint8, got {images.dtype}")
            dense = _plain(images)
            self.dense = dense.permute(0, 3, 1, 2) if self.hwc else dense
            self.hwc = False
            self.size, self.channels = self.dense.shape[0], self.dense.shape[1]
            self.device = dense.device
        elif isinstance(images, Sequence) and not isinstance(images, str | bytes):
            self.images = list(images)
            if self.images and type(self.images[0]) is not Tensor:
                if not all(isinstance(t, Tensor) for t in self.images):
                    _explain(self.images, self.hwc)
                self.images = [_plain(t) for t in self.images]
            self.size = len(self.images)
            first = self.images[0] if self.images else None
            if first is not None and type(first) is Tensor and first.dim() == 3:
                self.channels = first.shape[2 if self.hwc else 0]
                self.device = first.device
            else:
                self.channels, self.device = 0, torch.device("cpu")
        else:
            raise TypeError(
                "images must be a uint8 tensor batch, a list of uint8 images or RaggedImages, "
                f"got {type(images).__name__}"
            )

    def __len__(self) -> int:
        return self.size

    def sizes(self) -> Tensor:
        """(H, W) of each image, ``[B, 2]`` int64 on the host, after the per-image checks."""
        if self.dense is not None:
            h, w = self.dense.shape[2:]
            return torch.tensor([[h, w]], dtype=torch.int64).expand(self.size, 2)
        if self.shapes is not None:
            return self.shapes[:, 2:4]
        images = self.images or []
        try:
            return torch.ops.torchfeed.image_sizes(images, self.hwc)
        except (TypeError, ValueError, RuntimeError):
            _explain(images, self.hwc)  # the same checks, in Python's words
            raise


def _explain(images: list, hwc: bool) -> None:
    """Raises the error of the first bad image in Python's words (the slow path: after the C++
    check failed, or for a list that is not all tensors)."""
    layout, cdim = ("[H, W, C]", 2) if hwc else ("[C, H, W]", 0)
    for i, im in enumerate(images):
        if not isinstance(im, Tensor):
            raise TypeError(f"images[{i}] must be a tensor, got {type(im).__name__}")
        if im.dim() != 3:
            raise ValueError(f"images[{i}] must be 3-D {layout}, got shape {list(im.shape)}")
        if im.dtype != torch.uint8:
            raise TypeError(f"images[{i}] must be uint8, got {im.dtype}")
        if im.shape[cdim] != images[0].shape[cdim]:
            raise ValueError(
                f"images[{i}] has {im.shape[cdim]} channels but images[0] has "
                f"{images[0].shape[cdim]}"
            )
        if im.device != images[0].device:
            raise ValueError(
                f"images[{i}] is on {im.device} but images[0] is on {images[0].device}"
            )


def host_parameter(
    value: Any, name: str, device: torch.device, dtype: torch.dtype | None = None
) -> Tensor:
    """Boxes or flips on the host: a host tensor or a list as it is; a tensor on the images'
    device is read back (which synchronizes that device); any other device is refused."""
    if isinstance(value, Tensor):
        if value.device.type != "cpu":
            if value.device != device:
                raise ValueError(
                    f"{name} are on {value.device} but the images are on {device} (give them on "
                    "the host, or on the images' device)"
                )
            value = value.detach().cpu()  # synchronizes: documented in crop_flip_normalize
        return value
    return torch.as_tensor(value, dtype=dtype)  # a list of floats: float64, never float32


def check_flips(flips: Any, batch: int, device: torch.device) -> Tensor:
    if flips is None:
        return torch.zeros(batch, dtype=torch.bool)
    flips = host_parameter(flips, "flips", device)
    if flips.dtype != torch.bool:
        raise TypeError(f"flips must be bool, got {flips.dtype}")
    if flips.shape != (batch,):
        raise ValueError(f"flips must have shape [{batch}], got {list(flips.shape)}")
    return flips
