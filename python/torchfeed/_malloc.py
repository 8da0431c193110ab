"""What a process's malloc does with the memory of decoded photos, and the setting that makes
glibc's keep it: one home for ``torchfeed doctor``'s advice, the bench's machine line and
scripts/malloc_effect.py."""

from __future__ import annotations

import platform
from collections.abc import Mapping

__all__ = ["KEEP_HEAP_ENV", "describe", "heap_kept"]

# The environment that makes glibc's malloc keep a process's heap: allocations up to 1 GB come
# from it rather than from fresh mappings, and up to 4 GB of it stays mapped when freed. By
# default an allocation above the mmap threshold (adjusted up to 32 MB) is a fresh mapping,
# unmapped when freed, and freed heap above the trim threshold (up to 64 MB) goes back to the
# system: a decoded photo, allocated and freed once a sample, is written into new pages every
# time, a page fault a page (scripts/malloc_effect.py measures what that costs). It takes both:
# either one set alone stops glibc adjusting the other, so the mmap threshold alone leaves the
# trim threshold at 128 KB (the heap given back at every free), and the trim threshold alone
# leaves every allocation over 128 KB a fresh mapping.
KEEP_HEAP_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(4 << 30)}
# the GLIBC_TUNABLES names of the same settings
_TUNABLES = {
    "MALLOC_MMAP_THRESHOLD_": "glibc.malloc.mmap_threshold",
    "MALLOC_TRIM_THRESHOLD_": "glibc.malloc.trim_threshold",
}
# allocators a job may preload instead of glibc's (its thresholds then do not apply)
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def _preloaded(environ: Mapping[str, str]) -> str | None:
    """The other allocator ``environ``'s LD_PRELOAD names, if any."""
    preload = environ.get("LD_PRELOAD", "")
    return next((name for name in _OTHER_ALLOCATORS if name in preload), None)


def heap_kept(environ: Mapping[str, str]) -> bool:
    """Whether a process started with ``environ`` keeps freed photos' memory, or was told how:
    both of glibc's thresholds set (each in the environment or in GLIBC_TUNABLES), another
    allocator preloaded, or a C library other than glibc (whose malloc this is not about)."""
    if _preloaded(environ) is not None or platform.libc_ver()[0] != "glibc":
        return True
    tunables = environ.get("GLIBC_TUNABLES", "")
    return all(k in environ or f"{t}=" in tunables for k, t in _TUNABLES.items())


def describe(environ: Mapping[str, str]) -> str:
    """The allocator a process started with ``environ`` uses, and what it was told: e.g.
    "glibc 2.36 defaults", "glibc 2.36, MALLOC_TRIM_THRESHOLD_=4294967296", "jemalloc
    (LD_PRELOAD)"."""
    preloaded = _preloaded(environ)
    if preloaded is not None:
        return f"{preloaded} (LD_PRELOAD)"
    libc, version = platform.libc_ver()
    if libc != "glibc":
        return "the C library's (not glibc)"
    told = [f"{k}={environ[k]}" for k in KEEP_HEAP_ENV if k in environ]
    told += [
        t for t in environ.get("GLIBC_TUNABLES", "").split(":") if t.startswith("glibc.malloc.")
    ]
    return f"glibc {version}, " + " ".join(told) if told else f"glibc {version} defaults"
