"""The per-pool workers: passes serialised and debounced, periodic, stopped on forget and close."""

from __future__ import annotations

import asyncio

import pytest

from rolloutpool.dev.wait import wait_until_async
from rolloutpool.handlers.workers import PoolKey, PoolWorkers

KEY: PoolKey = ("ns", "pool")


class Passes:
    """A pass function that records calls and can be held mid-pass."""

    def __init__(self, delay: float | None = 60.0) -> None:
        self.calls: list[PoolKey] = []
        self.delay = delay
        self.running = 0
        self.most_running = 0
        self.release = asyncio.Event()
        self.release.set()
        self.fail_next = False

    async def __call__(self, key: PoolKey) -> float | None:
        self.calls.append(key)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await self.release.wait()
            if self.fail_next:
                self.fail_next = False
                raise RuntimeError("boom")
            return self.delay
        finally:
            self.running -= 1


async def test_a_burst_of_pokes_during_a_pass_gives_one_more_pass() -> None:
    passes = Passes()
    workers = PoolWorkers(passes)
    try:
        passes.release.clear()
        workers.poke(KEY)
        await wait_until_async(lambda: passes.running == 1, timeout=5.0, interval=0.005)
        for _ in range(10):
            workers.poke(KEY)
        passes.release.set()
        await wait_until_async(lambda: len(passes.calls) == 2, timeout=5.0, interval=0.005)
        await asyncio.sleep(0.05)
        assert len(passes.calls) == 2
        assert passes.most_running == 1
    finally:
        await workers.close()


async def test_passes_repeat_after_the_delay_the_pass_asks_for() -> None:
    passes = Passes(delay=0.01)
    workers = PoolWorkers(passes)
    try:
        workers.poke(KEY)
        await wait_until_async(lambda: len(passes.calls) >= 5, timeout=5.0, interval=0.005)
    finally:
        await workers.close()


async def test_a_failing_pass_is_retried_after_the_backoff() -> None:
    passes = Passes()
    passes.fail_next = True
    workers = PoolWorkers(passes, error_backoff=0.01)
    try:
        workers.poke(KEY)
        await wait_until_async(lambda: len(passes.calls) == 2, timeout=5.0, interval=0.005)
        assert KEY in workers
    finally:
        await workers.close()


async def test_a_gone_pool_ends_its_worker_and_a_poke_starts_a_new_one() -> None:
    passes = Passes(delay=None)
    workers = PoolWorkers(passes)
    try:
        workers.poke(KEY)
        await wait_until_async(lambda: KEY not in workers, timeout=5.0, interval=0.005)
        workers.poke(KEY)
        await wait_until_async(lambda: len(passes.calls) == 2, timeout=5.0, interval=0.005)
    finally:
        await workers.close()


async def test_forget_cancels_a_running_pass_and_close_ends_everything() -> None:
    passes = Passes()
    workers = PoolWorkers(passes)
    passes.release.clear()
    workers.poke(KEY)
    workers.poke(("ns", "other"))
    await wait_until_async(lambda: passes.running == 2, timeout=5.0, interval=0.005)
    workers.forget(KEY)
    await wait_until_async(lambda: passes.running == 1, timeout=5.0, interval=0.005)
    assert KEY not in workers
    await workers.close()
    assert passes.running == 0
    workers.poke(KEY)  # ignored once closed
    assert KEY not in workers
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("rolloutpool-")]


@pytest.mark.parametrize("count", [1, 3])
async def test_pools_run_side_by_side(count: int) -> None:
    passes = Passes()
    workers = PoolWorkers(passes)
    passes.release.clear()
    try:
        for index in range(count):
            workers.poke(("ns", f"pool-{index}"))
        await wait_until_async(lambda: passes.running == count, timeout=5.0, interval=0.005)
    finally:
        passes.release.set()
        await workers.close()
