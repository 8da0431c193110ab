"""What a forked worker sees of a page-locked shared ring, on the machine it runs on.

    python scripts/gpu_ring_probe.py

gpu_check.sh runs it before the CUDA tests: on the 2026-12-04 H200 run the zero-copy loader's
first handle was stale there and nowhere else. It prints, for the parent and for a forked child,
the kernel's flags on the ring's mappings (``dc``: not inherited by a fork), whether the child's
writes reach the parent, whether the child sees its sibling alive, and then runs the tight
zero-copy loop of tests/memory/test_fenced.py with the ring's counters on failure. Exit status 0
when every part agrees with what the zero-copy loader assumes.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import sys
import time
import traceback

import torch

import torchfeed
from torchfeed.collate import PadCollate
from torchfeed.memory import SharedRing

faulthandler.dump_traceback_later(100, exit=True)  # a hang prints where, then ends the probe
problems: list[str] = []


def vm_flags(address: int) -> str:
    """The VmFlags line of the mapping holding ``address`` in this process (or 'unmapped')."""
    start = end = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and all(c in "0123456789abcdef-" for c in head):
                lo, hi = (int(x, 16) for x in head.split("-"))
                start, end = (lo, hi) if lo <= address < hi else (None, None)
            elif head == "VmFlags:" and start is not None:
                return f"[{start:#x}, {end:#x}) {line.split(':', 1)[1].strip()}"
    return "unmapped"


def fork_case() -> None:
    ring = SharedRing(4 << 20)
    data = ring._ring.data_address
    control = data - 4096
    print(f"ring: pinned={ring.pinned}, cuda initialized={torch.cuda.is_initialized()}")
    print(f"parent control page: {vm_flags(control)}")
    print(f"parent data area:    {vm_flags(data)}")
    sibling = os.fork()
    if sibling == 0:
        time.sleep(5)
        os._exit(0)
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            report = {
                "control": vm_flags(control),
                "data": vm_flags(data),
                "sibling_alive": _alive(sibling),
            }
            handle = ring.pack({"x": torch.full((1000,), 7, dtype=torch.uint8)})
            report["handle"] = handle
            report["stats"] = ring.stats()
        except BaseException:
            report = {"error": traceback.format_exc()}
        os.write(w, pickle.dumps(report))
        os._exit(0)
    os.close(w)
    blob = b""
    while chunk := os.read(r, 1 << 16):
        blob += chunk
    _, status = os.waitpid(child, 0)
    os.waitpid(sibling, 0)
    if not blob:
        problems.append(f"fork: the child wrote nothing (wait status {status})")
        return
    report = pickle.loads(blob)
    print(f"child: {report}")
    if "error" in report:
        problems.append("fork: the child's pack failed")
        return
    if "dc" in report["data"].split() or report["data"] == "unmapped":
        problems.append("fork: the data area is not inherited by a forked child")
    if report["sibling_alive"] != "yes":
        problems.append(f"fork: kill(pid, 0) on a live sibling: {report['sibling_alive']}")
    print(f"parent stats after the child's pack: {ring.stats()}")
    try:
        got = ring.unpack(report["handle"])["x"]
        print(f"parent reads the child's batch: {got[:4].tolist()} (7s expected)")
        if not bool((got == 7).all()):
            problems.append("fork: the parent does not see what the child wrote")
    except Exception as e:
        problems.append(f"fork: unpack failed: {e}")


def _alive(pid: int) -> str:
    """What kill(pid, 0) says of a live process: 'yes', or the error it gave."""
    try:
        os.kill(pid, 0)
        return "yes"
    except OSError as e:
        return f"{type(e).__name__} errno {e.errno}"


class Big(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((1 << 20,), i, dtype=torch.uint8)}


def loader_case() -> None:
    loader = torchfeed.loader(Big(), zero_copy=True, batch_size=1, num_workers=2,
                              prefetch_factor=1, collate_fn=PadCollate([]),
                              ring_capacity=3 << 20)  # fmt: skip
    got = []
    try:
        for b in loader:
            if torch.cuda.is_available():
                torch.cuda._sleep(20_000_000)
                got.append(b["x"].to("cuda", non_blocking=True))
            else:
                got.append(b["x"].clone())
            del b
        values = [int(t.float().mean()) for t in got]
        print(f"tight loader: {values}")
        if values != list(range(16)):
            problems.append("loader: wrong batches")
    except Exception as e:
        ring = loader.shared_ring
        print(f"tight loader failed after {len(got)} batches: {e}")
        print(f"  ring: {ring.stats() if ring is not None else None}")
        problems.append(f"loader: {type(e).__name__}")


for case in (fork_case, loader_case):
    print(f"== {case.__name__}")
    try:
        case()
    except Exception:
        traceback.print_exc()
        problems.append(f"{case.__name__} raised")
print("== result: " + ("ok" if not problems else "; ".join(problems)))
sys.exit(1 if problems else 0)
