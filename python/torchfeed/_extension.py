"""The compiled extension, loaded after checking that it was built against the torch importing
it, and what the build knows about itself (:func:`build_info`)."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

import torch

__all__ = ["C", "build_info", "physical_memory"]

_REBUILD = "rebuild torchfeed against it: pip install --no-build-isolation -e . (or make build)"


def _load() -> ModuleType:
    try:
        config = importlib.import_module("torchfeed._build_config")
    except ImportError as e:
        raise ImportError(
            "torchfeed: the compiled extension is not built (torchfeed._build_config is missing); "
            f"{_REBUILD}"
        ) from e
    if torch.__version__ != config.TORCH_VERSION:
        raise ImportError(
            f"torchfeed was built against torch {config.TORCH_VERSION} but torch "
            f"{torch.__version__} is importing it; its kernels only work with the torch they were "
            f"compiled against: {_REBUILD}"
        )
    try:
        return importlib.import_module("torchfeed._C")
    except ImportError as e:
        raise ImportError(
            f"torchfeed: cannot load the compiled extension torchfeed._C ({e}); {_REBUILD}"
        ) from e


# Loading it registers the ops (torch.ops.torchfeed.*) with the dispatcher.
C = _load()

# The instruction sets of the CPU kernels, best last; TORCHFEED_CPU_ISA caps the one they use.
CPU_ISAS = ("baseline", "avx2", "avx512")
_isa_cap = os.environ.get("TORCHFEED_CPU_ISA")
if _isa_cap is not None and _isa_cap not in CPU_ISAS:
    raise ValueError(
        f"TORCHFEED_CPU_ISA must be one of {', '.join(CPU_ISAS)} (the most the CPU kernels may "
        f"use; unset: the best this CPU has), got {_isa_cap!r}"
    )


def build_info() -> dict[str, Any]:
    """torchfeed's version, the torch it was built against, whether CUDA kernels were compiled
    and for which architectures, whether crop-window JPEG decoding was built (``jpeg``: the
    headers' libjpeg; ``jpeg_runtime``: the library this process loaded for it, and whether its
    message codes are the headers'), and whether a GPU is usable now."""
    info = dict(C.build_info())
    info["cuda_archs"] = info["cuda_archs"].split()
    info["torch_version_now"] = torch.__version__
    info["gpu_available"] = torch.cuda.is_available()
    info["gpu_name"] = torch.cuda.get_device_name() if info["gpu_available"] else None
    info["gpu_kernels_usable"] = gpu_kernels_usable()
    return info


def gpu_kernels_usable() -> bool:
    """Whether the CUDA kernels were compiled and a GPU is usable now (and so whether a
    SharedRing made now is page-locked)."""
    return bool(C.build_info()["cuda_compiled"]) and torch.cuda.is_available()


def physical_memory() -> int:
    """The machine's memory in bytes, the bound every ring's own check enforces
    (csrc/memory/fence.cpp); 2**62 when it is unknown."""
    return int(C.physical_memory()) or 1 << 62
