"""Replicas that come back together share the sessions that waited for them (real processes).

Two engine-sim processes and a router process on loopback. Both engines hang (SIGSTOP): the
router's scrapes fail, it marks both not ready, and new sessions wait in its admission queue. Both
engines resume at once (SIGCONT): their scrapes answer in the same round, within a millisecond or
two of each other. Before the fix the first scrape to answer marked its replica ready and the whole
queue was placed there (16/0); now the round's replicas are ready together before the queue is
admitted, and the policy spreads it.
"""

from __future__ import annotations

import asyncio
import re
import signal
from collections import Counter
from pathlib import Path

import aiohttp

from rolloutpool.dev.bench.fleet import start_engines
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.dev.processes import signal_group
from rolloutpool.router.hop import REPLICA_HEADER

SESSIONS = 16


async def _metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as resp:
        found = re.search(rf"^{name} ([0-9.e+]+)$", await resp.text(), re.MULTILINE)
    return float(found[1]) if found else 0.0


async def _until(check: object, *, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.1)


async def test_sessions_queued_while_every_replica_was_down_are_spread_when_they_return(tmp_path: Path) -> None:
    with ProcessSet(tmp_path) as procs:
        engines = start_engines(procs, 2)
        port = free_port()
        url = f"http://{LOOPBACK}:{port}"
        argv = rolloutpool_argv(
            "router", f"--host={LOOPBACK}", f"--port={port}", "--scrape-interval=0.2", "--queue-timeout=60",
            "--no-turn-scheduling", *(f"--replica={n}={u}" for n, u in engines.items()),
        )  # fmt: skip
        procs.start("router", argv, ready_url=f"{url}/readyz")
        hung = [p for p in procs.processes if p.name.startswith("engine-")]
        try:
            for process in hung:
                signal_group(process.pid, signal.SIGSTOP)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as http:

                async def unready() -> bool:
                    async with http.get(f"{url}/readyz") as resp:
                        return resp.status == 503

                await _until(unready, timeout_s=30)

                async def turn(i: int) -> str | None:
                    body = {"model": "sim", "messages": [{"role": "user", "content": f"task {i}"}], "max_tokens": 4}
                    headers = {"X-Session-ID": f"recovery-{i}"}
                    async with http.post(f"{url}/v1/chat/completions", json=body, headers=headers) as resp:
                        assert resp.status == 200, await resp.text()
                        return resp.headers.get(REPLICA_HEADER)

                turns = [asyncio.create_task(turn(i)) for i in range(SESSIONS)]

                async def queued() -> bool:
                    return await _metric(http, url, "rolloutpool_router_queue_depth") == SESSIONS

                await _until(queued, timeout_s=20)
                for process in hung:  # both engines come back at the same moment
                    signal_group(process.pid, signal.SIGCONT)
                served = Counter(await asyncio.gather(*turns))
        finally:
            for process in hung:
                signal_group(process.pid, signal.SIGCONT)
    assert set(served) == set(engines), served
    assert max(served.values()) - min(served.values()) <= 2, served  # before: 16/0
