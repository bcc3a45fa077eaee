"""PrometheusSignals against a REAL Prometheus scraping real engine-sim and router processes.

Two engines named like a pool's pods sit behind a real ``rolloutpool router``; Prometheus
scrapes all three with static targets labelled ``namespace``/``pod``. A multi-turn load of
one GRPO group (on one engine: the other is drained through the router's admin API)
oversubscribes that engine's KV cache. The router runs with a working-set target of twice the
KV capacity (the misjudgement the law exists to correct): it keeps prefixes the engine cannot
hold, so returning sessions find their kept prefixes evicted. The read must show that pressure
on that engine only, and the router's held turns per replica; the control law must cut the hot
engine's target and quarantine it, leave the idle one alone, and publish no target when blind.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolloutpool.autoscale import LawParams, ReplicaControl, ReplicaSignals, classify_health, decide_replica
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.localcluster.prometheus import PrometheusServer, StaticTarget, static_scrape_config
from rolloutpool.dev.net import free_port
from rolloutpool.metrics.prom import PrometheusSignals, PrometheusUnreachable

NAMESPACE = "rl"
ENGINES = ("rl-pool-engine-0", "rl-pool-engine-1")
LEGACY = "rl-pool-engine-legacy"
MODEL = "sim"
ADMIN_TOKEN = "signals-e2e-admin-token"  # noqa: S105 - a test router's admin token
WINDOW = 30.0
# An older vLLM: KV usage only under its old name, and a cache_config_info of 100 blocks of 16.
LEGACY_EXPOSITION = b"""\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.375
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 2
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1
"""


@dataclass
class Fleet:
    engines: dict[str, str]
    router: str
    targets: list[StaticTarget]


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False


@contextlib.contextmanager
def legacy_engine() -> Iterator[str]:
    """A static /metrics in an older vLLM's names; yields its host:port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(LEGACY_EXPOSITION)))
            self.end_headers()
            self.wfile.write(LEGACY_EXPOSITION)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Two engine-sim processes, a router in front of them, a legacy target; always stopped."""
    logs = tmp_path_factory.mktemp("fleet-logs")
    with ProcessSet(Path(logs)) as processes, legacy_engine() as legacy:
        engines: dict[str, str] = {}
        targets: list[StaticTarget] = []
        for i, name in enumerate(ENGINES):
            port = free_port()
            argv = rolloutpool_argv(
                "engine-sim",
                f"--port={port}",
                f"--model={MODEL}",
                "--kv-capacity-tokens=4096",
                "--max-model-len=2048",
                "--time-scale=50",
                f"--seed={i}",
            )
            processes.start(name, argv, ready_url=f"http://127.0.0.1:{port}/health")
            engines[name] = f"http://127.0.0.1:{port}"
            targets.append(StaticTarget(f"127.0.0.1:{port}", {"namespace": NAMESPACE, "pod": name}))
        port = free_port()
        replicas = [f"--replica={name}={url}" for name, url in engines.items()]
        token = Path(logs) / "admin-token"
        token.write_text(ADMIN_TOKEN)
        argv = rolloutpool_argv(
            # a working set twice the KV capacity: prefixes the router keeps are evicted (pressure the law reads);
            # the fixed cap keeps placement free of the room it computes
            "router", f"--port={port}", "--scrape-interval=0.5", f"--admin-token-file={token}", "--target=2.0",
            "--cap=8", *replicas,
        )  # fmt: skip
        processes.start("router", argv, ready_url=f"http://127.0.0.1:{port}/readyz")
        targets.append(StaticTarget(f"127.0.0.1:{port}", {"namespace": NAMESPACE, "pod": "rl-pool-router-abc12"}))
        targets.append(StaticTarget(legacy, {"namespace": NAMESPACE, "pod": LEGACY}))
        yield Fleet(engines=engines, router=f"http://127.0.0.1:{port}", targets=targets)


def _observation(session: int, turn: int, words: int) -> str:
    return " ".join(f"out{(session * 31 + turn * 7 + i) % 97}" for i in range(words))


async def _turn(http: aiohttp.ClientSession, url: str, session: str, chat: list[dict[str, str]]) -> str:
    """One turn of one session through the router; returns the replica that served it."""
    body: dict[str, Any] = {"model": MODEL, "messages": chat, "max_tokens": 40}
    headers = {"X-Session-ID": session, "X-Session-Group": "group-0"}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
        data = await resp.json()
        assert resp.status == 200, data
        replica = resp.headers["X-RolloutPool-Replica"]
    chat.append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
    return replica


async def drain(router: str, replica: str) -> None:
    """Take ``replica`` out of placement through the router's admin API (it keeps serving and being scraped)."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{router}/admin/replicas/{replica}/drain", headers=headers) as resp,
    ):
        assert resp.status == 200, await resp.text()


async def drive_group(router: str, *, sessions: int, turns: int, observation_words: int, tool_s: float) -> set[str]:
    """A GRPO group of multi-turn sessions, turns in lockstep with a tool pause; returns replicas used."""
    chats = [[{"role": "user", "content": f"Fix bug {s} in the parser."}] for s in range(sessions)]
    used: set[str] = set()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        for turn in range(turns):
            used |= set(await asyncio.gather(*(_turn(http, router, f"s{s}", chats[s]) for s in range(sessions))))
            for s, chat in enumerate(chats):
                chat.append({"role": "user", "content": _observation(s, turn, observation_words)})
            await asyncio.sleep(tool_s)
        for s in range(sessions):
            async with http.post(f"{router}/finish_session", params={"session_id": f"s{s}"}) as resp:
                assert resp.status == 200
    return used


async def read_until(
    reader: PrometheusSignals, replicas: list[str], done: Any, *, timeout: float = 60.0
) -> dict[str, ReplicaSignals | None]:
    """Read every second until ``done(signals)`` holds; the last read on timeout fails the test."""
    deadline = time.monotonic() + timeout
    while True:
        signals = await asyncio.to_thread(reader.read, namespace=NAMESPACE, replicas=replicas, window_seconds=WINDOW)
        if done(signals):
            return signals
        assert time.monotonic() < deadline, f"signals never met the condition: {signals}"
        await asyncio.sleep(1.0)


def _all_present(signals: dict[str, ReplicaSignals | None]) -> bool:
    return all(s is not None and s.kv_usage is not None and s.live_sessions is not None for s in signals.values())


async def test_eviction_pressure_is_read_on_the_hot_replica_and_the_law_acts_on_it(fleet: Fleet) -> None:
    config = static_scrape_config(fleet.targets, scrape_interval_seconds=1.0)
    with PrometheusServer(config) as prom, PrometheusSignals(prom.url) as reader:
        replicas = list(ENGINES)
        before = await read_until(reader, replicas, _all_present)
        for s in before.values():
            assert s is not None
            assert s.kv_capacity_tokens == 4096
            assert s.live_sessions == 0
            assert s.sampled_at is not None
            assert abs(time.time() - s.sampled_at) < 10

        # all the pressure on one engine: the other is drained (placement would spread a group of 6 over both)
        hot, idle = ENGINES
        await drain(fleet.router, idle)
        used = await drive_group(fleet.router, sessions=6, turns=6, observation_words=220, tool_s=0.7)
        assert used == {hot}, "the drained engine took no session"

        def pressure_seen(signals: dict[str, ReplicaSignals | None]) -> bool:
            # held turns is a gauge: a scrape taken while the group ran may still show a turn held; wait for one
            # taken after the group's turns were all served (a turn held for good times the read out)
            s = signals[hot]
            return (
                s is not None
                and (s.reprefill_tokens_per_s or 0.0) > 0
                and s.prefix_hit_ratio is not None
                and s.held_turns == 0.0
            )

        signals = await read_until(reader, replicas, pressure_seen)
        started = time.monotonic()
        await asyncio.to_thread(reader.read, namespace=NAMESPACE, replicas=replicas, window_seconds=WINDOW)
        latency = time.monotonic() - started
        print(f"read() of {len(replicas)} replicas took {latency * 1000:.1f} ms; signals: {signals}")

        hot_s, idle_s = signals[hot], signals[idle]
        assert hot_s is not None
        assert idle_s is not None
        assert hot_s.reprefill_tokens_per_s is not None
        assert hot_s.reprefill_tokens_per_s > 1.0
        assert hot_s.prefix_hit_ratio is not None
        assert hot_s.prefix_hit_ratio < 0.5, "evicted prefixes: most prompt tokens are prefilled again"
        assert not idle_s.reprefill_tokens_per_s  # no counter, or a zero rate
        assert not idle_s.preemptions_per_s
        assert idle_s.prefix_hit_ratio is None  # 0/0: the idle engine saw no query
        assert idle_s.kv_usage == 0.0
        assert hot_s.kv_usage is not None
        assert 0.0 <= hot_s.kv_usage <= 1.0
        # the router's turn scheduler through Prometheus: its held turns per replica (the law raises a target while
        # turns wait); the group's turns were served, and the drained engine never held one
        assert (hot_s.held_turns, idle_s.held_turns) == (0.0, 0.0)
        assert hot_s.live_sessions is not None  # the group's sessions, or none once a scrape saw them finish
        assert idle_s.live_sessions == 0
        health = classify_health(enabled=True, reachable=True, signals=signals, now=time.time(), stale_after_seconds=30)
        assert (health.available, health.reason) == (True, "MetricsAvailable")

        # a low re-prefill threshold: this load is small next to an 8B model's prefill rate
        params = LawParams(reprefill_tokens_per_s=1.0)
        previous = ReplicaControl(target=0.9, changed_at=None)
        now = time.time()
        hot_control = decide_replica(previous=previous, signals=hot_s, params=params, now=now)
        idle_control = decide_replica(previous=previous, signals=idle_s, params=params, now=now)
        assert hot_control.quarantined  # kept prefixes re-prefilled far over the threshold: severe
        assert hot_control.target is not None
        assert params.minimum <= hot_control.target < 0.9  # cut by decreaseFactor
        assert (hot_control.reason, hot_control.changed_at) == ("Evicting", now)
        assert not idle_control.quarantined
        assert idle_control.target == 0.9  # no pressure and nothing waiting: held
        # blind: no target at all (the routers' own applies), never a quarantine
        blind = decide_replica(previous=hot_control, signals=None, params=params, now=now + 60)
        assert (blind.target, blind.quarantined, blind.reason) == (None, False, "NoMetrics")


async def test_kv_usage_falls_back_to_the_older_metric_name_and_duplicates_count_once(fleet: Fleet) -> None:
    config = static_scrape_config(fleet.targets, scrape_interval_seconds=1.0)
    # a second job scrapes the legacy engine again (as a PodMonitor beside the annotations would)
    legacy_targets = [t for t in fleet.targets if t.labels["pod"] == LEGACY]
    config["scrape_configs"] += static_scrape_config(legacy_targets, job="duplicate")["scrape_configs"]
    count = urllib.parse.quote(f'count(vllm:num_requests_waiting{{pod="{LEGACY}"}})')

    def scraped_by_both_jobs(_signals: object) -> bool:
        result = prom.api(f"query?query={count}")["result"]
        return bool(result) and result[0]["value"][1] == "2"

    with PrometheusServer(config) as prom, PrometheusSignals(prom.url) as reader:
        await read_until(reader, [LEGACY], scraped_by_both_jobs)
        signals = await asyncio.to_thread(
            reader.read, namespace=NAMESPACE, replicas=[LEGACY, "rl-pool-engine-9"], window_seconds=WINDOW
        )
    legacy = signals[LEGACY]
    assert legacy is not None
    assert legacy.kv_usage == 0.375
    assert (legacy.live_sessions, legacy.held_turns) == (None, None), "no router reports it: unknown, not zero"
    assert legacy.waiting == 2.0, "two jobs scrape it: still counted once"
    assert legacy.kv_capacity_tokens == 1600
    assert signals["rl-pool-engine-9"] is None


async def test_prometheus_down_is_unreachable_and_a_restart_recovers(fleet: Fleet) -> None:
    config = static_scrape_config(fleet.targets, scrape_interval_seconds=1.0)
    replicas = list(ENGINES)
    with PrometheusServer(config) as prom, PrometheusSignals(prom.url, timeout_seconds=2.0) as reader:
        await read_until(reader, replicas, _all_present)
        pid = prom.pid
        assert pid is not None
        prom.stop(keep_data=True)
        assert not prom.running
        with pytest.raises(PrometheusUnreachable) as err:
            await asyncio.to_thread(reader.read, namespace=NAMESPACE, replicas=replicas, window_seconds=WINDOW)
        assert prom.url in str(err.value)
        health = classify_health(
            enabled=True, reachable=False, signals={}, now=time.time(), stale_after_seconds=30, error=str(err.value)
        )
        assert (health.available, health.reason) == (False, "PrometheusUnreachable")
        assert str(err.value) in health.message

        prom.restart()
        assert prom.pid != pid
        signals = await read_until(reader, replicas, _all_present)
        health = classify_health(enabled=True, reachable=True, signals=signals, now=time.time(), stale_after_seconds=30)
        assert (health.available, health.reason) == (True, "MetricsAvailable")
    assert not prom.running
