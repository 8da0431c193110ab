"""build_info(): what this build of torchfeed knows about itself and the machine."""

from __future__ import annotations

from typing import Any

import torch


def build_info() -> dict[str, Any]:
    """torchfeed's version, the torch it was built against, whether CUDA kernels were compiled
    and for which architectures, and whether a GPU is usable now."""
    from torchfeed import _C

    info = dict(_C.build_info())
    info["cuda_archs"] = info["cuda_archs"].split()
    info["torch_version_now"] = torch.__version__
    info["gpu_available"] = torch.cuda.is_available()
    info["gpu_name"] = torch.cuda.get_device_name() if info["gpu_available"] else None
    info["gpu_kernels_usable"] = info["cuda_compiled"] and info["gpu_available"]
    return info
