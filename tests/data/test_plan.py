"""Mid-epoch checkpoints (issue 13): epoch plans, the distributed sampler, the sharded dataset,
torchfeed.loader (ordinary and zero-copy) and torchdata's StatefulDataLoader. Deterministic
resume reproduces the uninterrupted run bit for bit; elastic resume reads every sample not yet
consumed exactly once. (The torchrun runs over real ranks are in test_resume_torchrun.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from torchfeed.data._plan import EpochPlan


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=30),
    before=st.integers(1, 6),
    after=st.integers(1, 6),
    uneven=st.sampled_from(["drop", "pad"]),
    data=st.data(),
)
def test_a_resumed_plan_reads_what_is_left_exactly_once_in_balanced_shares(
    lengths, before, after, uneven, data
):
    plan = EpochPlan.fresh(lengths, before, uneven)
    consumed = [data.draw(st.integers(0, plan.length(c))) for c in range(before)]
    rest = plan.resumed(consumed, after)
    total = lambda segs: [(p, k) for p, a, b in segs for k in range(a, b)]  # noqa: E731
    read = [s for c in range(before) for s in total(plan.shares[c])[: consumed[c]]]
    read += [s for c in range(after) for s in total(rest.shares[c])]
    planned = [s for c in range(before) for s in total(plan.shares[c])]
    assert sorted(read) == sorted(planned)  # the plan's samples, each once
    sizes = [rest.length(c) for c in range(after)]
    assert max(sizes) - min(sizes) <= 1
