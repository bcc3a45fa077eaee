"""The prime-rl and SkyRL example clients run unchanged against our router, in front of engine-sim replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from rolloutpool.dev.net import free_port
from routerkit import engines

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def _run(*cmd: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={**os.environ}
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("client", ["prime_rl_client.py", "skyrl_client.py"])
async def test_example_client_runs_unchanged_against_our_router(client: str) -> None:
    async with engines(2, time_scale=50.0, max_model_len=32768, num_gpu_blocks=8192) as urls:
        port = free_port()
        launch = ["--worker-urls", *urls.values(), "--policy", "sticky_least_loaded", "--request-id-headers"]
        launch += ["x-session-id", "--port", str(port)]
        router = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rolloutpool.cli", "router", *launch, stderr=asyncio.subprocess.DEVNULL
        )
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http:
                for _ in range(300):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"{base}/readyz") as resp:
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.1)
                async with http.post(f"{base}/inference/v1/generate", json={}) as resp:
                    if resp.status == 404:  # the router of this branch owns no such route yet
                        pytest.skip("engine paths are forwarded by issue 12 item 1 (router/proxy.py), not merged here")
            code, out, err = await _run(sys.executable, str(EXAMPLES / client), "--url", base)
        finally:
            router.terminate()
            await router.wait()
    results = json.loads(out)["results"]
    assert results, err
    failed = {k: v for k, v in results.items() if v != "ok"}
    assert not failed, err
    assert code == 0


async def test_a_fan_out_weight_update_mid_run_on_real_processes_raises_no_false_alarm() -> None:
    script = EXAMPLES / "weight_sync_midrun.py"
    code, out, err = await _run(sys.executable, str(script), "--engines", "2", "--sessions", "8", "--duration", "8")
    assert code == 0, err
    report = json.loads(out)
    assert all(call["status"] == 200 and call["ok"] == 2 for call in report["fan_out"].values())
    assert report["errors"] == 0
    assert report["turns_with_cache_hits_before"] > 0
    assert report["sessions_with_a_turn_after_update"] > 0
    # the update flushed every cache: each session's next turn re-prefilled everything ...
    assert report["first_turn_after_update_cached_zero"] == report["sessions_with_a_turn_after_update"]
    # ... and none of it counted as eviction or quarantined a replica
    assert report["router_at_end"] == {"reprefilled_tokens": 0.0, "quarantines": 0.0}
