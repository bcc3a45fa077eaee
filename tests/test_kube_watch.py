"""The list-then-watch thread over the in-memory fake: a dropped stream, an expired version, a failed list."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from rolloutpool.kube.fake import FakeKube
from rolloutpool.kube.pods import PodWatch
from rolloutpool.kube.pools import PoolWatch
from rolloutpool.routing.discovery import ReplicaEvent

NS = "team"
LABELS = {"rolloutpool.io/pool": "p", "rolloutpool.io/component": "engine"}
SELECTOR = "rolloutpool.io/pool=p,rolloutpool.io/component=engine"


def _pod(name: str, *, ready: bool = True, labels: dict[str, str] | None = None) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels if labels is not None else LABELS},
        "status": {"podIP": "127.0.0.7", "conditions": conditions},
    }


class Collected:
    """Replica events of one watch, read in the background."""

    def __init__(self, watch: PodWatch) -> None:
        self.watch = watch
        self.events: list[ReplicaEvent] = []
        self._task = asyncio.ensure_future(self._read(watch.events()))

    async def _read(self, events: AsyncIterator[ReplicaEvent]) -> None:
        async for event in events:
            self.events.append(event)

    async def until(self, count: int, timeout: float = 10.0) -> list[tuple[str, str]]:
        for _ in range(int(timeout / 0.01)):
            if len(self.events) >= count:
                break
            await asyncio.sleep(0.01)
        return [(e.name, e.reason) for e in self.events]

    async def close(self) -> None:
        self.watch.stop()
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        assert self.watch.join(10.0)


@pytest.fixture
def fake() -> FakeKube:
    kube = FakeKube()
    kube.put(_pod("p-engine-0"))
    kube.put(_pod("other", labels={"rolloutpool.io/pool": "q"}))
    return kube


def _watch(fake: FakeKube) -> PodWatch:
    watch = PodWatch(fake, namespace=NS, selector=SELECTOR, timeout_seconds=5)
    watch.retry_seconds = 0.05
    return watch


async def test_lists_then_follows_changes_of_matching_pods_only(fake: FakeKube) -> None:
    got = Collected(_watch(fake))
    assert await got.until(2) == [("p-engine-0", "Ready"), ("", "Synced")]
    fake.put(_pod("p-engine-1", ready=False))
    fake.put(_pod("other-2", labels={}))
    fake.delete("Pod", NS, "p-engine-0")
    assert (await got.until(4))[2:] == [("p-engine-1", "NotReady"), ("p-engine-0", "Deleted")]
    await got.close()


async def test_a_dropped_stream_resumes_from_the_last_version_without_loss_or_repeat(fake: FakeKube) -> None:
    got = Collected(_watch(fake))
    await got.until(2)
    fake.put(_pod("p-engine-1"))
    await got.until(3)
    fake.drop_watches()
    fake.put(_pod("p-engine-2"))  # while the watch is down
    names = await got.until(4)
    await asyncio.sleep(0.2)
    assert names[2:] == [("p-engine-1", "Ready"), ("p-engine-2", "Ready")]
    assert len(got.events) == 4  # nothing delivered twice
    assert fake.verbs("list") == [""]  # resumed by version, not by listing again
    assert len(fake.verbs("watch")) >= 2
    await got.close()


async def test_an_expired_version_lists_again_and_reports_pods_that_went_meanwhile(fake: FakeKube) -> None:
    got = Collected(_watch(fake))
    await got.until(2)
    fake.drop_watches()
    fake.delete("Pod", NS, "p-engine-0")
    fake.put(_pod("p-engine-3"))
    fake.expire()  # the history the watch would resume from is compacted: 410, list again
    names = await got.until(5)
    relisted = names[2:]
    assert ("p-engine-3", "Ready") in relisted
    assert ("p-engine-0", "Deleted") in relisted
    assert relisted[-1] == ("", "Synced")
    assert len(fake.verbs("list")) == 2
    await got.close()


async def test_a_failed_list_is_retried(fake: FakeKube) -> None:
    fake.fail("list", "Pod", error=500, times=2)
    fake.fail("list", "Pod", error=TimeoutError("injected"))
    got = Collected(_watch(fake))
    assert await got.until(2) == [("p-engine-0", "Ready"), ("", "Synced")]
    assert len(fake.verbs("list")) == 4
    await got.close()


async def test_the_pool_watch_follows_the_operator_limits_of_one_pool() -> None:
    fake = FakeKube()
    status = {"replicaStatus": [{"name": "p-engine-0", "index": 0, "target": 0.7, "quarantined": True, "reason": "x"}]}
    fake.put({"kind": "RolloutPool", "metadata": {"name": "p", "namespace": NS}, "status": status})
    fake.put({"kind": "RolloutPool", "metadata": {"name": "q", "namespace": NS}})
    watch = PoolWatch(fake, namespace=NS, name="p", timeout_seconds=5)
    items = watch.events()
    first = await asyncio.wait_for(anext(items), 10)
    assert first["p-engine-0"].target == 0.7
    fake.delete("RolloutPool", NS, "p")
    assert await asyncio.wait_for(anext(items), 10) == {}
    await items.aclose()
    assert watch.join(10.0)
