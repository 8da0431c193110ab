"""Loads the compiled extension, after checking it was built against the torch importing it."""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

_REBUILD = "rebuild torchfeed against it: pip install --no-build-isolation -e . (or make build)"


def load() -> ModuleType:
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
