"""The memory budget of the rings torchfeed sizes by itself: the container's limit read from
cgroup files (v1 and v2 layouts, written here under a temporary root), the ranks on the
machine from LOCAL_WORLD_SIZE, and the caps that the prefetcher's page-locked ring and a
worker's recycled memory take from it."""

from __future__ import annotations

import pytest
import torch

import torchfeed
from torchfeed.memory import PinnedRing, _pinned_ring, _recycled
from torchfeed.memory._budget import Budget, cgroup_memory_limit, local_processes, memory_budget

GiB = 1 << 30


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def cgroup_file(tmp_path, *lines):
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("".join(f"{line}\n" for line in lines))
    return str(proc)


def test_v2_the_tightest_limit_from_the_process_cgroup_to_the_root(tmp_path):
    root = tmp_path / "cgroup"
    write(root / "kubepods" / "memory.max", f"{64 * GiB}\n")
    write(root / "kubepods" / "pod1" / "memory.max", f"{8 * GiB}\n")
    write(root / "kubepods" / "pod1" / "ctr" / "memory.max", "max\n")  # no limit of its own
    proc = cgroup_file(tmp_path, "0::/kubepods/pod1/ctr")
    assert cgroup_memory_limit(str(root), proc) == 8 * GiB


def test_v2_inside_a_container_that_sees_its_cgroup_as_the_root(tmp_path):
    root = tmp_path / "cgroup"
    write(root / "memory.max", f"{4 * GiB}\n")
    assert cgroup_memory_limit(str(root), cgroup_file(tmp_path, "0::/")) == 4 * GiB


def test_v1_the_memory_hierarchy_and_a_path_the_container_cannot_see(tmp_path):
    root = tmp_path / "cgroup"
    unlimited = "9223372036854771712\n"  # v1's "no limit"
    write(root / "memory" / "memory.limit_in_bytes", unlimited)
    write(root / "memory" / "docker" / "abc" / "memory.limit_in_bytes", f"{2 * GiB}\n")
    write(root / "cpu,cpuacct" / "docker" / "abc" / "memory.limit_in_bytes", "1\n")  # not memory
    lines = ("4:memory:/docker/abc", "3:cpu,cpuacct:/docker/abc", "1:name=systemd:/docker/abc")
    assert cgroup_memory_limit(str(root), cgroup_file(tmp_path, *lines)) == 2 * GiB
    # the process's path does not exist under the mount (a cgroup namespace): the mount's root
    # file is the container's own
    (root / "memory" / "memory.limit_in_bytes").write_text(f"{3 * GiB}\n")
    proc = cgroup_file(tmp_path, "4:memory:/elsewhere/xyz")
    assert cgroup_memory_limit(str(root), proc) == 3 * GiB


def test_no_limit_where_nothing_says_one(tmp_path):
    root = tmp_path / "cgroup"
    assert cgroup_memory_limit(str(root), str(tmp_path / "absent")) is None
    assert cgroup_memory_limit(str(root), cgroup_file(tmp_path, "0::/a")) is None  # no files
    write(root / "a" / "memory.max", "max\n")
    write(root / "memory.max", "not a number\n")
    assert cgroup_memory_limit(str(root), cgroup_file(tmp_path, "0::/a", "garbage")) is None


def test_this_process_reads_without_error():
    limit = cgroup_memory_limit()
    assert limit is None or limit > 0
    budget = memory_budget()
    assert budget.machine == torchfeed._C.physical_memory()
    assert budget.memory == (min(budget.machine, limit) if limit is not None else budget.machine)


def test_local_processes_from_torchrun(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert local_processes() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert local_processes() == 8
    for bad in ("0", "-2", "eight", "1.5"):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", bad)
        with pytest.raises(ValueError, match=rf"LOCAL_WORLD_SIZE must be an integer >= 1.*{bad!r}"):
            local_processes()


def test_shares_and_their_words():
    b = Budget(64 * GiB, 16 * GiB, 8)
    assert b.memory == 16 * GiB and b.share(2) == GiB and b.share(4) == GiB // 2
    assert b.describe(2) == (
        "half of the container's 17.2 GB memory limit, shared by LOCAL_WORLD_SIZE=8 "
        "processes: 1.1 GB"
    )
    # a container limit above the machine's memory is no limit
    assert Budget(8 * GiB, 64 * GiB, 1).describe(4) == "a quarter of this machine's 8.6 GB: 2.1 GB"
    assert Budget(100, None, 1000).share(2) == 1  # never 0 bytes


@pytest.fixture
def fresh_arenas(monkeypatch):
    monkeypatch.setattr(_pinned_ring, "_SHARED", {})


def test_the_prefetchers_page_locked_arena_is_capped(monkeypatch, fresh_arenas):
    monkeypatch.setattr(_pinned_ring, "memory_budget", lambda: Budget(1 * GiB, 32 << 20, 2))
    ring = PinnedRing.for_device("cpu", 1 * GiB)  # asks for far more than 32 MiB / 2 / 2
    assert ring.capacity == 8 << 20
    assert PinnedRing.for_device("cpu", 1 * GiB) is ring  # capped: not made again per call
    assert PinnedRing.for_device("cpu", 1 << 20) is ring
    # a prefetcher sizing its arena from a 12 MiB batch (as on a GPU machine) gets the same one
    p = torchfeed.DevicePrefetcher([], "cpu")
    p._auto_ring = True
    assert p._ring_for(torch.zeros(12 << 20, dtype=torch.uint8)) is ring


def test_the_arena_still_grows_up_to_the_cap(monkeypatch, fresh_arenas):
    monkeypatch.setattr(_pinned_ring, "memory_budget", lambda: Budget(1 * GiB, None, 1))
    small = PinnedRing.for_device("cpu", 1 << 20)
    assert small.capacity == 1 << 20
    grown = PinnedRing.for_device("cpu", (1 << 20) + 1)  # doubled, not per byte
    assert grown is not small and grown.capacity == 2 << 20
    big = PinnedRing.for_device("cpu", 400 << 20)  # 2 x 400 MiB would pass half of 1 GiB
    assert big.capacity == 400 << 20
    assert PinnedRing.for_device("cpu", 600 << 20).capacity == 512 << 20


def test_a_workers_recycled_memory_takes_its_share(monkeypatch):
    """A worker's ring is sized from its first batch (six of them), at most a quarter of the
    budget: virtual capacity, allocated as written, but never beyond the container."""
    seen = []

    class Ring:
        def __init__(self, capacity, **kw):
            seen.append(capacity)

    monkeypatch.setattr(_recycled, "SharedRing", Ring)
    monkeypatch.setattr(_recycled, "memory_budget", lambda: Budget(1 * GiB, 256 << 20, 2))
    monkeypatch.setattr(_recycled, "_worker_ring", None)
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)
    _recycled._ring_for(100 << 20)  # wants 6 x 100 MiB
    assert seen == [32 << 20]  # 256 MiB / 4 / 2
    monkeypatch.setattr(_recycled, "_worker_ring_pid", -1)
    monkeypatch.setattr(_recycled, "memory_budget", lambda: Budget(64 * GiB, None, 1))
    _recycled._ring_for(1 << 20)
    assert seen[-1] == _recycled.RING_MIN_BYTES  # small batches: the floor, as before
