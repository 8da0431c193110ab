"""build_info() and the import-time checks that the extension matches the torch importing it."""

from __future__ import annotations

import subprocess
import sys

import torch

import torchfeed


def test_build_info():
    info = torchfeed.build_info()
    assert info["version"] == torchfeed.__version__
    assert info["torch_version"] == torch.__version__
    assert isinstance(info["cuda_compiled"], bool)
    assert info["gpu_available"] == torch.cuda.is_available()
    if info["cuda_compiled"]:
        assert info["cuda_archs"] and all("." in a for a in info["cuda_archs"])
        assert torch._C._dispatch_has_kernel_for_dispatch_key("torchfeed::pad_packed", "CUDA")
    else:
        assert info["cuda_archs"] == []
    assert info["gpu_kernels_usable"] == (info["cuda_compiled"] and info["gpu_available"])


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_with_another_torch_names_both_versions():
    result = run_python("import torch; torch.__version__ = '2.0.0'; import torchfeed")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert f"built against torch {torch.__version__} but torch 2.0.0" in result.stderr
    assert "pip install --no-build-isolation" in result.stderr


def test_import_without_the_extension_says_how_to_build():
    result = run_python(
        "import sys; sys.modules['torchfeed._build_config'] = None; import torchfeed"
    )
    assert result.returncode != 0
    assert "the compiled extension is not built" in result.stderr
    assert "pip install --no-build-isolation" in result.stderr


def test_ops_registered():
    for op in ("pad_packed", "pad_list"):
        assert hasattr(torch.ops.torchfeed, op)
