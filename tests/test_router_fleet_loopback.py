"""Three real router processes acting as one fleet (static mode) in front of three engine-sim processes.

The routers are given each other's URLs (``--self-url``, ``--peer-urls``) and the same engine
list; each takes its share of the engines and forwards sessions it does not own. The client
sends every turn of a session to another router. What must hold: the turns of a session all
reach one engine (the engine's own prefix cache says so: ``cached_tokens`` covers the previous
turn's context, which only that engine has seen), live counts over the fleet equal the sessions
held, each engine is counted by one router only, caps hold fleet-wide, any router releases.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from rolloutpool.dev.bench.fleet import FleetUrls, start_engines, start_fleet
from rolloutpool.dev.bench.processes import ProcessSet
from rolloutpool.router.fleet import FORWARDED_HEADER, PEER_AUTH_HEADER, peer_key
from rolloutpool.router.hop import REPLICA_HEADER
from rolloutpool.routing.fleetsplit import assign_engines
from rolloutpool.routing.fleetview import static_view

CAP = 2
BLOCK = 16


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FleetUrls, dict[str, str], ProcessSet]]:
    with ProcessSet(Path(tmp_path_factory.mktemp("fleet"))) as procs:
        engines = start_engines(procs, 3)
        urls = start_fleet(
            procs, engines, 3, name="fleet", extra=[f"--cap={CAP}", "--queue-timeout=1", "--scrape-interval=0.2"]
        )
        yield urls, engines, procs


def _live(text: str) -> dict[str, float]:
    pattern = r'^rolloutpool_router_live_sessions\{replica="([^"]+)"\} ([0-9.e+]+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


async def _fleet_live(http: aiohttp.ClientSession, routers: list[str]) -> list[dict[str, float]]:
    out = []
    for url in routers:
        async with http.get(f"{url}/metrics") as resp:
            out.append(_live(await resp.text()))
    return out


async def _turn(
    http: aiohttp.ClientSession, url: str, sid: str, messages: list[dict[str, str]], **headers: str
) -> tuple[int, dict[str, Any], str | None]:
    body = {"model": "sim", "messages": messages, "max_tokens": 6}
    async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid, **headers}) as r:
        return r.status, json.loads(await r.read()), r.headers.get(REPLICA_HEADER)


async def test_a_fleet_of_three_routers_acts_as_one(fleet: tuple[FleetUrls, dict[str, str], ProcessSet]) -> None:
    urls, engines, _ = fleet
    routers = urls.routers
    # Each router places only on its own engines, so the fleet is full when every router is: pick ids
    # that the ring (computed here as every router computes it) spreads CAP per engine over the routers.
    split = assign_engines(engines=engines, routers=routers, previous={})
    view = static_view(peers={u: u for u in routers}, split=split, engine_urls=engines, self_name=routers[0])
    room = {u: CAP * list(view.owners.values()).count(u) for u in view.peers}
    sessions = []
    for sid in (f"traj-{i}" for i in range(1000)):
        owner = view.owner(sid)
        if owner is not None and room[owner] > 0:
            room[owner] -= 1
            sessions.append(sid)
    assert len(sessions) == CAP * len(engines)
    history: dict[str, list[dict[str, str]]] = {
        s: [{"role": "user", "content": f"task of {s} starts"}] for s in sessions
    }
    served: dict[str, set[str | None]] = {s: set() for s in sessions}
    async with aiohttp.ClientSession() as http:

        async def rollout(i: int, sid: str) -> None:
            previous = 0
            for turn in range(4):
                status, body, replica = await _turn(http, routers[(i + turn) % 3], sid, history[sid])
                assert status == 200, body
                served[sid].add(replica)
                usage = body["usage"]
                if turn:  # the engine has this session's previous context cached: the same engine served it
                    assert usage["prompt_tokens_details"]["cached_tokens"] >= (previous - 1) // BLOCK * BLOCK > 0
                previous = usage["prompt_tokens"] + usage["completion_tokens"]
                history[sid] += [
                    {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                    {"role": "user", "content": f"observation {turn} of {sid} " + "word " * 20},
                ]

        await asyncio.gather(*(rollout(i, s) for i, s in enumerate(sessions)))
        assert all(len(replicas) == 1 and None not in replicas for replicas in served.values()), served

        live = await _fleet_live(http, routers)
        counted = [name for table in live for name, n in table.items() if n > 0]
        assert len(counted) == len(set(counted)), live  # each engine counted by one router only
        assert sorted(n for table in live for n in table.values() if n > 0) == [CAP] * len(engines)
        assert sum(sum(t.values()) for t in live) == len(sessions)
        assert {name for table in live for name in table} == set(engines)  # every engine belongs to a router

        # the fleet is full: a new session waits at its owner and gets the owner's 503, whichever router it hits
        for url in routers:
            status, body, _ = await _turn(http, url, f"extra-{url[-5:]}", [{"role": "user", "content": "x"}])
            assert status == 503, body
            assert body["error"]["type"] == "ServiceUnavailableError"

        # a client cannot claim its request was forwarded (it would pin the session on a second engine)
        status, body, replica = await _turn(
            http, routers[0], sessions[0], history[sessions[0]], **{FORWARDED_HEADER: "test"}
        )
        assert status == 403, body
        # a peer's forwarded request is served where it lands, never forwarded twice
        status, body, replica = await _turn(
            http,
            routers[0],
            sessions[0],
            history[sessions[0]],
            **{FORWARDED_HEADER: "test", PEER_AUTH_HEADER: peer_key(urls.admin_token)},
        )
        assert status in {200, 503}
        held0 = set(live[0])
        assert replica is None or replica in held0

        # any router releases any session (the release is forwarded to the owner)
        for i, sid in enumerate(sessions):
            async with http.post(f"{routers[(i + 1) % 3]}/finish_session", params={"session_id": sid}) as resp:
                assert resp.status < 300
        # at most the copy served here by the forwarded request above remains, until the sweep releases it
        for _ in range(40):
            live = await _fleet_live(http, routers)
            if sum(sum(t.values()) for t in live) == 0:
                break
            await asyncio.sleep(0.25)
        assert sum(sum(t.values()) for t in live) == 0, live


async def test_a_stream_is_relayed_through_a_router_that_does_not_own_it(
    fleet: tuple[FleetUrls, dict[str, str], ProcessSet],
) -> None:
    urls, engines, _ = fleet
    split = assign_engines(engines=engines, routers=urls.routers, previous={})
    view = static_view(peers={u: u for u in urls.routers}, split=split, engine_urls=engines, self_name=urls.routers[0])
    sid = next(f"stream-{i}" for i in range(1000) if view.owner(f"stream-{i}") == urls.routers[1])
    body = {"model": "sim", "messages": [{"role": "user", "content": "stream"}], "max_tokens": 5, "stream": True}
    async with aiohttp.ClientSession() as http:
        streams = []
        for url in (urls.routers[0], urls.routers[1]):  # through a non-owner (forwarded), then the owner itself
            async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/event-stream")
                streams.append(await resp.read())
        async with http.post(f"{urls.routers[2]}/finish_session", params={"session_id": sid}) as resp:
            assert resp.status < 300
    forwarded, direct = ([e for e in raw.split(b"\n\n") if e.strip()] for raw in streams)
    for events in (forwarded, direct):  # the same kind of stream either way
        assert len(events) >= 2
        assert b'"finish_reason": "length"' in events[-2]
        assert events[-1] == b"data: [DONE]"
        assert not any(b'"choices": []' in e or b'"choices":[]' in e for e in events)  # no injected usage chunk


async def test_a_dead_peer_of_a_static_fleet_gives_a_clear_503(
    fleet: tuple[FleetUrls, dict[str, str], ProcessSet],
) -> None:
    urls, _, procs = fleet
    victim = next(p for p in procs.processes if p.name == "fleet-router-2")
    victim.stop()
    async with aiohttp.ClientSession() as http:
        statuses: dict[int, int] = {}
        for i in range(40):
            status, body, _ = await _turn(http, urls.routers[0], f"after-{i}", [{"role": "user", "content": "x"}])
            statuses[status] = statuses.get(status, 0) + 1
            if status == 503 and "did not answer" in body["error"]["message"]:
                assert body["error"]["type"] == "ServiceUnavailableError"
            else:
                assert status == 200, body
            async with http.post(f"{urls.routers[0]}/finish_session", params={"session_id": f"after-{i}"}) as r:
                await r.read()
        assert statuses.get(200), statuses  # the sessions of the live routers are served
        assert statuses.get(503), statuses  # the dead router's fail clearly
