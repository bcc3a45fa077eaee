"""read_router_stats against real routers on loopback, and the parsing of their exposition.

The routers' own fast quarantine (``rolloutpool_router_replica_pressure``) is read separately
from the combined state they obey (``rolloutpool_router_replica_quarantined``, which includes the
operator's decision): reading the combined one back into the status would latch it.
"""

from __future__ import annotations

import asyncio

import pytest

from rolloutpool.dev.net import free_port
from rolloutpool.dev.wait import wait_until_async
from rolloutpool.metrics.routerstats import (
    RouterSample,
    RouterStats,
    metrics_url,
    parse_router_metrics,
    read_router_stats,
)
from rolloutpool.router.instruments import PRESSURE_REASONS, ReplicaGauges, RouterMetrics
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.quarantine import QuarantineConfig
from routerkit import engines, no_leaked_tasks, router

EXPOSITION = """\
# HELP rolloutpool_router_live_sessions Live sessions held
# TYPE rolloutpool_router_live_sessions gauge
rolloutpool_router_live_sessions{replica="pool-engine-0"} 3.0
rolloutpool_router_live_sessions{replica="pool-engine-1"} 0.0
# HELP rolloutpool_router_queue_depth New sessions waiting for a slot
# TYPE rolloutpool_router_queue_depth gauge
rolloutpool_router_queue_depth 2.0
# HELP rolloutpool_router_session_cap Live-session cap (+Inf when unlimited)
# TYPE rolloutpool_router_session_cap gauge
rolloutpool_router_session_cap{replica="pool-engine-0"} +Inf
"""


def test_parse_router_metrics() -> None:
    assert parse_router_metrics(EXPOSITION) == RouterSample({"pool-engine-0": 3, "pool-engine-1": 0}, 2)
    assert parse_router_metrics("") == RouterSample({}, 0)


PRESSURE = """\
# TYPE rolloutpool_router_replica_pressure gauge
rolloutpool_router_replica_pressure{replica="pool-engine-0",reason="Evicting"} 0.0
rolloutpool_router_replica_pressure{replica="pool-engine-0",reason="Preempting"} 1.0
rolloutpool_router_replica_pressure{replica="pool-engine-1",reason="Evicting"} 0.0
# TYPE rolloutpool_router_replica_quarantined gauge
rolloutpool_router_replica_quarantined{replica="pool-engine-0"} 1.0
rolloutpool_router_replica_quarantined{replica="pool-engine-1"} 1.0
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PRESSURE, {"pool-engine-0": "Preempting"}),  # engine-1 is quarantined by the operator only: not the router's
        (PRESSURE.replace('reason="Preempting"} 1.0', 'reason="Preempting"} 0.0'), {}),  # lifted
        ('rolloutpool_router_replica_pressure{replica="a",reason="Queueing"} 1\n', {"a": "Queueing"}),
        ('rolloutpool_router_replica_pressure{replica="a",reason=""} 1\n', {"a": "Unknown"}),
        ('rolloutpool_router_replica_pressure{reason="Queueing"} 1\n', {}),  # no replica: nothing to show
        ('rolloutpool_router_replica_quarantined{replica="a"} 1\n', {}),  # an older router: nothing reported
        (EXPOSITION, {}),
    ],
)
def test_parse_router_quarantine(text: str, expected: dict[str, str]) -> None:
    assert parse_router_metrics(text).quarantined == expected


@pytest.mark.parametrize("pressure", [None, *PRESSURE_REASONS, "Overheating"])
def test_the_routers_pressure_gauge_parses_back(pressure: str | None) -> None:
    metrics = RouterMetrics()
    held = ReplicaGauges("p-engine-0", live=2, cap=4, quarantined=True, ready=True, draining=False, inflight=0)
    own = ReplicaGauges(
        "p-engine-1",
        live=1,
        cap=4,
        quarantined=pressure is not None,
        ready=True,
        draining=False,
        inflight=1,
        pressure=pressure,
    )
    metrics.watch(lambda: [held, own], lambda: 0)
    text = metrics.render().decode()
    sample = parse_router_metrics(text)
    assert sample.quarantined == ({} if pressure is None else {"p-engine-1": pressure})
    assert sample.live_sessions == {"p-engine-0": 2, "p-engine-1": 1}
    lines = [line for line in text.splitlines() if line.startswith("rolloutpool_router_replica_pressure{")]
    expected_reasons = {*PRESSURE_REASONS, *([pressure] if pressure else [])}
    assert len(lines) == 2 * len(PRESSURE_REASONS) + (pressure == "Overheating")  # a fixed set, plus a new reason
    assert {line.split('reason="')[1].split('"')[0] for line in lines} == expected_reasons


def test_parse_router_metrics_rejects_garbage() -> None:
    with pytest.raises(ValueError, match=r"."):
        parse_router_metrics("<html>this is not an exposition</html>\n")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://10.0.0.5:8080", "http://10.0.0.5:8080/metrics"),
        ("http://10.0.0.5:8080/", "http://10.0.0.5:8080/metrics"),
        ("http://10.0.0.5:8080/metrics", "http://10.0.0.5:8080/metrics"),
    ],
)
def test_metrics_url(url: str, expected: str) -> None:
    assert metrics_url(url) == expected


def test_no_router_answers() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    stats = read_router_stats([dead, "file:///etc/passwd"], timeout_seconds=0.5)
    assert (stats.live_sessions, stats.queued_sessions, stats.reachable) == ({}, 0, 0)
    assert len(stats.errors) == 2
    assert stats.errors[0].startswith(f"{dead}/metrics: ")
    assert "not an http(s) URL" in stats.errors[1]
    assert read_router_stats([]) == RouterStats(live_sessions={}, queued_sessions=0, reachable=0)
    assert stats.quarantined == {}  # unreachable routers report nothing


async def test_sums_live_sessions_and_queue_over_routers_and_skips_a_dead_one() -> None:
    async with (
        engines(2) as urls,
        router(urls, cap=1, queue_timeout_s=30.0) as first,
        router(urls) as second,
    ):
        for session in ("a", "b"):  # cap 1 each: one session per engine
            assert (await first.post("/v1/sessions", {"session_id": session}))[0] == 201
        waiting = asyncio.create_task(first.post("/v1/sessions", {"session_id": "queued"}))
        await wait_until_async(lambda: first.manager.queue_depth == 1)
        for session in ("c", "d", "e"):
            assert (await second.post("/v1/sessions", {"session_id": session}))[0] == 201
        dead = f"http://127.0.0.1:{free_port()}"
        stats = await asyncio.to_thread(
            read_router_stats, [first.url, f"{second.url}/metrics", dead], timeout_seconds=1.0
        )
        expected_live = {name: first.live()[name] + second.live()[name] for name in urls}
        assert stats.live_sessions == expected_live
        assert sum(stats.live_sessions.values()) == 5
        assert stats.queued_sessions == 1
        assert stats.reachable == 2
        assert len(stats.errors) == 1
        assert dead in stats.errors[0]
        assert (await first.request("DELETE", "/v1/sessions/a"))[0] == 200
        assert (await waiting)[0] == 201
    await no_leaked_tasks()


async def test_reports_each_routers_own_quarantine_not_the_operators() -> None:
    hold = QuarantineConfig(hold_seconds=120.0)  # lifted by a finished session in this test, not by time
    async with engines(3) as urls, router(urls, quarantine=hold) as first, router(urls, quarantine=hold) as second:
        for session in ("a", "b", "c"):  # one per engine (least loaded)
            assert (await first.post("/v1/sessions", {"session_id": session}))[0] == 201
        on_e0 = next(sid for sid, s in first.manager.table.sessions.items() if s.replica == "e0")
        # e0: the first router's fast loop sees the engine's preemption counter move (the real PressureState path)
        first.manager.observe_scrape("e0", preemptions_total=0.0, waiting=0.0)
        first.manager.observe_scrape("e0", preemptions_total=3.0, waiting=0.0)
        # e1: quarantined by the operator (the pool's status) on the second router: obeyed, but not its own
        second.manager.set_operator_limits({"e1": OperatorLimit(target=None, quarantined=True, reason="Evicting")})
        await wait_until_async(
            lambda: first.manager.replica("e0").quarantined and second.manager.replica("e1").quarantined
        )
        assert await second.metric("rolloutpool_router_replica_quarantined", replica="e1") == 1.0
        assert await second.metric("rolloutpool_router_replica_pressure", replica="e1") == 0.0
        assert await first.metric("rolloutpool_router_replica_pressure", replica="e0", reason="Preempting") == 1.0
        stats = await asyncio.to_thread(read_router_stats, [first.url, second.url], timeout_seconds=2.0)
        assert stats.quarantined == {"e0": "Preempting"}
        assert stats.reachable == 2
        # one of e0's sessions finishes: the router lifts its own quarantine, and reports nothing any more
        assert (await first.request("DELETE", f"/v1/sessions/{on_e0}"))[0] == 200
        assert not first.manager.replica("e0").quarantined
        stats = await asyncio.to_thread(read_router_stats, [first.url, second.url], timeout_seconds=2.0)
        assert stats.quarantined == {}
    await no_leaked_tasks()
