"""read_router_stats against real routers on loopback, and the parsing of their exposition."""

from __future__ import annotations

import asyncio

import pytest

from rolloutpool.localcluster.cluster import free_port
from rolloutpool.metrics.routerstats import RouterStats, metrics_url, parse_router_metrics, read_router_stats
from routerkit import engines, eventually, no_leaked_tasks, router

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
    assert parse_router_metrics(EXPOSITION) == ({"pool-engine-0": 3, "pool-engine-1": 0}, 2)
    assert parse_router_metrics("") == ({}, 0)


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


async def test_sums_live_sessions_and_queue_over_routers_and_skips_a_dead_one() -> None:
    async with (
        engines(2) as urls,
        router(urls, cap=1, queue_timeout_s=30.0) as first,
        router(urls) as second,
    ):
        for session in ("a", "b"):  # cap 1 each: one session per engine
            assert (await first.post("/v1/sessions", {"session_id": session}))[0] == 201
        waiting = asyncio.create_task(first.post("/v1/sessions", {"session_id": "queued"}))
        await eventually(lambda: first.manager.queue_depth == 1)
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
