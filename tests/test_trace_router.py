"""A real router process records a trace: engine-sim + ``rolloutpool router --trace-file`` on free ports."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rolloutpool.dev.bench.client import ClientConfig, run_client
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import free_port
from rolloutpool.dev.processes import pid_alive
from rolloutpool.routing.trace import read_trace
from rolloutpool.sim.trace_feed import episodes
from rolloutpool.sim.workload import Lognormal, scenario

TIME_SCALE = 100.0


def test_the_router_records_every_turn_the_client_saw(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with ProcessSet(tmp_path) as procs:
        engine_port, router_port = free_port(), free_port()
        engine = f"http://127.0.0.1:{engine_port}"
        procs.start(
            "engine",
            rolloutpool_argv("engine-sim", "--port", str(engine_port), "--time-scale", str(TIME_SCALE),
                             "--max-model-len", "4096", "--kv-capacity-tokens", "65536"),
            ready_url=f"{engine}/health",
        )  # fmt: skip
        url = f"http://127.0.0.1:{router_port}"
        argv = rolloutpool_argv(
            "router", "--replica", f"e0={engine}", "--port", str(router_port),
            "--trace-file", str(path), "--trace-session-ids", "raw",
        )  # fmt: skip
        router = procs.start("router", argv, ready_url=f"{url}/readyz")
        chat = scenario("tool-chat").with_(max_model_len=4096, turns=Lognormal(4, 6), group_size=2)
        config = ClientConfig(
            base_url=url, scenario=chat, seed=0, in_flight=4, duration_s=4.0, time_scale=TIME_SCALE,
            session_prefix="t", group_header="X-Session-Group",
        )  # fmt: skip
        result = asyncio.run(run_client(config))
        router.stop()  # SIGTERM: the router writes what it buffered and closes the trace
        pids = procs.pids
    assert not any(pid_alive(pid) for pid in pids)
    assert result.errors == 0
    assert len(result.turns) >= 8
    trace = read_trace(path.read_text().splitlines())
    assert trace.header.clock == "unix"
    assert trace.header.max_model_len is None  # the router is not told maxModelLen: the replay takes its own
    assert [(r.name, r.capacity_tokens, r.block_size) for r in trace.replicas] == [("e0", 65536, 16)]
    seen = {(f"t-{t.trajectory}", t.turn): t for t in result.turns}
    recorded = {(t.session, t.turn): t for t in trace.turns}
    assert set(seen) <= set(recorded)  # every turn, once, numbered as the client numbered them
    assert len(set(recorded) - set(seen)) <= config.in_flight  # answered as the client gave up at its deadline
    for key, turn in seen.items():
        line = recorded[key]
        assert (line.prompt_tokens, line.cached_tokens, line.output_tokens) == (
            turn.prompt_tokens,
            turn.cached_tokens,
            turn.completion_tokens,
        ), key
        assert line.replica == "e0"
        assert line.group == f"t-g{int(key[0].split('-')[1]) // 2}"
        assert (line.tool_gap_s is None) == (line.turn == 0)
    gaps = [t.tool_gap_s for t in trace.turns if t.tool_gap_s is not None]
    assert gaps
    assert min(gaps) > 0
    released = {r.session for r in trace.releases}
    assert {t.session for t in trace.turns} <= released  # the client finished (or abandoned) each one
    assert len(episodes(trace)) == len({t.session for t in trace.turns})
    text = path.read_text()
    assert '"messages"' not in text
    assert "content" not in text
