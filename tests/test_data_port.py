"""The data port serves data (issue 27): real engine-sim and router processes on loopback.

Each test names the breakage it pins; on ef7455d every one of them failed: control calls reached
the engines through the data port, any path with a session id made a live session, sessionless
auxiliary requests waited (and were refused) at cap, ``/health`` answered 503 on a full fleet, a
body without ``model`` was a 400, ``--api-key`` was refused and ``timeout_s=inf`` was a 500.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolloutpool.dev.bench.fleet import start_engines
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port

TOKEN = "admin-test-token"  # noqa: S105 -- a test token
API_KEY = "sk-data-port"
CONTROL = [
    "/pause?mode=keep",
    "/pause?mode=abort",
    "/update_weights",
    "/reset_prefix_cache",
    "/sleep",
    "/collective_rpc",
    "/start_profile",
    "/v1/load_lora_adapter",
    "/resume",
]


@dataclass(frozen=True)
class Stack:
    router: str
    engines: dict[str, str]
    procs: ProcessSet


def _router(procs: ProcessSet, engines: dict[str, str], name: str, *extra: str) -> str:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    token = procs.log_dir / "admin-token"
    token.write_text(TOKEN)
    argv = rolloutpool_argv(
        "router", f"--host={LOOPBACK}", f"--port={port}", "--cap=1", "--queue-timeout=3", "--scrape-interval=0.2",
        "--no-implicit-sessions",  # at cap 1 a sessionless turn is one turn here (implicit: test_sessionless_affinity)
        f"--admin-token-file={token}", *(f"--replica={n}={u}" for n, u in engines.items()), *extra,
    )  # fmt: skip
    procs.start(name, argv, ready_url=f"{url}/healthz")
    return url


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with ProcessSet(Path(tmp_path_factory.mktemp("dataport"))) as procs:
        engines = start_engines(procs, 2)
        yield Stack(_router(procs, engines, "router"), engines, procs)


@pytest.fixture(scope="module")
def keyed(stack: Stack) -> str:
    """A second router started with vllm-router's ``--api-key``."""
    return _router(stack.procs, stack.engines, "keyed", f"--api-key={API_KEY}")


async def _json(resp: aiohttp.ClientResponse) -> Any:
    return await resp.json(content_type=None)


async def _live(http: aiohttp.ClientSession, router: str) -> int:
    async with http.get(f"{router}/metrics") as resp:
        text = await resp.text()
    return int(sum(float(v) for v in re.findall(r"^rolloutpool_router_live_sessions\{[^}]*\} (\S+)$", text, re.M)))


async def _paused(http: aiohttp.ClientSession, engines: dict[str, str]) -> list[bool]:
    out = []
    for url in engines.values():
        async with http.get(f"{url}/is_paused") as resp:
            out.append(bool((await _json(resp))["is_paused"]))
    return out


async def _turn(http: aiohttp.ClientSession, router: str, sid: str | None, **body: Any) -> tuple[int, Any]:
    headers = {} if sid is None else {"X-Session-ID": sid}
    payload = {"model": "sim", "prompt": "a turn of a rollout", "max_tokens": 2, **body}
    async with http.post(f"{router}/v1/completions", json=payload, headers=headers) as resp:
        return resp.status, await _json(resp)


async def test_a_client_cannot_pause_flush_or_update_engines_through_the_data_port(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        for i, path in enumerate(CONTROL):
            async with http.post(f"{stack.router}{path}", json={}, headers={"X-Session-ID": f"ctl-{i}"}) as resp:
                assert resp.status == 403, path
                message = (await _json(resp))["error"]["message"]
                assert "/admin/rl/" in message
        assert await _paused(http, stack.engines) == [False, False]
        assert await _live(http, stack.router) == 0  # and no session was made by any of them
        status, _ = await _turn(http, stack.router, None)  # the fleet still serves
        assert status == 200
        # the admin fan-out with the provisioned token can, and only with it
        async with http.post(f"{stack.router}/admin/rl/pause?mode=keep") as resp:
            assert resp.status == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with http.post(f"{stack.router}/admin/rl/pause?mode=keep", headers=auth) as resp:
            assert resp.status == 200, await resp.text()
        assert await _paused(http, stack.engines) == [True, True]
        async with http.post(f"{stack.router}/admin/rl/resume", headers=auth) as resp:
            assert resp.status == 200
        assert await _paused(http, stack.engines) == [False, False]
        async with http.post(f"{stack.router}/admin/rl/is_paused?timeout_s=inf", headers=auth) as resp:
            assert resp.status == 400  # was a 500 with a traceback
            assert "finite" in (await _json(resp))["error"]["message"]


async def test_only_generation_creates_sessions_and_a_rejected_request_leaves_none(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        before = await _live(http, stack.router)
        statuses = await asyncio.gather(
            *(_get(http, f"{stack.router}/is_paused", f"probe-{i}") for i in range(300)),
            *(_post(http, f"{stack.router}/tokenize", {"prompt": "x"}, f"tok-{i}") for i in range(50)),
        )
        assert statuses.count(403) == 300
        assert statuses.count(200) == 50
        assert await _live(http, stack.router) == before
        status, body = await _turn(http, stack.router, "too-long", max_tokens=1, prompt="x " * 5000)
        assert status == 400, body  # the engine refuses a prompt over its context length
        assert await _live(http, stack.router) == before


async def _get(http: aiohttp.ClientSession, url: str, sid: str) -> int:
    async with http.get(url, headers={"X-Session-ID": sid}) as resp:
        return resp.status


async def _post(http: aiohttp.ClientSession, url: str, body: Any, sid: str | None = None) -> int:
    headers = {} if sid is None else {"X-Session-ID": sid}
    async with http.post(url, json=body, headers=headers) as resp:
        return resp.status


async def test_auxiliary_requests_and_health_never_wait_at_cap(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        for sid in ("hold-a", "hold-b"):  # cap 1 on each of the two engines: the fleet is full
            assert (await _turn(http, stack.router, sid))[0] == 200
        started = time.monotonic()
        for path, body in (
            ("/tokenize", {"prompt": "count me"}),
            ("/detokenize", {"tokens": [1, 2, 3]}),
            ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "x"}]}),
        ):
            assert await _post(http, f"{stack.router}{path}", body) == 200, path
        async with http.get(f"{stack.router}/health") as resp:
            assert resp.status == 200  # a probe must not pull a full router out of service
            assert (await _json(resp))["placeable"] is False
        assert time.monotonic() - started < 2.0  # the queue timeout is 3 s: nothing waited in it
        status, _ = await _turn(http, stack.router, "hold-a")  # a live session's next turn is served at cap
        assert status == 200
        for sid in ("hold-a", "hold-b"):
            async with http.post(f"{stack.router}/finish_session?session_id={sid}") as resp:
                assert resp.status == 200


async def test_a_body_without_model_is_served_by_the_engines_model(stack: Stack) -> None:
    async with aiohttp.ClientSession() as http:
        payload = {"prompt": [1, 2, 3, 4], "max_tokens": 3}  # AReaL: token ids, no model
        async with http.post(f"{stack.router}/v1/completions", json=payload) as resp:
            assert resp.status == 200, await resp.text()
            assert (await _json(resp))["model"] == "sim"


async def test_vllm_router_api_key_is_a_bearer_token_on_the_data_port(keyed: str) -> None:
    async with aiohttp.ClientSession() as http:
        assert (await _turn(http, keyed, None))[0] == 401
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with http.post(f"{keyed}/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers=headers) as resp:
            assert resp.status == 200
        async with http.post(f"{keyed}/finish_session?session_id=x") as resp:
            assert resp.status == 401
        for path in ("/health", "/healthz", "/readyz", "/metrics"):  # probes and Prometheus need no key
            async with http.get(f"{keyed}{path}") as resp:
                assert resp.status == 200, path
