"""The image op's plumbing (the public face is :mod:`torchfeed.ops.crop_flip_normalize`): the
images of a batch as the op takes them (:class:`OpImages`), its options value (validated once,
where options enter), its per-image parameters on the host, and the launch of the compiled
kernel or its fallback."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from torchfeed._options import check_bool
from torchfeed._output_buffer import OutputBuffer
from torchfeed._packing import Layout, check_layout
from torchfeed.images import RaggedImages
from torchfeed.limits import check_image_pixels
from torchfeed.ops._dispatch import has_kernel, warn_fallback

if TYPE_CHECKING:  # torchvision is imported where a transform needs it, not by `import torchfeed`
    from torchvision.transforms.v2 import InterpolationMode

__all__ = [
    "KERNEL_OPS",
    "ImageOptions",
    "OpImages",
    "check_flips",
    "grid_from_boxes",
    "host_parameter",
    "output_box",
    "resize_arg",
    "resize_center_crop_grid",
    "resized_size",
    "run",
    "size_pair",
]


def _plain(t: Tensor) -> Tensor:
    # tv_tensors.Image and other subclasses: the op takes plain tensors (no __torch_function__)
    return t if type(t) is Tensor else t.as_subclass(Tensor)


class OpImages:
    """The images of a batch as the ops take them, with no per-image step on the fast path: a
    dense ``[B, C, H, W]`` uint8 tensor (any strides; ``[B, H, W, C]`` when ``hwc``), a list of
    ``[C, H_i, W_i]`` (or ``[H_i, W_i, C]``) images, or :class:`RaggedImages` (its packed
    buffer, never split into views). The per-image checks are the C++ ones (``image_sizes`` for
    a list, the kernel op for every form), in their words; Python says only what the dispatcher
    cannot: an element that is not a tensor."""

    __slots__ = ("channels", "count", "dense", "device", "hwc", "listed", "packed", "packed_table")

    def __init__(self, images: Any, hwc: bool) -> None:
        self.dense: Tensor | None = None
        self.listed: list[Tensor] | None = None
        self.packed: Tensor | None = None
        self.packed_table: Tensor | None = None  # packed: [B, 4] (offset, C, H, W) on the host
        self.hwc = hwc
        if isinstance(images, RaggedImages):
            self.packed, self.packed_table = images.data, images.packed_shapes()
            self.hwc = images.layout == "HWC"
            self.count, self.channels, self.device = len(images), images.channels, images.device
        elif isinstance(images, Tensor):
            if images.dim() != 4:
                raise ValueError(
                    f"images must be a [B, C, H, W] batch ([B, H, W, C] with image_layout='HWC'), "
                    f"a list of images or RaggedImages, got a tensor of shape {list(images.shape)}"
                )
            if images.dtype != torch.uint8:
                raise TypeError(f"images must be uint8, got {images.dtype}")
            dense = _plain(images)
            self.dense = dense.permute(0, 3, 1, 2) if hwc else dense
            self.hwc = False
            self.count, self.channels = self.dense.shape[0], self.dense.shape[1]
            self.device = dense.device
        elif isinstance(images, Sequence) and not isinstance(images, str | bytes):
            listed = list(images)
            for i, im in enumerate(listed):
                if type(im) is not Tensor:
                    if not isinstance(im, Tensor):
                        raise TypeError(f"images[{i}] must be a tensor, got {type(im).__name__}")
                    listed[i] = _plain(im)
            self.listed = listed
            self.count = len(listed)
            first = listed[0] if listed else None
            if first is not None and first.dim() == 3:
                self.channels = first.shape[2 if hwc else 0]
                self.device = first.device
            else:  # the C++ checks say what is wrong with it
                self.channels, self.device = 0, torch.device("cpu")
        else:
            raise TypeError(
                "images must be a uint8 tensor batch, a list of uint8 images or RaggedImages, "
                f"got {type(images).__name__}"
            )

    def __len__(self) -> int:
        return self.count

    def size_table(self) -> Tensor:
        """(H, W) of each image, ``[B, 2]`` int64 on the host, after the per-image checks."""
        if self.dense is not None:
            h, w = self.dense.shape[2:]
            return torch.tensor([[h, w]], dtype=torch.int64).expand(self.count, 2)
        if self.packed_table is not None:
            return self.packed_table[:, 2:4]
        return torch.ops.torchfeed.image_sizes(self.listed, self.hwc)


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


_INTERPOLATION = {"nearest": 0, "bilinear": 1}


def _interpolation_code(value: object) -> int | None:
    """The op's code for "nearest" or "bilinear", or torchvision's InterpolationMode of either;
    None for anything else. (Only a caller that passes a non-string has torchvision imported
    here: it had to import it to get the enum.)"""
    if isinstance(value, str):
        return _INTERPOLATION.get(value)
    from torchvision.transforms.v2 import InterpolationMode

    return _INTERPOLATION.get(value.value) if isinstance(value, InterpolationMode) else None


_OUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
KERNEL_OPS = (
    "crop_flip_normalize_out",
    "crop_flip_normalize_list_out",
    "crop_flip_normalize_packed_out",
)


def size_pair(size: int | Sequence[int], name: str = "size") -> tuple[int, int]:
    if isinstance(size, bool):
        raise TypeError(f"{name} must be an int or (height, width), got bool")
    if isinstance(size, int):
        size = (size, size)
    try:
        pair = tuple(size)
    except TypeError:
        raise TypeError(f"{name} must be an int or (height, width), got {size!r}") from None
    if len(pair) == 1:
        pair = (pair[0], pair[0])
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise TypeError(f"{name} must be an int or (height, width) of ints, got {size!r}")
    if min(pair) <= 0:
        raise ValueError(f"{name} must be positive, got {pair}")
    # an output is allocated per call: a typo (22400 for 224) must not silently take gigabytes
    check_image_pixels(pair[0], pair[1], f"{name} {pair}")
    return pair[0], pair[1]


def resized_size(height: int, width: int, resize: int | Sequence[int]) -> tuple[int, int]:
    """torchvision's ``resize`` output size: an int sets the shorter side (the longer one
    truncated, as int() does, keeping the aspect ratio), a pair is the size."""
    if not isinstance(resize, int):
        return int(resize[0]), int(resize[1])
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(resize * long / short)
    return (resize, new_long) if height <= width else (new_long, resize)


def resize_arg(resize: int | Sequence[int]) -> int | list[int]:
    """torchvision's ``resize`` size: an int (the shorter side) or (height, width)."""
    if isinstance(resize, int) and not isinstance(resize, bool):
        if resize <= 0:
            raise ValueError(f"resize must be positive, got {resize}")
        return resize
    return list(size_pair(resize, "resize"))


def _channel_values(name: str, values: Any) -> tuple[float, ...]:
    if isinstance(values, Tensor):
        values = values.tolist()
    if isinstance(values, bool) or not isinstance(values, int | float | Sequence):
        raise TypeError(f"{name} must be a number or a sequence of numbers, got {values!r}")
    seq = [values] if isinstance(values, int | float) else list(values)
    if not seq:
        raise ValueError(f"{name} must have 1 value or one per channel, got none")
    try:
        out = tuple(float(v) for v in seq)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be numbers, got {values!r}") from None
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


@dataclass(frozen=True)
class ImageOptions:
    """How the op normalizes and writes, validated once: per-channel ``mean`` and ``std`` (one
    value for all channels, or one per channel), ``interpolation`` ("bilinear" or "nearest", or
    the InterpolationMode), ``antialias``, the output ``dtype`` (float32, float16 or bfloat16),
    ``channels_last`` output, and the ``image_layout`` of the inputs ("CHW" or "HWC")."""

    mean: Sequence[float] | float
    std: Sequence[float] | float
    interpolation: str | InterpolationMode = "bilinear"
    antialias: bool = True
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    image_layout: Layout = "CHW"
    # what every call reads, found once in __post_init__: the op's interpolation code, and the
    # per-channel mean and std lists by channel count
    _mode: int = field(init=False, repr=False, compare=False)
    _per_channel: dict[int, tuple[list[float], list[float]]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "mean", _channel_values("mean", self.mean))
        object.__setattr__(self, "std", _channel_values("std", self.std))
        for c, s in enumerate(self.std):  # type: ignore[arg-type]  # a tuple, after the above
            if s == 0:
                raise ValueError(f"std[{c}] is 0: normalize would divide by zero")
        if _interpolation_code(self.interpolation) is None:
            raise ValueError(
                f"interpolation must be 'bilinear' or 'nearest' (or the InterpolationMode), got "
                f"{self.interpolation!r}"
            )
        check_bool("antialias", self.antialias)
        if self.dtype not in _OUT_DTYPES:
            raise TypeError(
                f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {self.dtype}"
            )
        check_bool("channels_last", self.channels_last)
        check_layout(self.image_layout)
        object.__setattr__(self, "_mode", _interpolation_code(self.interpolation))
        object.__setattr__(self, "_per_channel", {})

    @property
    def mode(self) -> int:
        """The op's interpolation code."""
        return self._mode

    def per_channel(self, channels: int) -> tuple[list[float], list[float]]:
        """mean and std with one value per channel: the same two lists at every call with this
        count (the op only reads them; nothing may change them)."""
        known = self._per_channel.get(channels)
        if known is None:
            known = self._per_channel[channels] = self._expand(channels)
        return known

    def _expand(self, channels: int) -> tuple[list[float], list[float]]:
        values = []
        pairs: tuple[tuple[str, Any], ...] = (("mean", self.mean), ("std", self.std))
        for name, seq in pairs:
            if len(seq) == 1:
                seq = seq * channels
            if len(seq) != channels:
                raise ValueError(
                    f"{name} must have 1 or {channels} values (one per channel), got {len(seq)}"
                )
            values.append(list(seq))
        return values[0], values[1]

    @property
    def memory_format(self) -> torch.memory_format:
        return torch.channels_last if self.channels_last else torch.contiguous_format


def grid_from_boxes(
    boxes: Tensor | Sequence[Sequence[float]],
    sizes: Tensor | Sequence[Sequence[int]],
    out_size: tuple[int, int],
) -> Tensor:
    """The ``grid`` the op takes for crop-then-resize (RandomResizedCrop): ``boxes`` ``[B, 4]``
    (top, left, height, width), each inside its image of ``sizes`` (H, W)."""
    if not isinstance(sizes, Tensor):
        sizes = torch.tensor([[int(v) for v in s] for s in sizes], dtype=torch.int64)
    if not isinstance(boxes, Tensor):
        boxes = torch.as_tensor(boxes, dtype=torch.float64)  # floats: never through float32
    return torch.ops.torchfeed.resized_crop_grid(sizes.reshape(-1, 2), boxes, *out_size)


def resize_center_crop_grid(
    sizes: Tensor, resize: int | Sequence[int], crop: tuple[int, int]
) -> Tensor:
    """Resize-then-crop geometry ``[B, 10]``: torchvision's ``resize(size)`` (an int resizes the
    shorter side, keeping the aspect ratio) then ``center_crop(crop)``."""
    rh, rw = (resize, -1) if isinstance(resize, int) else resize
    return torch.ops.torchfeed.resize_center_crop_grid(sizes, rh, rw, crop[0], crop[1])


def output_box(grid: Tensor, out_size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The source pixels a one-image ``grid``'s output stands for, (top, left, height, width),
    widened to whole pixels: per axis, the output's ``out`` samples of the ``virtual`` ones
    spread over ``[start, start + extent)``, from ``offset`` on. A random crop's box, a
    center crop's preimage under its resize, a whole resized image."""
    row = grid[0].tolist()
    edges = []
    for axis, out in enumerate(out_size):
        start, extent, virtual, offset, end = row[5 * axis : 5 * axis + 5]
        lo = start + extent * offset / virtual
        first = math.floor(lo)
        last = min(math.ceil(lo + extent * out / virtual), math.ceil(end))
        edges.append((first, max(1, last - first)))
    (top, height), (left, width) = edges
    return top, left, height, width


def run(
    batch: OpImages,
    grid: Tensor,
    flips: Tensor,
    out_size: tuple[int, int],
    options: ImageOptions,
    out: Tensor | None = None,
    buffer: OutputBuffer | None = None,
) -> Tensor:
    """Runs the op on a batch with its geometry (``grid`` ``[B, 10]`` float64 and ``flips``
    ``[B]`` bool, on the host), into ``out`` (checked here) or a new (or ``buffer``'s reused)
    output."""
    channels = batch.channels or len(cast(tuple, options.mean))  # validated: a tuple
    try:
        mean, std = options.per_channel(channels)
    except ValueError as e:
        if batch.hwc or channels <= 4:
            raise
        # a [H, W, 3] image taken as [C, H, W]: numpy's, PIL's and Hugging Face datasets' order
        raise ValueError(
            f"{e}: the images were taken as [C, H, W] (image_layout='CHW'), so {channels} "
            "channels. An image in [H, W, C] order (numpy, PIL, Hugging Face datasets) takes "
            "image_layout='HWC', or image.permute(2, 0, 1)"
        ) from None
    shape = (len(batch), channels, *out_size)
    device = batch.device
    if out is None:
        if buffer is not None:
            out = buffer.get(shape, options.dtype, device, options.memory_format)
        else:
            out = torch.empty(
                shape, dtype=options.dtype, device=device, memory_format=options.memory_format
            )
    elif (
        not isinstance(out, Tensor)
        or tuple(out.shape) != shape
        or out.dtype not in _OUT_DTYPES
        or out.device != device
    ):
        got = (
            f"{out.dtype} {list(out.shape)} on {out.device}"
            if isinstance(out, Tensor)
            else type(out).__name__
        )
        raise ValueError(
            f"out must be a float32/float16/bfloat16 tensor of shape {list(shape)} on {device}, "
            f"got {got}"
        )
    if len(batch) == 0:
        return out
    if has_kernel("crop_flip_normalize_out", device.type):
        _launch(batch, grid, flips, options.mode, options.antialias, mean, std, out)
        return out
    warn_fallback(
        "crop_flip_normalize", device.type, "computing on the CPU and copying the result back"
    )
    cpu_out = torch.empty_like(out, device="cpu")
    _launch(batch, grid, flips, options.mode, options.antialias, mean, std, cpu_out, cpu=True)
    return out.copy_(cpu_out)


def _launch(batch, grid, flips, mode, antialias, mean, std, out, cpu: bool = False) -> None:
    ops = torch.ops.torchfeed
    if batch.dense is not None:
        dense = batch.dense.cpu() if cpu else batch.dense
        ops.crop_flip_normalize_out(dense, grid, flips, mode, antialias, mean, std, out)
    elif batch.packed is not None:
        data = batch.packed.cpu() if cpu else batch.packed
        ops.crop_flip_normalize_packed_out(
            data, batch.packed_table, grid, flips, mode, antialias, mean, std, out, batch.hwc
        )
    else:
        images = [t.cpu() for t in batch.listed] if cpu else batch.listed
        ops.crop_flip_normalize_list_out(
            images, grid, flips, mode, antialias, mean, std, out, batch.hwc
        )
