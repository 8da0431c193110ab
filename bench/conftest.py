"""Benchmarks compare torchfeed with a named baseline run in the same session on the same inputs.

Each benchmark sets ``benchmark.extra_info["role"]`` to "torchfeed", "baseline" or "floor" and
shares a group with the cases it is compared to; the summary below prints, per group, how many
times faster torchfeed's median is than each baseline's (and what fraction of the floor it
reaches). An "overhead" case is reported as a share of the group's "work" case; a case with
``extra_info["images"]`` as images/s (with ``hbm_bytes``, also as a share of an H200's HBM
bandwidth, 4.3 TB/s); one with ``extra_info["paired"]`` (seconds per round by role, the roles
timed in the same rounds) as the ratio of torchfeed's median to each other role's, and the median
of the per-round ratios. Run with ``make bench-pytest``.
"""

from __future__ import annotations

import statistics
import time

import pytest


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    session = getattr(config, "_benchmarksession", None)
    if session is None or not session.benchmarks:
        return
    groups: dict[str, list] = {}
    for bench in session.benchmarks:
        if bench:
            groups.setdefault(bench.group or "", []).append(bench)
    lines = []
    for group, benches in sorted(groups.items()):
        ours = [b for b in benches if b.extra_info.get("role") == "torchfeed"]
        others = [b for b in benches if b.extra_info.get("role") in ("baseline", "floor")]
        for mine in ours:
            for other in others:
                ratio = other.stats.median / mine.stats.median
                kind = other.extra_info["role"]
                lines.append(
                    f"{group:<34} {mine.name:<44} vs {kind} {other.name:<44} "
                    f"{mine.stats.median * 1e6:10.1f} us vs {other.stats.median * 1e6:10.1f} us  "
                    f"-> {ratio:5.2f}x"
                )
        works = [b for b in benches if b.extra_info.get("role") == "work"]
        for over in (b for b in benches if b.extra_info.get("role") == "overhead"):
            for work in works:
                share = over.stats.median / work.stats.median
                lines.append(
                    f"{group:<34} {over.name:<44} is {share:6.2%} of {work.name:<44} "
                    f"({over.stats.median * 1e6:.1f} us vs {work.stats.median * 1e6:.1f} us)"
                )
        for b in benches:
            lines.extend(paired_lines(group, b.extra_info.get("paired")))
        for b in benches:
            if "images" in b.extra_info:
                rate = b.extra_info["images"] / b.stats.median
                extra = ""
                if "hbm_bytes" in b.extra_info:
                    gbps = b.extra_info["hbm_bytes"] / b.stats.median / 1e9
                    extra = f", the floor's traffic at {gbps:8.1f} GB/s = {gbps / 4300:6.1%} of HBM"
                lines.append(f"{group:<34} {b.name:<44} {rate:12,.0f} images/s{extra}")
    if lines:
        terminalreporter.write_sep("=", "torchfeed vs baselines (median ratio, same session)")
        for line in lines:
            terminalreporter.write_line(line)


def paired_lines(group: str, paired: dict[str, list[float]] | None) -> list[str]:
    """Each torchfeed role (``torchfeed``, ``torchfeed kernel``...) against each other role in
    rounds timed together (``extra_info["paired"]``: per-round seconds by role): the ratio of
    the medians and the median of the per-round ratios."""
    if not paired:
        return []
    lines = []
    for name, ours in paired.items():
        if not name.startswith("torchfeed"):
            continue
        for kind, theirs in paired.items():
            if kind.startswith("torchfeed"):
                continue
            per_round = statistics.median(t / o for t, o in zip(theirs, ours, strict=True))
            mine, other = statistics.median(ours), statistics.median(theirs)
            lines.append(
                f"{group:<34} paired, {len(ours)} rounds: {name} vs {kind:<8} "
                f"{mine * 1e6:10.1f} us vs {other * 1e6:10.1f} us  -> {other / mine:5.2f}x "
                f"(per-round median {per_round:5.2f}x)"
            )
    return lines


@pytest.fixture
def role(benchmark):
    def set_role(name: str) -> None:
        benchmark.extra_info["role"] = name

    return set_role


@pytest.fixture
def paired_epochs(benchmark):
    """``run(loaders, samples_of, expected, rounds)``: the loaders' epochs timed in the same
    rounds, each round in another order (timed one after the other, each would meet another
    moment of a drifting machine), into ``extra_info["paired"]``. ``samples_of(batch)`` counts
    a batch's samples; every epoch must give ``expected``. A first epoch each starts the
    workers, untimed."""

    def run(loaders, samples_of, expected: int, rounds: int) -> None:
        names = list(loaders)
        times: dict[str, list[float]] = {name: [] for name in names}
        for dl in loaders.values():
            assert sum(samples_of(b) for b in dl) == expected
        done = [0]

        def one_round():
            k = done[0] % len(names)
            for name in names[k:] + names[:k]:
                start = time.perf_counter()
                n = sum(samples_of(b) for b in loaders[name])
                times[name].append(time.perf_counter() - start)
                assert n == expected
            done[0] += 1

        benchmark.pedantic(one_round, rounds=rounds, iterations=1)
        benchmark.extra_info["paired"] = times

    return run
