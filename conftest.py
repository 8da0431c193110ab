"""Shared by tests/ and bench/: tests marked ``cuda`` skip without a usable GPU."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    import torchfeed

    if torch.cuda.is_available() and torchfeed.build_info()["cuda_compiled"]:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and a build with CUDA kernels")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
