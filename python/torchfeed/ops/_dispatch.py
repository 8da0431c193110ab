"""Which compiled kernels exist, and the one fallback policy for devices that have none.

Every op module asks :func:`has_kernel` before calling ``torch.ops.torchfeed.<op>``; where it
says no (MPS, XPU, a CPU-only build with CUDA tensors) the op runs its fallback and
:func:`warn_fallback` says so once per op and device type.
"""

from __future__ import annotations

import warnings

import torch

from torchfeed import _extension  # noqa: F401  (registers the ops before the table is read)

__all__ = ["has_kernel", "read_kernels", "warn_fallback"]

_KEYS = {"cpu": "CPU", "cuda": "CUDA", "meta": "Meta"}


def _registered(op: str, key: str) -> bool:
    name = f"torchfeed::{op}"
    if not torch._C._dispatch_has_kernel(name):
        return False  # not built (decode_jpeg_window without libjpeg-turbo)
    return torch._C._dispatch_has_kernel_for_dispatch_key(name, key)


# Filled once per op by its module (read_kernels, after registering its fake kernel): a plain dict
# lookup is something torch.compile can trace, a dispatcher query is not.
_TABLE: dict[tuple[str, str], bool] = {}
_warned: set[tuple[str, str]] = set()


def read_kernels(*ops: str) -> None:
    """Records which device types have a kernel for each of ``ops`` (the Meta one being the
    fake kernel the op's module registers)."""
    for op in ops:
        for device, key in _KEYS.items():
            _TABLE[(op, device)] = _registered(op, key)


def has_kernel(op: str, device_type: str) -> bool:
    """Whether ``torch.ops.torchfeed.<op>`` has a compiled kernel for ``device_type``."""
    return _TABLE.get((op, device_type), False)


def warn_fallback(op: str, device_type: str, instead: str) -> None:
    """Warns once per (op, device type) that ``instead`` runs in place of a compiled kernel."""
    if (op, device_type) in _warned:
        return
    _warned.add((op, device_type))
    warnings.warn(
        f"torchfeed.{op}: no compiled kernel for {device_type} tensors in this build "
        f"(torchfeed.build_info() says what was built); {instead}",
        RuntimeWarning,
        stacklevel=3,
    )
