"""Which C++ runtime a shared library links, read from its ELF dynamic section.

An extension must share torch's C++ runtime: with a private copy (libstdc++ linked statically,
or a different runtime such as libc++) a C++ exception thrown in the extension and caught by
torch's dispatcher, i.e. every error an op reports, can crash the process (SIGSEGV) instead of
raising in Python. The build runs this file twice (CMakeLists.txt): at configure time it probes
the compiler with a small test library, and after linking ``_C`` it checks the real one; either
failure stops the build with the fix. It uses only the standard library, so it runs before
torchfeed exists; ``torchfeed doctor`` and the tests use it too.

    python _cxx_runtime.py probe --cxx g++ --flags "$LDFLAGS" --reference libc10.so --workdir DIR
    python _cxx_runtime.py check _C.so --reference libc10.so [--remove-on-failure]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path

__all__ = ["CXX_RUNTIMES", "cxx_runtimes", "mismatch", "needed_libraries"]

# soname -> what it is; an extension must need the same ones as torch's libc10.
CXX_RUNTIMES = {"libstdc++.so.6": "GNU libstdc++", "libc++.so.1": "LLVM libc++"}

_SHT_DYNAMIC = 6
_DT_NEEDED = 1


def needed_libraries(path: str | os.PathLike) -> list[str]:
    """The DT_NEEDED entries of an ELF shared object (32/64-bit, either byte order)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not an ELF file")
    is64 = data[4] == 2
    endian = "<" if data[5] == 1 else ">"
    if is64:
        shoff, shentsize, shnum = (
            struct.unpack_from(endian + "Q", data, 0x28)[0],
            *struct.unpack_from(endian + "HH", data, 0x3A),
        )
        section = endian + "IIQQQQIIQQ"  # name type flags addr offset size link info align entsize
        dyn, dyn_size = endian + "qQ", 16
    else:
        shoff, shentsize, shnum = (
            struct.unpack_from(endian + "I", data, 0x20)[0],
            *struct.unpack_from(endian + "HH", data, 0x2E),
        )
        section = endian + "IIIIIIIIII"
        dyn, dyn_size = endian + "iI", 8
    sections = [struct.unpack_from(section, data, shoff + i * shentsize) for i in range(shnum)]
    names: list[str] = []
    for _, kind, _, _, offset, size, link, _, _, _ in sections:
        if kind != _SHT_DYNAMIC:
            continue
        strtab = sections[link][4]
        for k in range(size // dyn_size):
            tag, value = struct.unpack_from(dyn, data, offset + k * dyn_size)
            if tag == 0:
                break
            if tag == _DT_NEEDED:
                end = data.index(b"\0", strtab + value)
                names.append(data[strtab + value : end].decode())
    return names


def cxx_runtimes(path: str | os.PathLike) -> list[str]:
    """The C++ runtime sonames ``path`` needs (empty: none, or linked in statically)."""
    return [n for n in needed_libraries(path) if n in CXX_RUNTIMES]


def mismatch(library: str | os.PathLike, reference: str | os.PathLike) -> str | None:
    """Why ``library`` does not share ``reference``'s C++ runtime, or None when it does."""
    ours, theirs = cxx_runtimes(library), cxx_runtimes(reference)
    if ours == theirs:
        return None
    ref = Path(reference).name
    if not ours:
        return (
            f"it needs no shared C++ runtime (no NEEDED {', '.join(theirs)}; {ref} needs "
            f"{', '.join(theirs)}): the compiler linked the C++ runtime into it statically"
        )
    return f"it needs {', '.join(ours) or 'none'} but {ref} needs {', '.join(theirs) or 'none'}"


def _fix(cxx: str) -> str:
    system = "/usr/bin/g++" if Path("/usr/bin/g++").exists() else None
    example = (
        "CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++"
        if system
        else "CXX=<a g++ that links libstdc++.so.6 dynamically>"
    )
    return (
        f"Fix: build with a compiler that links torch's C++ runtime dynamically, e.g.\n"
        f"    {example} pip install --no-build-isolation -e .\n"
        f"(a fresh build directory: `make clean` or remove build/), and drop -static-libstdc++ / "
        f"-static-libgcc / -stdlib=libc++ from CXXFLAGS and LDFLAGS if they are set. "
        f"Compiler used: {cxx}"
    )


_WHY = (
    "An extension with its own copy of the C++ runtime crashes (SIGSEGV) whenever one of its "
    "errors (a C++ exception) crosses into torch, instead of raising a Python exception."
)

_PROBE_SOURCE = """\
#include <stdexcept>
#include <string>
std::string torchfeed_probe(int n) {
  if (n < 0) throw std::runtime_error("negative: " + std::to_string(n));
  return std::string(static_cast<size_t>(n), 'x');
}
"""


def _probe(args: argparse.Namespace) -> int:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    source, library = work / "probe.cpp", work / "libprobe.so"
    source.write_text(_PROBE_SOURCE)
    command = [
        *shlex.split(args.cxx),
        *shlex.split(args.flags),
        "-shared",
        "-fPIC",
        str(source),
        "-o",
        str(library),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        # Not ours to judge: the real build reports the compiler's own error.
        print(
            f"torchfeed: C++ runtime probe did not link ({shlex.join(command)}):\n{result.stderr}",
            file=sys.stderr,
        )
        return 0
    why = mismatch(library, args.reference)
    if why is None:
        print(f"shares torch's C++ runtime ({', '.join(cxx_runtimes(library)) or 'none'})")
        return 0
    print(
        f"torchfeed: the C++ compiler would build an extension that does not share torch's C++ "
        f"runtime: a test library linked with `{shlex.join(command)}`: {why}.\n{_WHY}\n"
        f"{_fix(args.cxx)}",
        file=sys.stderr,
    )
    return 1


def _check(args: argparse.Namespace) -> int:
    why = mismatch(args.library, args.reference)
    if why is None:
        return 0
    if args.remove_on_failure:
        Path(args.library).unlink(missing_ok=True)  # never leave a crashing extension behind
    print(
        f"torchfeed: {args.library} does not share torch's C++ runtime: {why}.\n{_WHY}\n"
        f"{_fix(args.cxx or os.environ.get('CXX') or shutil.which('c++') or 'c++')}",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    probe = sub.add_parser("probe", help="link a test library with a compiler and check it")
    probe.add_argument("--cxx", required=True)
    probe.add_argument("--flags", default="", help="compiler and linker flags, one string")
    probe.add_argument("--reference", required=True, help="torch's libc10.so")
    probe.add_argument("--workdir", required=True)
    check = sub.add_parser("check", help="check a linked library")
    check.add_argument("library")
    check.add_argument("--reference", required=True, help="torch's libc10.so")
    check.add_argument("--cxx", default=None, help="the compiler, for the message")
    check.add_argument("--remove-on-failure", action="store_true")
    args = parser.parse_args(argv)
    return _probe(args) if args.command == "probe" else _check(args)


if __name__ == "__main__":
    sys.exit(main())
