"""engine-sim publishes KV events in vLLM's wire format; the router's subscriber keeps an exact index from them.

Real processes' parts on loopback: engine-sim's HTTP server and ZMQ publisher, the router's
ZMQ subscriber and, last, the whole router. Faults (a late subscriber, lost batches, a
restarted engine, garbage on the wire) are made with the real publisher or a bare ZMQ socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
import zmq
import zmq.asyncio

from rolloutpool.api.kv_events import KVEventsConfig, encode_seq
from rolloutpool.dev.bench.kv_residency import CARRIERS, check_residency
from rolloutpool.dev.net import free_port
from rolloutpool.engine.server.app import _SERVICE, ServerConfig, build_app
from rolloutpool.engine.server.kv_publisher import KvEventPublisher
from rolloutpool.router.kv_events import ReplicaKvEvents
from rolloutpool.router.kv_sources import KvEventSource, KvEventsSettings
from routerkit import no_leaked_tasks, router, serve

BS = 16
MODEL = "sim"


def _engine_config(port: int, replay: int | None = None, **overrides: Any) -> ServerConfig:
    cfg: dict[str, Any] = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{port}"}
    if replay is not None:
        cfg["replay_endpoint"] = f"tcp://*:{replay}"
    settings: dict[str, Any] = {
        "time_scale": 1000.0,
        "num_gpu_blocks": 200,
        "block_size": BS,
        "max_model_len": 1500,
        "model": MODEL,
        "kv_events": KVEventsConfig.parse(json.dumps(cfg)),
    }
    return ServerConfig(**{**settings, **overrides})


@contextlib.asynccontextmanager
async def engine_sim(
    port: int, replay: int | None = None, **overrides: Any
) -> AsyncIterator[tuple[str, KvEventPublisher]]:
    app = build_app(_engine_config(port, replay, **overrides))
    async with serve(app) as (url, _):
        publisher = app[_SERVICE].kv_events
        assert publisher is not None
        yield url, publisher


@contextlib.asynccontextmanager
async def subscribed(source: KvEventSource, *, block_size: int = BS) -> AsyncIterator[ReplicaKvEvents]:
    ctx = zmq.asyncio.Context()
    sub = ReplicaKvEvents("e0", source, block_size=block_size, replay_timeout_s=2.0)
    task = asyncio.create_task(sub.run(ctx))
    try:
        await asyncio.sleep(0.3)  # joined before the events that matter
        yield sub
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        ctx.term()


async def _until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def _turn(http: aiohttp.ClientSession, url: str, prompt: list[int], sid: str) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 20, "return_token_ids": True}
    async with http.post(f"{url}/v1/completions", json=body, headers={"X-Session-ID": sid}) as resp:
        assert resp.status == 200
        reply: dict[str, Any] = await resp.json()
        return reply


async def test_residency_from_engine_sim_events_predicts_every_returning_turn_s_cached_tokens() -> None:
    port, replay = free_port(), free_port()
    async with engine_sim(port, replay) as (url, publisher):
        report = await check_residency(
            url,
            KvEventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"),
            model=MODEL,
            block_size=BS,
            quiet_s=0.1,
            connect_s=0.3,
        )
    assert len(report.returning) == 8 * 5
    assert report.mismatches == []
    assert report.evicted >= 8  # the pool of 200 blocks was outgrown: prefixes were evicted and re-prefilled
    assert any(t.cached > 0 for t in report.returning)  # while others found their prefix
    assert report.gaps == 0
    assert report.malformed == 0
    assert report.stats.unknown_removals == 0
    assert report.shape.seqs == list(range(publisher.sent))
    assert report.shape.sessions == {f"kv-{i}" for i in range(8)}  # every carrier reached the events
    assert report.shape.batch_lengths == {3}
    assert report.shape.fields["BlockRemoved"] == {"type", "block_hashes", "medium", "group_idx"}
    assert report.shape.removed_per_event == {1}  # one event per block, as vLLM sends them
    assert {"session_id", "extra_keys", "token_ids", "parent_block_hash"} <= report.shape.fields["BlockStored"]
    assert CARRIERS == ("body", "header", "xargs", "generate")


async def test_stored_events_carry_the_request_s_tokens_salt_and_session() -> None:
    port = free_port()
    async with engine_sim(port) as (url, _), subscribed(KvEventSource(f"tcp://127.0.0.1:{port}")) as sub:
        raw: list[bytes] = []
        original = sub.apply

        def tap(payload: bytes) -> None:
            raw.append(payload)
            original(payload)

        sub.apply = tap  # type: ignore[method-assign]
        prompt = list(range(100, 150))  # 3 full blocks of 16 and 2 tokens
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "cache_salt": "v7", "session_id": "body-wins"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{url}/v1/completions", json=body, headers={"X-Session-ID": "header"}) as resp:
                assert resp.status == 200
            async with http.post(f"{url}/v1/completions", json={**body, "session_id": 5}) as resp:
                assert resp.status == 400  # vLLM's request model: session_id is a string
        await _until(lambda: sub.batches >= 1)
    import msgspec  # noqa: PLC0415

    from rolloutpool.api.kv_events import BlockStored, KVEventBatch  # noqa: PLC0415

    stored = [e for p in raw for e in msgspec.msgpack.Decoder(KVEventBatch).decode(p).events]
    assert len(stored) == 1
    event = stored[0]
    assert isinstance(event, BlockStored)
    assert event.token_ids == prompt[:48]
    assert (event.block_size, event.medium, event.group_idx, event.parent_block_hash) == (BS, "GPU", 0, None)
    assert event.extra_keys == [("v7",), None, None]
    assert event.session_id == "body-wins"
    assert sub.index.resident_tokens("body-wins") == 48


async def test_a_late_subscriber_is_filled_from_the_replay_socket() -> None:
    port, replay = free_port(), free_port()
    async with engine_sim(port, replay) as (url, publisher), aiohttp.ClientSession() as http:
        await _turn(http, url, list(range(10, 90)), "early")  # before anyone listens
        assert publisher.sent >= 1
        async with subscribed(KvEventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}")) as sub:
            await _turn(http, url, list(range(200, 280)), "late")
            await _until(lambda: sub.expected == publisher.sent)
            assert (sub.gaps, sub.replays_ok, sub.replays_failed) == (1, 1, 0)
            assert sub.index.reliable
            assert sub.index.resident_tokens("early") == 80 // BS * BS + 16  # its prompt and first output block
            assert sub.index.resident_tokens("late") == 96


async def test_missed_events_without_replay_make_the_index_unreliable_until_a_reset() -> None:
    port = free_port()
    async with engine_sim(port) as (url, publisher), aiohttp.ClientSession() as http:
        await _turn(http, url, list(range(10, 90)), "early")
        async with subscribed(KvEventSource(f"tcp://127.0.0.1:{port}")) as sub:
            await _turn(http, url, list(range(200, 280)), "late")
            await _until(lambda: sub.expected == publisher.sent)
            assert sub.gaps == 1
            assert not sub.index.reliable
            assert sub.index.resident_tokens("late") is None
            async with http.post(f"{url}/reset_prefix_cache") as resp:
                assert resp.status == 200
            await asyncio.sleep(0.2)
            assert not sub.index.reliable  # as vLLM, the reset's event waits for the next step
            await _turn(http, url, list(range(500, 580)), "other")
            await _until(lambda: sub.expected == publisher.sent)
            assert sub.index.reliable  # AllBlocksCleared: exact again
            assert sub.index.resident_tokens("late") == 0
            assert sub.index.resident_tokens("other") == 96
            await _turn(http, url, list(range(200, 280)), "late")
            await _until(lambda: sub.expected == publisher.sent)
            assert sub.index.resident_tokens("late") == 96


async def test_a_gap_in_a_live_stream_is_filled_or_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    port, replay = free_port(), free_port()
    async with (
        engine_sim(port, replay) as (url, publisher),
        subscribed(KvEventSource(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}")) as sub,
        aiohttp.ClientSession() as http,
    ):
        await _turn(http, url, list(range(10, 90)), "a")
        await _until(lambda: sub.expected == publisher.sent)
        sock = publisher._pub
        assert sock is not None
        dropped = 0
        real_send = sock.send_multipart

        def lossy(frames: Any, flags: int = 0) -> None:
            nonlocal dropped
            if dropped < 2:  # the next two batches are lost in transit
                dropped += 1
                return
            real_send(frames, flags=flags)

        monkeypatch.setattr(sock, "send_multipart", lossy)
        for i in range(3):
            await _turn(http, url, list(range(300 + 100 * i, 380 + 100 * i)), f"b{i}")
        await _until(lambda: sub.expected == publisher.sent)
        assert dropped == 2
        assert (sub.gaps, sub.replays_ok) == (1, 1)
        assert sub.index.reliable
        assert [sub.index.resident_tokens(f"b{i}") for i in range(3)] == [96, 96, 96]


async def test_a_restarted_engine_starts_the_index_over() -> None:
    port = free_port()
    async with contextlib.AsyncExitStack() as stack:
        http = await stack.enter_async_context(aiohttp.ClientSession())
        first = await stack.enter_async_context(contextlib.AsyncExitStack())
        url, publisher = await first.enter_async_context(engine_sim(port))
        sub = await stack.enter_async_context(subscribed(KvEventSource(f"tcp://127.0.0.1:{port}")))
        await _turn(http, url, list(range(10, 90)), "a")
        await _turn(http, url, list(range(110, 190)), "b")
        await _until(lambda: sub.expected == publisher.sent)
        await first.aclose()
        url, publisher = await stack.enter_async_context(engine_sim(port))  # a fresh engine and publisher
        await asyncio.sleep(1.0)  # ZMQ reconnects by itself
        await _turn(http, url, list(range(310, 390)), "b")
        await _until(lambda: sub.expected == publisher.sent and sub.restarts == 1)
        assert sub.gaps == 0
        assert sub.index.reliable
        assert sub.index.resident_tokens("a") == 0  # the old engine's blocks went with it
        assert sub.index.resident_tokens("b") == 96


async def test_garbage_on_the_wire_marks_the_index_unreliable_and_the_subscriber_keeps_going() -> None:
    port = free_port()
    ctx = zmq.asyncio.Context()
    pub = ctx.socket(zmq.PUB)
    pub.linger = 0
    pub.bind(f"tcp://127.0.0.1:{port}")
    try:
        async with subscribed(KvEventSource(f"tcp://127.0.0.1:{port}")) as sub:
            await pub.send_multipart((b"", encode_seq(0), b"\xc1not msgpack"))
            await pub.send_multipart((b"", b"\x01", b""))  # a bad sequence frame
            await pub.send_multipart((b"only one frame",))
            await _until(lambda: sub.malformed == 3)
            assert not sub.index.reliable
            assert sub.expected == 1
    finally:
        pub.close(linger=0)
        ctx.term()


async def test_the_router_subscribes_to_each_replica_and_forgets_released_sessions() -> None:
    ports = [free_port(), free_port()]
    async with contextlib.AsyncExitStack() as stack:
        urls = {}
        for i, port in enumerate(ports):
            urls[f"e{i}"], _ = await stack.enter_async_context(engine_sim(port))
        settings = KvEventsSettings(endpoints=(("e1", KvEventSource(f"tcp://127.0.0.1:{ports[1]}")),), port=ports[0])
        r = await stack.enter_async_context(router(urls, kv_events=settings))
        hub = r.service.kv_events
        assert hub is not None
        await _until(lambda: set(hub.subscriptions) == {"e0", "e1"})
        await asyncio.sleep(0.3)
        body = {"model": MODEL, "prompt": list(range(10, 90)), "max_tokens": 20}
        for sid in ("s1", "s2", "s3"):
            status, _, _ = await r.post("/v1/completions", body, headers={"X-Session-ID": sid})
            assert status == 200
        placed = {sid: r.manager.table.sessions[sid].replica for sid in ("s1", "s2", "s3")}
        await _until(lambda: all(hub.resident_tokens(placed[s], s) == 96 for s in placed))
        assert await r.metric("rolloutpool_router_kv_index_reliable") == 2
        assert await r.metric("rolloutpool_router_kv_events_total") > 0
        assert await r.metric("rolloutpool_router_kv_event_gaps_total") == 0
        status, _, _ = await r.post("/finish_session?session_id=s1")
        assert status == 200
        await _until(lambda: hub.resident_tokens(placed["s1"], "s1") is None)  # forgotten at the next resync
        assert hub.resident_tokens(placed["s2"], "s2") == 96
    await no_leaked_tasks()


def test_kv_events_are_off_unless_configured() -> None:
    assert ServerConfig().kv_events is None
    with pytest.raises(ValueError, match="publishing is off"):
        KvEventPublisher(KVEventsConfig(), block_size=16)


async def test_a_router_without_kv_events_has_no_hub_and_no_kv_metrics() -> None:
    async with contextlib.AsyncExitStack() as stack:
        url, _ = await stack.enter_async_context(serve(build_app(ServerConfig(model=MODEL, time_scale=1000.0))))
        r = await stack.enter_async_context(router({"e0": url}))
        assert r.service.kv_events is None
        async with r.http.get(f"{r.url}/metrics") as resp:
            assert "kv_event" not in await resp.text()
