"""What a pipeline costs besides time: the CPU seconds of the benchmark's process and all its
descendants (the DataLoader's workers), and the peak of the memory they hold together.

Memory is the proportional set size (Linux's ``Pss``: a page shared by n processes counts 1/n in
each), summed over the process tree and sampled every ``interval`` seconds, so shared-memory
batches and the pages workers inherit are counted once, not once per process. Linux only (read
from ``/proc``); elsewhere both figures are None."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource
import threading
import time
from pathlib import Path

__all__ = ["ProcessTreeMeter", "release_freed_memory", "supported"]

_PROC = Path("/proc")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def supported() -> bool:
    return (_PROC / "self" / "smaps_rollup").exists()


def _descendants(root: int) -> list[int]:
    """``root`` and every live process below it (from each process's parent in /proc/*/stat)."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # the command name is in parentheses and may hold spaces: the fields follow the last ")"
        fields = stat[stat.rindex(")") + 2 :].split()
        parents[int(entry.name)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _cpu_seconds(pid: int) -> float:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime


def _pss_bytes(pid: int) -> int:
    try:
        text = (_PROC / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def tree_cpu_seconds() -> float:
    """CPU seconds used so far by this process (to the microsecond), its live descendants (to
    the clock tick, /proc's resolution), and the children it has waited for (workers that
    already exited)."""
    me = os.getpid()
    live = sum(_cpu_seconds(pid) for pid in _descendants(me) if pid != me)
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + live + reaped.ru_utime + reaped.ru_stime


def _libc_malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc
        return None


_MALLOC_TRIM = _libc_malloc_trim()


def release_freed_memory() -> None:
    """Collects garbage and hands the heap it freed back to the system (glibc's
    ``malloc_trim``), so that the next pipeline's workers fork from a process holding only
    live memory. A parent that keeps gigabytes of freed heap (the stage timings' decoded photos,
    an earlier pipeline's batches) shares those pages copy-on-write with every worker it forks,
    and each page either side writes again is copied: on the photo-sized set the baseline's
    CPU per image rose from 54 to 66 ms after the stage timings, and was 55-62 ms after them
    with a trim."""
    gc.collect()
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def tree_pss_bytes() -> int:
    return sum(_pss_bytes(pid) for pid in _descendants(os.getpid()))


class ProcessTreeMeter:
    """Samples the process tree's memory in a thread from ``start()`` to ``stop()``; ``peak``
    is the largest sum seen (bytes) and ``before`` the sum at ``start()``, None where /proc
    cannot tell.

    A sample is not free: the kernel walks every mapping of a process to sum its Pss (about
    17 ms for a process that has imported a CUDA build of torch), and three such processes
    sampled every 0.1 s took a quarter of one of this machine's two cores, inside the main
    process, from the pipeline it measured. So the meter waits at least ``interval`` between
    samples, and starts one only while what it has spent since ``start()`` is within ``budget`` of
    one core over the time since then (paced on the total, not on the last sample: a sample's cost
    moves with the load, and pacing on the last one overspends whenever the next costs more). It
    counts the CPU time it spends (``cpu_seconds``, and ``longest_sample``) so that the caller can
    leave it out of the pipeline's."""

    def __init__(self, interval: float = 0.1, budget: float = 0.05) -> None:
        self.interval = interval
        self.budget = budget
        self.peak: int | None = None
        self.before: int | None = None
        self.cpu_seconds = 0.0
        self.longest_sample = 0.0
        self._started = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> ProcessTreeMeter:
        if not supported():
            return self
        self._started = time.monotonic()
        self.peak = self.before = self._measure()
        self._thread = threading.Thread(target=self._run, name="torchfeed-bench-meter", daemon=True)
        self._thread.start()
        return self

    def _measure(self) -> int:
        with self._lock:
            start = time.thread_time()  # this thread's CPU, the kernel's time on its behalf too
            pss = tree_pss_bytes()
            spent = time.thread_time() - start
            self.cpu_seconds += spent
            self.longest_sample = max(self.longest_sample, spent)
        return pss

    def cpu_and_metering(self) -> tuple[float, float]:
        """(``tree_cpu_seconds()``, ``cpu_seconds``) read together, with no sample in
        progress: the difference of two such readings is the tree's CPU and the part of it
        the meter spent, over the same interval."""
        with self._lock:
            return tree_cpu_seconds(), self.cpu_seconds

    def _run(self) -> None:
        while not self._stop.wait(self._until_next()):
            self.sample()

    def _until_next(self) -> float:
        """Seconds to wait before the next sample: ``interval``, or longer while the CPU spent
        so far is over ``budget`` of the time since ``start()``."""
        elapsed = time.monotonic() - self._started
        return max(self.interval, self.cpu_seconds / self.budget - elapsed)

    def sample(self) -> None:
        if self.peak is None:
            return
        pss = self._measure()
        # The peak is read after the measurement, under the lock: read before it (as
        # max(self.peak, self._measure()) does), the meter thread's sample could overwrite a
        # larger one taken meanwhile by a sample() called from the caller's thread.
        with self._lock:
            self.peak = max(self.peak, pss)

    def stop(self) -> int | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.peak
