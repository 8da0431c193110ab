"""How much host memory the rings torchfeed sizes by itself may take in this process.

A ring sized from its batches (a zero-copy loader's, a worker's recycled memory, the
prefetcher's page-locked staging ring) is capped at a share of the memory this process may use:
the machine's, or less where the container's memory limit says so (cgroup v2 ``memory.max``,
v1 ``memory.limit_in_bytes``, the tightest on the way from this process's cgroup to the root),
divided among the processes a launcher started on this machine (``LOCAL_WORLD_SIZE``, which
torchrun sets: eight ranks of one node each make their own rings). On a GPU machine a zero-copy
ring is page-locked when it is made, so every byte of its capacity is resident from the start;
capped at half the machine per process, eight ranks would ask for four machines' worth, and a
pod limited to a fraction of its node would be killed for it.
"""

from __future__ import annotations

import os

from torchfeed._extension import physical_memory

__all__ = ["Budget", "cgroup_memory_limit", "local_processes", "memory_budget"]

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def _read_limit(path: str) -> int | None:
    """The limit in a cgroup limit file: None when the file is absent or unreadable, or says
    "max" (v2's no limit). v1's no limit is a number near 2**63, which the machine's memory
    bounds anyway."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def _ancestors(root: str, path: str) -> list[str]:
    """``root/path`` and each of its parents up to ``root`` itself."""
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    return [os.path.join(root, *parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_memory_limit(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> int | None:
    """The memory limit of this process's cgroup in bytes (the tightest of its own and its
    ancestors' that are visible under ``root``), or None where there is none or no cgroup
    file can be read. Inside a container the cgroup path in ``/proc/self/cgroup`` may not
    exist under ``root`` (the container sees its own cgroup as the root): the directories that
    do exist on the way up are read, ``root`` itself included."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    limits: list[int] = []
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":  # v2, unified hierarchy
            candidates = [os.path.join(d, "memory.max") for d in _ancestors(root, path)]
        elif "memory" in controllers.split(","):  # v1, the memory controller's hierarchy
            base = os.path.join(root, controllers)
            if not os.path.isdir(base):
                base = os.path.join(root, "memory")
            candidates = [os.path.join(d, "memory.limit_in_bytes") for d in _ancestors(base, path)]
        else:
            continue
        limits += [v for v in map(_read_limit, candidates) if v is not None]
    return min(limits) if limits else None


def local_processes() -> int:
    """The processes a launcher started on this machine, each making its own rings:
    ``LOCAL_WORLD_SIZE`` (set by torchrun), else 1."""
    text = os.environ.get("LOCAL_WORLD_SIZE")
    if text is None or text.strip() == "":
        return 1
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"the environment variable LOCAL_WORLD_SIZE must be an integer >= 1 (the processes "
            f"torchrun started on this machine), got {text!r}"
        )
    return value


class Budget:
    """This process's share of host memory, and where it comes from (for messages)."""

    def __init__(self, machine: int, container: int | None, processes: int) -> None:
        self.machine = machine
        self.container = container
        self.processes = processes
        self.memory = min(machine, container) if container is not None else machine

    @property
    def limited(self) -> bool:
        """Whether the container's limit, not the machine's memory, bounds this process."""
        return self.container is not None and self.container < self.machine

    def share(self, parts: int) -> int:
        """``1 / parts`` of the memory this process may use, split among the local processes."""
        return max(self.memory // parts // self.processes, 1)

    def describe(self, parts: int) -> str:
        """Words for :meth:`share`: e.g. "half of the container's 64.0 GB limit, shared by
        LOCAL_WORLD_SIZE=8 processes"."""
        fraction = {1: "all", 2: "half", 4: "a quarter"}.get(parts, f"1/{parts}")
        if self.limited:
            where = f"the container's {self.memory / 1e9:.1f} GB memory limit"
        else:
            where = f"this machine's {self.machine / 1e9:.1f} GB"
        words = f"{fraction} of {where}"
        if self.processes > 1:
            words += f", shared by LOCAL_WORLD_SIZE={self.processes} processes"
        return f"{words}: {self.share(parts) / 1e9:.1f} GB"


def memory_budget() -> Budget:
    """The memory this process's self-sized rings share: see the module's docstring."""
    return Budget(physical_memory(), cgroup_memory_limit(), local_processes())
