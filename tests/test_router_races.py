"""Regression tests from an independent review: stale admissions, failing replicas, empty tokens."""

from __future__ import annotations

import asyncio

import pytest

from rolloutpool.router.config import ReplicaSpec, RouterConfig
from rolloutpool.router.instruments import RouterMetrics
from rolloutpool.router.sessions import SessionManager


def _manager(names: tuple[str, ...], cap: int) -> SessionManager:
    config = RouterConfig(replicas=tuple(ReplicaSpec(n, f"http://127.0.0.1:1/{n}") for n in names), cap=cap)
    return SessionManager(config, clock=lambda: 0.0, metrics=RouterMetrics())


def test_empty_admin_token_is_rejected() -> None:
    with pytest.raises(ValueError, match="admin_token"):
        RouterConfig(replicas=(ReplicaSpec("a", "http://127.0.0.1:1"),), admin_token="  ")  # noqa: S106 - not a secret


async def test_a_failing_replica_does_not_take_the_queued_session() -> None:
    manager = _manager(("a", "b"), cap=1)
    s1, _ = await manager.acquire("s1", group=None)
    await manager.acquire("s2", group=None)
    queued = asyncio.create_task(manager.acquire("s3", group=None))
    await asyncio.sleep(0)
    assert manager.queue_depth == 1
    manager.upstream_failed(s1, replica_down=True)  # s1's replica is unreachable
    await asyncio.sleep(0)
    assert not queued.done()  # the slot freed on the dead replica is not handed out
    assert manager.lookup("s3") is None
    manager.release("s2", how="finish")
    session, _ = await asyncio.wait_for(queued, 5)
    assert session.replica != s1.replica
    manager.close()


async def test_admission_onto_a_replica_that_leaves_is_placed_again() -> None:
    manager = _manager(("a", "b"), cap=1)
    s1, _ = await manager.acquire("s1", group=None)
    s2, _ = await manager.acquire("s2", group=None)
    queued = asyncio.create_task(manager.acquire("s3", group=None))
    await asyncio.sleep(0)
    manager.release("s1", how="finish")  # admits s3 onto s1's replica ...
    manager.remove_replica(s1.replica, reason="Deleted")  # ... which leaves before s3's task resumes
    await asyncio.sleep(0)
    assert not queued.done()  # it waits again instead of returning a binding to a gone replica
    manager.release("s2", how="finish")
    session, _ = await asyncio.wait_for(queued, 5)
    assert manager.is_current(session)
    assert session.replica == s2.replica
    manager.begin(session)
    manager.end(session)
    assert manager._inflight == {}
    manager.close()
