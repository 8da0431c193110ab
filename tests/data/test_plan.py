"""Epoch plans: an elastic resume deals the rest of the epoch out in shares of equal length (so
every rank yields the same number of batches), every unconsumed sample read once but for the
documented padding (the rest's first samples again) or dropping (the rest's last samples)."""

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
def test_a_resumed_plan_reads_what_is_left_once_in_equal_shares(
    lengths, before, after, uneven, data
):
    plan = EpochPlan.fresh(lengths, before, uneven)
    consumed = [data.draw(st.integers(0, plan.length(c))) for c in range(before)]
    rest = plan.resumed(consumed, after)
    total = lambda segs: [(p, k) for p, a, b in segs for k in range(a, b)]  # noqa: E731
    head = [s for c in range(before) for s in total(plan.shares[c])[: consumed[c]]]
    left = [s for c in range(before) for s in total(plan.shares[c])[consumed[c] :]]
    tail = [s for c in range(after) for s in total(rest.shares[c])]
    sizes = {rest.length(c) for c in range(after)}
    assert len(sizes) == 1  # equal shares: every consumer the same number of samples
    (size,) = sizes
    if uneven == "pad":
        assert size == -(-len(left) // after)
        assert tail[: len(left)] == left  # the rest, in order, then its first samples again
        assert tail[len(left) :] == (left * after)[: len(tail) - len(left)]
    else:
        assert size == len(left) // after
        assert tail == left[: len(tail)]  # the rest, in order, without its last samples
        assert len(left) - len(tail) < after
    assert set(head + tail) <= set(head + left)
