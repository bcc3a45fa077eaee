"""The router with a peer's turn scheduler (``--turn-scheduler``): real engine simulators and a router on loopback."""

from __future__ import annotations

import asyncio

from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.routing.peers.progress_ttl import ProgressTTL
from rolloutpool.routing.peers.thunderagent import LeastWorkingSet, ThunderAgent
from rolloutpool.routing.workingset import Phase
from routerkit import engines, router


async def test_thunderagent_schedules_the_routers_sessions_and_keeps_them_sticky() -> None:
    async with engines(2) as urls, router(urls, turn_scheduler="thunderagent",
                                          turn_scheduler_config={"interval_s": 0.1}) as r:  # fmt: skip
        work = r.manager.ledger.work
        assert isinstance(work, ThunderAgent)
        assert isinstance(r.manager.ledger.policy, LeastWorkingSet)
        assert r.manager.ledger.config.quarantine is None  # a peer runs without our fast quarantine
        served: dict[str, set[str | None]] = {}
        for turn in range(3):
            for s in ("a", "b", "c"):
                status, _, replica = await r.complete(f"{s} turn {turn} " * 20, session=s)
                assert status == 200
                served.setdefault(s, set()).add(replica)
        assert all(len(replicas) == 1 for replicas in served.values())  # nothing paused: each stays put
        assert {len(v) for v in served.values()} == {1}
        assert sum(w.counted for w in work.replicas.values()) > 0  # the programs' working sets
        assert await r.metric("rolloutpool_router_working_set_tokens") > 0
        r.live()


async def test_progress_ttl_pauses_an_acting_session_when_its_ttl_ends_and_serves_its_next_turn() -> None:
    config = {"max_acting_ttl_s": 0.2, "interval_s": 0.05}
    async with engines(1) as urls, router(urls, turn_scheduler="progress-ttl", turn_scheduler_config=config) as r:
        work = r.manager.ledger.work
        assert isinstance(work, ProgressTTL)
        status, _, _ = await r.complete("hello " * 30, session="s")
        assert status == 200
        assert work.phase("s") is Phase.IDLE
        for _ in range(100):  # the router's tick (every scrape) runs the scheduler's loop
            if work.phase("s") is Phase.LET_GO:
                break
            await asyncio.sleep(0.05)
        assert work.phase("s") is Phase.LET_GO
        status, _, _ = await r.complete("hello " * 30 + "more", session="s")
        assert status == 200  # room on its replica: served at once
        assert work.lapsed("s")


def test_a_bad_turn_scheduler_config_is_a_usage_error() -> None:
    base = ["router", "--replica", "e0=http://127.0.0.1:1", "--turn-scheduler", "thunderagent"]
    result = CliRunner().invoke(main, [*base, "--turn-scheduler-config", "[1]"])
    assert result.exit_code == 2
    assert "JSON object" in result.output
    result = CliRunner().invoke(main, [*base, "--turn-scheduler-config", '{"pause_target": 2}'])
    assert result.exit_code == 2
    assert "pause_target" in result.output
    assert "--turn-scheduler" not in CliRunner().invoke(main, ["router", "--help"]).output  # hidden
