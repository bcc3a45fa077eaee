"""``rolloutpool-adaptive`` on real processes: the operator's law moves the router's working-set targets.

Two engine-sims and our router on free loopback ports, a small short-context load, the
bench's law loop in this process: the law raises the targets (sessions queue or turns wait, nothing
presses) and the router holds exactly what the law wrote. Every process is stopped by the
``ProcessSet`` even when an assertion fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp

from rolloutpool.dev.bench.adaptive import bench_pool_spec
from rolloutpool.dev.bench.adaptive_loop import LawLoop, admin_token
from rolloutpool.dev.bench.client import ClientConfig, run_client
from rolloutpool.dev.bench.config import scaled_scenario
from rolloutpool.dev.bench.peers import RouterLaunch, our_router_argv
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.dev.processes import pid_alive
from rolloutpool.sim.workload import scenario

TIME_SCALE = 50.0
KV_TOKENS = 32768
MAX_MODEL_LEN = 8192
"""A cache that 48 short-burst rollouts fill: sessions queue for room, so the law raises the targets."""


async def _drive(
    loop: LawLoop, router_url: str, token: str
) -> tuple[dict[str, float | None], dict[str, float | None], float | None]:
    """Run client and law until the law has raised; return the law's targets, the router's, and the start."""
    workload = scaled_scenario(scenario("short-burst"), context_scale=1.0, max_model_len=MAX_MODEL_LEN)
    client = ClientConfig(
        base_url=router_url, scenario=workload, seed=0, in_flight=48, duration_s=20.0, time_scale=TIME_SCALE
    )
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        await loop.start(http)
        initial = loop.law.controls["r0"].target
        law_task = asyncio.create_task(loop.run(http))
        client_task = asyncio.create_task(run_client(client))
        try:
            deadline = time.monotonic() + 20.0
            while loop.law.raises == 0 and time.monotonic() < deadline and not law_task.done():
                await asyncio.sleep(0.1)
        finally:
            law_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await law_task
        assert await loop.write(http)  # the law's last decision, written after its loop stopped
        async with http.get(f"{router_url}/admin/replicas", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 200
            held = {row["name"]: row["target"] for row in (await resp.json())["replicas"]}
        client_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await client_task
    return {n: c.target for n, c in loop.law.controls.items()}, held, initial


def test_the_law_raises_targets_that_the_router_then_holds(tmp_path: Path) -> None:
    with ProcessSet(tmp_path / "logs") as procs:
        urls = []
        for i in range(2):
            port = free_port()
            url = f"http://{LOOPBACK}:{port}"
            argv = rolloutpool_argv(
                "engine-sim", "--host", LOOPBACK, "--port", str(port), "--time-scale", str(TIME_SCALE),
                "--kv-capacity-tokens", str(KV_TOKENS), "--max-model-len", str(MAX_MODEL_LEN),
            )  # fmt: skip
            procs.start(f"engine-{i}", argv, ready_url=f"{url}/health")
            urls.append(url)
        token, token_file = admin_token(tmp_path)
        launch = RouterLaunch(
            replica_urls=tuple(urls),
            port=free_port(),
            kv_capacity_tokens=KV_TOKENS,
            max_model_len=MAX_MODEL_LEN,
            time_scale=TIME_SCALE,
            scrape_interval_s=0.2,
            queue_timeout_s=60.0,
            admin_token_file=str(token_file),
        )
        router_url = f"http://{LOOPBACK}:{launch.port}"
        procs.start("router", our_router_argv(launch, prefix=rolloutpool_argv()), ready_url=f"{router_url}/readyz")
        spec = bench_pool_spec(
            replicas=2,
            max_model_len=MAX_MODEL_LEN,
            kv_capacity_tokens=KV_TOKENS,
            time_scale=TIME_SCALE,
        )
        # a pool that lets the law raise targets past its own (by default it only gives back what it cut)
        spec = spec.model_copy(update={"autoscaling": spec.autoscaling.model_copy(update={"max_target": 1.0})})
        loop = LawLoop.for_router(spec, urls, router_url=router_url, admin_token=token)
        targets, held, initial = asyncio.run(_drive(loop, router_url, token))
        pids = procs.pids
    assert initial is None  # before any metric the law publishes nothing: the router's own 0.9 applies
    assert loop.law.raises > 0
    assert loop.law.steps > 0
    assert any(t is not None and t > spec.concurrency.working_set_target for t in targets.values()), targets
    assert held == targets  # the router holds the targets the law wrote
    assert loop.write_failures == 0
    assert {"Raised"} <= {c.reason for c in loop.law.changes}
    assert not any(pid_alive(pid) for pid in pids)
