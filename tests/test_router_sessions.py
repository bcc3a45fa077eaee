"""The router's shell around the ledger: deferred release, one-turn sessions, snapshots, metrics (no HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from rolloutpool.router.config import ReplicaSpec, RouterConfig
from rolloutpool.router.instruments import RouterMetrics
from rolloutpool.router.sessions import ReleasedWhileQueuedError, SessionManager, Usage
from rolloutpool.router.state import load_snapshot, snapshot
from rolloutpool.routing.workingset import Phase, WorkingSetConfig


def _manager(cap: int = 1) -> SessionManager:
    config = RouterConfig(replicas=(ReplicaSpec("e0", "http://127.0.0.1:1"),), cap=cap, queue_timeout_s=5.0)
    return SessionManager(config, clock=lambda: 0.0, metrics=RouterMetrics())


def _metric(manager: SessionManager, line: str) -> bool:
    return line in generate_latest(manager.metrics.registry).decode()


async def test_finish_session_during_a_turn_answers_at_once_and_frees_the_slot_when_the_turn_ends() -> None:
    manager = _manager()
    session, created = await manager.acquire("s", group=None)
    assert created
    manager.begin(session)
    waiting = asyncio.create_task(manager.acquire("next", group=None))
    await asyncio.sleep(0)
    assert manager.queue_depth == 1
    assert manager.release("s", how="finish_session") is session  # never blocks on the turn
    assert manager.release("s", how="finish_session") is None  # idempotent
    assert manager.lookup("s") is None
    assert not waiting.done()  # the slot is still the running turn's
    manager.end(session)
    admitted, created = await waiting
    assert admitted.session_id == "next"
    assert created
    assert _metric(manager, 'rolloutpool_router_releases_total{how="finish_session"} 1.0')
    manager.close()


async def test_one_turn_sessions_and_pending_releases_stay_out_of_the_snapshot() -> None:
    manager = _manager(cap=3)
    oneshot, _ = await manager.acquire("oneshot-1", group=None, ephemeral=True)
    kept, _ = await manager.acquire("kept", group=None)
    leaving, _ = await manager.acquire("leaving", group=None)
    manager.begin(oneshot)
    manager.begin(leaving)
    manager.release("leaving", how="finish_session")
    assert [row[0] for row in snapshot(manager, now=0.0)["sessions"]] == ["kept"]
    manager.end(oneshot)  # a one-turn session holds no slot after its turn
    manager.end(leaving)
    assert set(manager.table.sessions) == {"kept"}
    assert manager.replica("e0").live == 1
    assert manager.lookup("kept") is kept
    manager.close()


async def test_a_session_released_while_queued_is_answered_and_never_placed() -> None:
    manager = _manager()
    await manager.acquire("s", group=None)
    waiting = asyncio.create_task(manager.acquire("q", group=None))
    await asyncio.sleep(0)
    assert manager.release("q", how="finish_session") is None  # it held nothing
    with pytest.raises(ReleasedWhileQueuedError):
        await waiting
    manager.release("s", how="finish_session")
    assert manager.lookup("q") is None
    assert _metric(manager, 'rolloutpool_router_admission_rejections_total{reason="released_while_queued"} 1.0')
    manager.close()


_TURNS = WorkingSetConfig(target=0.5, keep_s=10.0, keep_quantile=None, prefill_tokens_per_s=None, growth=100)


def _turn_manager(now: list[float]) -> SessionManager:
    """One replica of 10,000 KV tokens (a 5,000-token working set) with turn scheduling, on a clock set by hand."""
    config = RouterConfig(replicas=(ReplicaSpec("e0", "http://127.0.0.1:1"),), queue_timeout_s=5.0, turns=_TURNS)
    manager = SessionManager(config, clock=lambda: now[0], metrics=RouterMetrics())
    manager.set_capacity("e0", 10_000, 16)
    return manager


async def _turn(manager: SessionManager, sid: str, *, context: int, group: str | None = None) -> None:
    manager.tick()  # the scrape round before it: caps follow the clock
    session, _ = await manager.acquire(sid, group=group)
    manager.begin(session)
    manager.finish_turn(session, usage=Usage(context - 10, 10, 0))
    manager.end(session)


async def test_a_held_turn_resumed_as_its_client_leaves_ends_that_turn() -> None:
    now = [0.0]
    manager = _turn_manager(now)
    await _turn(manager, "a", context=3000)
    now[0] = 21.0
    await _turn(manager, "c", context=4900)  # a let go to place c
    now[0] = 22.0
    waiting = asyncio.create_task(manager.acquire("a", group=None))
    await asyncio.sleep(0)
    work = manager.ledger.work
    assert work is not None
    assert work.phase("a") is Phase.HELD
    manager.release("c", how="finish_session")  # room frees: a's turn resumes ...
    waiting.cancel()  # ... as its client goes away, before the request could start
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert work.phase("a") is not Phase.GENERATING  # no turn runs: none is counted
    assert work.replicas["e0"].counted == 0
    assert work.replicas["e0"].generating == 0
    now[0] = 40.0
    _, created = await manager.acquire("a", group=None)  # its retry is served
    assert not created
    assert work.phase("a") is Phase.GENERATING
    manager.close()


async def test_a_restart_keeps_a_groups_shared_prompt(tmp_path: Path) -> None:
    now = [0.0]
    manager = _turn_manager(now)
    for sid in ("a", "b"):
        await _turn(manager, sid, context=1200, group="g")  # a first turn's prompt (1,190) is what the group shares
    assert manager.ledger.work is not None
    counted = manager.ledger.work.replicas["e0"].counted
    assert counted == 1190 + 2 * 10
    path = tmp_path / "state.json"
    path.write_text(json.dumps(snapshot(manager, now=1.0)))
    manager.close()
    restarted = _turn_manager(now)
    assert load_snapshot(restarted, path) == 2
    assert restarted.ledger.work is not None
    assert restarted.ledger.work.replicas["e0"].counted == counted
    restarted.close()
