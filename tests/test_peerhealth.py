"""The pure failover rules of a static fleet: peer health with hysteresis, and the split over routers up."""

from __future__ import annotations

import itertools

import pytest

from rolloutpool.routing.fleetsplit import assign_engines
from rolloutpool.routing.peerhealth import PeerHealthConfig, PeerState, failover_split, observe

CONFIG = PeerHealthConfig(down_after=2, up_after=2)


def _run(outcomes: str, state: PeerState | None = None) -> list[bool]:
    state = state or PeerState()
    seen = []
    for outcome in outcomes:
        state = observe(state, answered=outcome == "y", config=CONFIG)
        seen.append(state.up)
    return seen


def test_a_peer_is_down_after_failures_in_a_row_and_up_after_answers_in_a_row() -> None:
    assert _run("nn") == [True, False]
    assert _run("nynyny") == [True] * 6  # one failure between answers never drops it
    assert _run("nnyny") == [True, False, False, False, False]  # one answer between failures never brings it back
    assert _run("nnyy") == [True, False, False, True]


def test_the_config_refuses_zero() -> None:
    with pytest.raises(ValueError, match="down_after"):
        PeerHealthConfig(down_after=0)


ENGINES = [f"e{i}" for i in range(7)]
PEERS = ["r0", "r1", "r2"]


def test_everyone_up_is_the_full_split() -> None:
    assert failover_split(engines=ENGINES, peers=PEERS, up=PEERS) == assign_engines(
        engines=ENGINES, routers=PEERS, previous={}
    )


@pytest.mark.parametrize("down", [d for n in (1, 2) for d in itertools.combinations(PEERS, n)])
def test_a_down_router_hands_its_engines_on_and_nothing_else_moves(down: tuple[str, ...]) -> None:
    full = failover_split(engines=ENGINES, peers=PEERS, up=PEERS)
    up = [p for p in PEERS if p not in down]
    split = failover_split(engines=ENGINES, peers=PEERS, up=up)
    assert set(split) == set(ENGINES)
    assert set(split.values()) <= set(up)
    for engine, router in full.items():
        if router in up:
            assert split[engine] == router  # a survivor keeps what it held
    counts = [list(split.values()).count(r) for r in up]
    assert max(counts) - min(counts) <= 1
    # every router computes the same split from the same set, whatever the order it is given in
    assert failover_split(engines=reversed(ENGINES), peers=list(reversed(PEERS)), up=set(up)) == split
