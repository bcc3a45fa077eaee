"""The censored quantile behind the measured floor: finished sessions are events, live ones right-censored."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rolloutpool.routing.survival import censored_quantile

contexts = st.lists(st.integers(min_value=1, max_value=40).map(lambda k: k * 500.0), max_size=60)


def _plain_quantile(values: list[float], q: float) -> float:
    """The empirical quantile: the smallest value with at least ``q`` of the values at or under it."""
    ordered = sorted(values)
    return ordered[math.ceil(q * len(ordered) - 1e-9) - 1]


def test_without_live_sessions_it_is_the_finished_sessions_quantile() -> None:
    finished = [float(v) for v in range(1, 101)]
    assert censored_quantile(finished=finished, live=[], q=0.9) == 90.0
    assert censored_quantile(finished=finished, live=[], q=0.5) == 50.0


def test_live_sessions_past_the_short_finishers_leave_no_quantile() -> None:
    """The first rollouts to finish are the short ones; the long ones still growing past them are not short."""
    short = [3000.0] * 20
    assert censored_quantile(finished=short, live=[], q=0.9) == 3000.0
    assert censored_quantile(finished=short, live=[3500.0] * 10, q=0.9) is None
    assert censored_quantile(finished=short, live=[3000.0] * 10, q=0.9) is None  # at risk at the same context


def test_live_sessions_below_the_finished_ones_change_nothing_above_them() -> None:
    """Sessions early in their rollouts say nothing of the contexts they have not reached."""
    finished = [float(v) for v in range(1000, 11000, 100)]
    assert censored_quantile(finished=finished, live=[500.0] * 50, q=0.9) == censored_quantile(
        finished=finished, live=[], q=0.9
    )


def test_nothing_finished_gives_no_quantile() -> None:
    assert censored_quantile(finished=[], live=[1000.0, 2000.0], q=0.9) is None
    assert censored_quantile(finished=[], live=[], q=0.9) is None


@pytest.mark.parametrize("q", [0.0, 1.0, -0.1, 1.5])
def test_a_quantile_outside_the_open_unit_interval_is_refused(q: float) -> None:
    with pytest.raises(ValueError, match="q must be in"):
        censored_quantile(finished=[1.0], live=[], q=q)


@given(finished=contexts, live=contexts, q=st.sampled_from([0.5, 0.75, 0.9]))
def test_censoring_only_raises_the_quantile(finished: list[float], live: list[float], q: float) -> None:
    """Counting live sessions never makes contexts look shorter than the finished ones alone say."""
    alone = censored_quantile(finished=finished, live=[], q=q)
    if not finished:
        assert alone is None
        return
    assert alone == _plain_quantile(finished, q)
    with_live = censored_quantile(finished=finished, live=live, q=q)
    assert with_live is None or with_live >= alone
    assert with_live is None or with_live in finished
