"""build_info() and the import-time checks that the extension matches the torch importing it."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torchfeed
from torchfeed import _cxx_runtime

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.skipif(torchfeed.build_info()["jpeg"] is None, reason="built without libjpeg")
def test_build_info_names_the_libjpeg_loaded_at_run_time():
    runtime = torchfeed.build_info()["jpeg_runtime"]
    path = runtime.split(" (")[0]
    assert Path(path).exists() and "jpeg" in Path(path).name, runtime
    # (another libjpeg than the headers' still decodes right: warnings are read by their text)
    assert re.search(
        r" \(its message codes (match the headers|differ from the headers': \d+ messages "
        r"against \d+)\)$",
        runtime,
    ), runtime


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, **env),
    )


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


def test_the_cpu_instruction_set_cap_is_read_and_checked_at_import():
    best = torchfeed._C._testing.limit_cpu_isa("avx512")  # what this machine has at most
    result = run_python("import torchfeed; print(torchfeed._C.cpu_isa())", TORCHFEED_CPU_ISA="avx2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("baseline" if best == "baseline" else "avx2")
    result = run_python("import torchfeed", TORCHFEED_CPU_ISA="sse9")
    assert result.returncode != 0
    assert "TORCHFEED_CPU_ISA must be one of baseline, avx2, avx512" in result.stderr
    assert "'sse9'" in result.stderr
    with pytest.raises(ValueError, match="limit_cpu_isa: expected 'avx512', 'avx2' or 'baseline'"):
        torchfeed._C._testing.limit_cpu_isa("sse9")


def test_ops_registered():
    for op in ("pad_packed", "pad_list"):
        assert hasattr(torch.ops.torchfeed, op)


TORCH_LIB = Path(torch.__file__).parent / "lib"
CHECKER = Path(_cxx_runtime.__file__)


def test_extension_shares_torchs_cxx_runtime():
    """A private C++ runtime turns every error of an op into a SIGSEGV (issue 11)."""
    extension = torchfeed._C.__file__
    torch_runtimes = _cxx_runtime.cxx_runtimes(TORCH_LIB / "libc10.so")
    assert torch_runtimes, "torch's libc10 needs no shared C++ runtime?"
    assert _cxx_runtime.cxx_runtimes(extension) == torch_runtimes
    assert _cxx_runtime.mismatch(extension, TORCH_LIB / "libc10.so") is None


def _link(tmp_path: Path, *flags: str) -> Path:
    source = tmp_path / "lib.cpp"
    source.write_text('#include <stdexcept>\nvoid f() { throw std::runtime_error("x"); }\n')
    library = tmp_path / "lib.so"
    subprocess.run(["g++", "-shared", "-fPIC", *flags, str(source), "-o", str(library)], check=True)
    return library


def test_check_refuses_and_deletes_a_statically_linked_library(tmp_path):
    static = _link(tmp_path, "-static-libstdc++", "-static-libgcc")
    assert "libstdc++.so.6" not in _cxx_runtime.needed_libraries(static)
    result = subprocess.run(
        [
            sys.executable,
            str(CHECKER),
            "check",
            str(static),
            "--reference",
            str(TORCH_LIB / "libc10.so"),
            "--remove-on-failure",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "linked the C++ runtime into it statically" in result.stderr
    assert "CXX=" in result.stderr and "SIGSEGV" in result.stderr
    assert not static.exists()  # no crashing extension is left behind


def test_check_accepts_a_dynamically_linked_library(tmp_path):
    dynamic = _link(tmp_path)
    assert _cxx_runtime.mismatch(dynamic, TORCH_LIB / "libc10.so") is None


def _static_runtime_compiler(tmp_path: Path) -> Path:
    """A C++ compiler that links libstdc++ into shared objects statically, as the GPU machine's
    default GCC did (issue 11)."""
    wrapper = tmp_path / "static-g++"
    wrapper.write_text('#!/bin/sh\nexec g++ -static-libstdc++ -static-libgcc "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.parametrize("how", ["LDFLAGS", "compiler"])
def test_configure_refuses_a_toolchain_that_links_the_runtime_statically(tmp_path, how):
    """Both ways a toolchain ends up with a private C++ runtime: flags asking for it, or a
    compiler that does it by default. The build must stop at configure time and name the fix."""
    cmake = Path(sys.executable).parent / "cmake"
    env = dict(os.environ)
    if how == "LDFLAGS":
        env["LDFLAGS"] = "-static-libstdc++ -static-libgcc"
    else:
        env["CXX"] = str(_static_runtime_compiler(tmp_path))
    result = subprocess.run(
        [
            str(cmake),
            "-S",
            str(ROOT),
            "-B",
            str(tmp_path / "build"),
            "-G",
            "Ninja",
            "-DTORCHFEED_CUDA=OFF",
            "-DTORCHFEED_JPEG=OFF",
            f"-DPython_EXECUTABLE={sys.executable}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode != 0
    message = " ".join(result.stderr.split())  # CMake wraps the lines
    assert "does not share torch's C++ runtime" in message
    assert "linked the C++ runtime into it statically" in message
    assert "CXX=" in message


ERROR_PATHS = r"""
import math, torch, torchfeed
op = torch.ops.torchfeed
cases = {
    "pad": lambda: torchfeed.pad([torch.ones(2), torch.ones(2, dtype=torch.int64)]),
    "pad_list": lambda: op.pad_list([torch.ones(2), torch.ones(2, dtype=torch.int64)], 2),
    "pad_packed": lambda: op.pad_packed(torch.ones(3), torch.tensor([0, 5]), 5),
    "crop": lambda: op.crop_flip_normalize_out(
        torch.zeros(1, 3, 4, 4), torch.zeros(1, 10, dtype=torch.float64),
        torch.zeros(1, dtype=torch.bool), 1, True, [0.0] * 3, [1.0] * 3,
        torch.empty(1, 3, 2, 2)),
    "ring_timeout": lambda: (lambda r: (r.allocate(4096), r.allocate(4096, timeout=0.01)))(
        torchfeed.PinnedRing(4096, pinned=False)),
}
if hasattr(op, "decode_jpeg_window"):
    cases["jpeg"] = lambda: op.decode_jpeg_window(torch.zeros(64, dtype=torch.uint8), 0, 0, 1, 1)
for name, case in cases.items():
    try:
        case()
    except Exception as e:
        print(name, "TimeoutError" if isinstance(e, TimeoutError) else type(e).__name__)
    else:
        print(name, "no error")
"""


def test_every_ops_error_path_raises_in_python():
    """In a separate process, so that a crash (the static-runtime failure) fails this test
    instead of killing the test session."""
    result = run_python(ERROR_PATHS)
    assert result.returncode == 0, result.stderr[-2000:]
    raised = dict(line.split() for line in result.stdout.splitlines())
    assert raised.pop("pad") == "TypeError"
    assert raised.pop("pad_list") == "TypeError"
    assert raised.pop("pad_packed") == "ValueError"
    assert raised.pop("crop") == "TypeError"
    assert raised.pop("ring_timeout") == "TimeoutError"
    assert all(kind == "RuntimeError" for kind in raised.values()), raised


def fatbin_entries(path: str) -> set[tuple[str, int]]:
    """("sass" or "ptx", sm) of every kernel image in an ELF's .nv_fatbin section (the layout
    cuobjdump reads: a fat binary header, then per image a header with kind 1 = PTX, 2 = ELF,
    and the sm number)."""
    data = Path(path).read_bytes()
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    names = sections[shstrndx][4]
    fatbin = next(
        s for s in sections if data[names + s[0] : data.index(b"\0", names + s[0])] == b".nv_fatbin"
    )
    found, pos, end = set(), fatbin[4], fatbin[4] + fatbin[5]
    while pos < end:
        magic, _, header, size = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            pos += 8  # padding between the fat binaries of the .cu files
            continue
        entry = pos + header
        while entry < pos + header + size:
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            found.add(({1: "ptx", 2: "sass"}[kind], arch))
            entry += entry_header + entry_size
        pos += header + size
    return found


@pytest.mark.skipif(not torchfeed.build_info()["cuda_compiled"], reason="a CPU-only build")
def test_extension_holds_a_kernel_image_per_architecture_and_ptx_for_the_newest():
    archs = torchfeed.build_info()["cuda_archs"]
    expected = set()
    for arch in archs:
        # "9.0", "12.0+PTX", or an architecture-specific "9.0a" / family "10.0f" (the GPU check
        # builds "9.0a" on the H200), whose images carry the plain sm number (nvcc 13: sm_90a -> 90)
        m = re.fullmatch(r"(\d+)\.(\d)[af]?(\+PTX)?", arch)
        assert m, arch
        sm = int(m[1]) * 10 + int(m[2])
        expected.add(("sass", sm))
        if m[3]:
            expected.add(("ptx", sm))
    assert fatbin_entries(torchfeed._C.__file__) == expected
