"""The turn trace: format, validation errors by line, the recorder, the bounded writer, the replay."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from poolcases import load_example
from rolloutpool.api import RolloutPoolSpec
from rolloutpool.cli import main
from rolloutpool.reconcile.children import TRACE_PATH, router_objects
from rolloutpool.router.trace_writer import TraceWriter
from rolloutpool.routing.events import Usage
from rolloutpool.routing.trace import TraceError, TraceRecorder, TurnLine, encode_line, keyed_hash, read_trace
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.trace_feed import TraceSource, episodes, peak_concurrency
from rolloutpool.sim.trace_replay import compare, replay, replay_config, synthesize
from rolloutpool.sim.workload import scenario


def _lines(recorder: TraceRecorder, events: list[dict[str, Any]]) -> list[str]:
    out = [recorder.header(writer="test", clock="unix", session_ids="raw", max_model_len=4096)]
    for e in events:
        out.append(e)
    return [encode_line(line).decode() for line in out]


def _session(
    recorder: TraceRecorder, sid: str, turns: list[tuple[float, float, int, int, int]]
) -> list[dict[str, Any]]:
    """Turns as (arrived, ended, prompt, cached, output); then the release."""
    lines = []
    for arrived, ended, prompt, cached, output in turns:
        recorder.arrived(sid, now=arrived, group="g")
        line = recorder.turn(sid, replica="e0", usage=Usage(prompt, output, cached), now=ended)
        assert line is not None
        lines.append(line)
    release = recorder.released(sid, how="finish", now=turns[-1][1])
    assert release is not None
    return [*lines, release]


def test_recorder_numbers_turns_measures_tool_gaps_and_forgets_a_released_session() -> None:
    recorder = TraceRecorder(started_at=100.0)
    lines = _session(recorder, "a", [(100.0, 101.0, 1000, 0, 50), (103.5, 104.0, 1100, 1040, 60)])
    assert [line["turn"] for line in lines[:2]] == [0, 1]
    assert lines[0]["tool_gap_s"] is None
    assert lines[1]["tool_gap_s"] == pytest.approx(2.5)
    assert lines[1]["arrived"] == pytest.approx(3.5)  # seconds after the trace started
    assert lines[2] == {"kind": "release", "session": "a", "how": "finish", "at": 4.0, "turns": 2}
    assert recorder.live == 0
    again = _session(recorder, "a", [(110.0, 111.0, 900, 0, 10)])
    assert again[0]["turn"] == 0  # the id used again is a new session
    recorder.arrived("b", now=120.0, group=None)
    assert recorder.turn("b", replica="e0", usage=None, now=121.0) is None  # no usage: no line, arrival dropped
    line = recorder.turn("b", replica="e0", usage=Usage(10, 1, None), now=130.0)
    assert line is not None
    assert line["arrived"] == line["ended"] == 30.0
    assert line["cached_tokens"] is None


def test_hashed_ids_are_stable_per_key_and_never_the_id() -> None:
    name = keyed_hash(b"k" * 16)
    assert name("session-1") == name("session-1") != name("session-2")
    assert "session" not in name("session-1")
    assert keyed_hash(b"x" * 16)("session-1") != name("session-1")
    recorder = TraceRecorder(started_at=0.0, name=name)
    recorder.arrived("secret-id", now=0.0, group="secret-group")
    line = recorder.turn("secret-id", replica="e0", usage=Usage(1, 1, 0), now=1.0)
    assert "secret" not in json.dumps(line)


def test_encoded_lines_read_back_into_models() -> None:
    recorder = TraceRecorder(started_at=0.0)
    text = _lines(recorder, _session(recorder, "a", [(0.0, 1.0, 1000, 0, 50), (2.0, 3.0, 1100, 1040, 60)]))
    trace = read_trace(text)
    assert trace.header.max_model_len == 4096
    assert [t.cached_tokens for t in trace.turns] == [0, 1040]
    assert trace.releases[0].turns == 2
    assert trace.stopped is None


@pytest.mark.parametrize(
    ("line", "number", "message"),
    [
        ("not json", 3, "line 3: not JSON"),
        ('{"kind": "turn", "session": "a"}', 3, "line 3: turn: Field required"),
        ('{"kind": "bogus"}', 3, "line 3: unknown kind 'bogus'"),
        ("[1, 2]", 3, "line 3: a trace line is a JSON object"),
    ],
)
def test_a_bad_line_is_named_by_its_number(line: str, number: int, message: str) -> None:
    recorder = TraceRecorder(started_at=0.0)
    text = _lines(recorder, _session(recorder, "a", [(0.0, 1.0, 10, 0, 5)]))
    text.insert(number - 1, line)
    with pytest.raises(TraceError, match=message.replace("(", r"\(")):
        read_trace(text)


def test_header_errors_and_lines_after_stop() -> None:
    with pytest.raises(TraceError, match="line 1: the first line must be the header"):
        read_trace(['{"kind": "turn"}'])
    with pytest.raises(TraceError, match="line 1: empty trace"):
        read_trace(["", " "])
    newer = {"kind": "header", "format": "rolloutpool-trace", "version": 99}
    with pytest.raises(TraceError, match="line 1: trace version 99 is newer"):
        read_trace([json.dumps(newer)])
    recorder = TraceRecorder(started_at=0.0)
    text = _lines(recorder, [recorder.stopped(reason="max_bytes", now=1.0)])
    assert read_trace(text).stopped is not None
    turn = _session(TraceRecorder(started_at=0.0), "a", [(0.0, 1.0, 10, 0, 5)])[0]
    with pytest.raises(TraceError, match="line 3: a line after the 'stop' line"):
        read_trace([*text, encode_line(turn).decode()])
    bad = {**turn, "prompt_tokens": -1}
    with pytest.raises(TraceError, match="line 2: prompt_tokens: Input should be greater than or equal to 0"):
        read_trace([text[0], json.dumps(bad)])
    backwards = {**turn, "arrived": 5.0, "ended": 1.0}
    with pytest.raises(TraceError, match=r"line 2: ended 1\.0 is before arrived 5\.0"):
        read_trace([text[0], json.dumps(backwards)])


async def test_the_writer_stops_at_its_bound_with_a_stop_line_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, max_bytes=4096, now=1000.0, flush_interval_s=0.01)
    caplog.set_level(logging.INFO, logger="rolloutpool.router.trace_writer")
    for i in range(200):
        writer.arrived(f"s{i}", now=1000.0 + i, group=None)
        writer.turn(f"s{i}", replica="e0", usage=Usage(1000, 10, 992), now=1000.5 + i)
    assert path.read_bytes() == b""  # nothing touched the disk on the caller's path
    assert writer.stopped
    await writer.close()
    data = path.read_bytes()
    assert len(data) <= 4096
    trace = read_trace(data.decode().splitlines())
    assert trace.stopped is not None
    assert trace.stopped.reason == "max_bytes"
    assert 10 < len(trace.turns) < 200
    assert all(len(t.session) == 16 and not t.session.startswith("s") for t in trace.turns)  # hashed by default
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"Stopped trace path={path} max_bytes=4096")


async def test_the_writer_flushes_in_the_background(tmp_path: Path) -> None:
    import asyncio  # noqa: PLC0415

    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path, max_bytes=1 << 20, now=0.0, session_ids="raw", flush_interval_s=0.01)
    task = asyncio.create_task(writer.run())
    writer.replica("e0", capacity_tokens=65536, block_size=16, now=0.0)
    writer.replica("e0", capacity_tokens=65536, block_size=16, now=1.0)  # unchanged: no line
    writer.arrived("a", now=0.5, group="g1")
    writer.turn("a", replica="e0", usage=Usage(100, 5, 0), now=1.0)
    for _ in range(100):
        await asyncio.sleep(0.01)
        if len(path.read_bytes().splitlines()) == 3:
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    writer.released("a", how="final", now=2.0)
    await writer.close()
    trace = read_trace(path.read_text().splitlines())
    assert [(r.name, r.capacity_tokens) for r in trace.replicas] == [("e0", 65536)]
    assert [(t.session, t.group) for t in trace.turns] == [("a", "g1")]
    assert trace.releases[0].how == "final"


def _trace_lines(turns: list[dict[str, Any]]) -> list[str]:
    header = TraceRecorder(started_at=0.0).header(writer="t", clock="virtual", session_ids="raw")
    return [encode_line(line).decode() for line in [header, *turns]]


def _turn(session: str, turn: int, arrived: float, ended: float, prompt: int, output: int, gap: float | None) -> Any:
    return {
        "kind": "turn", "session": session, "turn": turn, "replica": "e0", "group": None, "arrived": arrived,
        "ended": ended, "prompt_tokens": prompt, "cached_tokens": 0, "output_tokens": output, "tool_gap_s": gap,
    }  # fmt: skip


def test_a_trace_becomes_trajectories_in_start_order() -> None:
    turns = [
        _turn("b", 0, 1.0, 2.0, 500, 20, None),
        _turn("a", 0, 0.0, 1.0, 1000, 50, None),
        _turn("a", 1, 3.0, 4.0, 1250, 40, 2.0),  # grew by its 50 output tokens and a 200-token observation
        _turn("a", 2, 4.5, 5.0, 1000, 10, 0.5),  # shrank: not an appended context
        _turn("b", 0, 9.0, 9.5, 300, 5, None),  # "b" again from turn 0: a new session
    ]
    source = TraceSource(episodes(read_trace(_trace_lines(turns))), time_scale=10.0)
    assert [(e.session, len(e.turns)) for e in source.episodes] == [("a", 3), ("b", 1), ("b", 1)]
    first = source.next()
    assert first is not None
    assert (first.prompt_tokens, first.actions, first.observations) == (1000, (50, 40, 10), (200, 1, 1))
    assert first.tool_latencies == (20.0, 5.0, 0.0)  # recorded gaps x time scale
    assert source.non_append == 1
    assert [t.index for t in (source.next(), source.next())] == [1, 2]  # type: ignore[union-attr]
    assert source.next() is None
    assert peak_concurrency(source.episodes) == 2


def test_a_synthetic_trace_replayed_under_the_same_policy_reproduces_the_run() -> None:
    config = FleetConfig(
        scenario=scenario("tool-chat"),
        in_flight=40,
        replicas=2,
        num_gpu_blocks=4096,
        duration_s=400.0,
    )
    original, lines = synthesize(config, "rolloutpool")
    text = [encode_line(line).decode() for line in lines]
    trace = read_trace(text)
    again = replay_config(trace, base=FleetConfig(scenario=config.scenario, in_flight=1))
    assert (again.replicas, again.num_gpu_blocks, again.in_flight) == (2, 4096, 40)
    result = compare(replay(trace, again, "rolloutpool"))
    total = result["total"]
    assert total["turns"] == len(trace.turns)
    assert result["turns_missing"] == 0
    assert abs(total["total_error"]) < 0.02
    assert total["median_abs_error_tokens"] == 0
    # the run's figures: every trajectory it finished has its release line; the replay generates the same tokens
    assert len(trace.releases) == original.completed
    replayed = simulate_policy(again, "rolloutpool", source=TraceSource(episodes(trace)))
    assert replayed.completed == len(episodes(trace))  # the sessions cut at the end of the run end early
    assert replayed.generated_tokens == pytest.approx(original.generated_tokens, rel=0.02)
    # re-prefill is a small residual of who got evicted when: KV admission admits by the sessions' measured
    # growth, so the replay's admission order (closed loop at the peak concurrency) moves it by tens of percent
    assert replayed.reprefilled_tokens == pytest.approx(original.reprefilled_tokens, rel=0.35, abs=2000)


def _router_args(manifest: dict[str, Any]) -> list[str]:
    spec = RolloutPoolSpec.model_validate(manifest["spec"])
    objects = router_objects(pool=manifest, spec=spec, default_image="img")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_router_args_turn_the_trace_on_for_a_pool() -> None:
    manifest = load_example("simulated-pool.yaml")
    manifest["metadata"]["uid"] = "u-1"
    assert not [a for a in _router_args(manifest) if a.startswith("--trace")]  # off by default
    manifest["spec"].setdefault("router", {})["trace"] = {"enabled": True, "maxBytes": 1 << 20}
    args = _router_args(manifest)
    assert f"--trace-file={TRACE_PATH}" in args
    assert f"--trace-max-bytes={1 << 20}" in args
    assert "--trace-session-ids=hashed" in args
    manifest["spec"]["router"]["trace"]["maxBytes"] = 100
    with pytest.raises(ValidationError, match="greater than or equal to 512"):
        RolloutPoolSpec.model_validate(manifest["spec"])


def test_simulate_rejects_a_bad_trace_with_its_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join([*_trace_lines([_turn("a", 0, 0.0, 1.0, 10, 5, None)]), '{"kind": "turn"}\n']))
    result = CliRunner().invoke(main, ["simulate", "--trace", str(bad), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "line 3: session: Field required" in result.output
    missing = CliRunner().invoke(main, ["simulate", "--trace", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2
    assert "No such file" in missing.output
    assert not (tmp_path / "out").exists()


def test_simulate_writes_a_trace_and_replays_it(tmp_path: Path) -> None:
    path = tmp_path / "syn.jsonl"
    args = ["simulate", "--scenario", "tool-chat", "--replicas", "2", "--duration", "120", "--load", "1"]
    written = CliRunner().invoke(main, [*args, "--policy", "rolloutpool", "--write-trace", str(path)])
    assert written.exit_code == 0, written.output
    trace = read_trace(path.read_text().splitlines())
    assert trace.header.clock == "virtual"
    assert all(isinstance(t, TurnLine) for t in trace.turns)
    out = tmp_path / "out"
    replayed = CliRunner().invoke(
        main,
        ["simulate", "--trace", str(path), "--policy", "rolloutpool", "--policy", "round-robin", "--out", str(out)],
    )
    assert replayed.exit_code == 0, replayed.output
    report = json.loads((out / "trace-replay.json").read_text())
    assert [r["policy"] for r in report["runs"]] == ["rolloutpool", "round-robin"]
    assert report["runs"][0]["replicas"] == 2
    assert abs(report["runs"][0]["total"]["total_error"]) < 0.02
    capped = CliRunner().invoke(
        main, ["simulate", "--trace", str(path), "--policy", "rolloutpool", "--trace-cap", "2", "--out", f"{out}"]
    )
    assert capped.exit_code == 0, capped.output
    assert json.loads((out / "trace-replay.json").read_text())["runs"][0]["fixed_cap"] == 2


def test_router_refuses_a_trace_file_in_a_missing_directory(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "trace.jsonl"
    result = CliRunner().invoke(main, ["router", "--replica", "e0=http://127.0.0.1:9", "--trace-file", str(target)])
    assert result.exit_code == 2, result.output
    assert f"directory {target.parent} does not exist" in result.output
    assert not target.parent.exists()
