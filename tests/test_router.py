"""The session router proxies, places, sticks and releases over real HTTP (DESIGN sections 2-3).

Real engine simulators on loopback are the upstreams; nothing is mocked here.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest

from rolloutpool.router import ReplicaSpec, RouterConfig, parse_replica
from rolloutpool.router.config import cap_rule, ledger_config
from rolloutpool.router.relay import EventRelay, parse_usage
from rolloutpool.router.scrape import parse_signals
from rolloutpool.router.sessions import Usage
from rolloutpool.routing.caps import CapRule
from rolloutpool.routing.sessionkey import DEFAULT_BODY_FIELDS, SessionKeyError, parse_fields, session_key
from rolloutpool.routing.workingset import WorkingSetConfig
from routerkit import MODEL, engines, no_leaked_tasks, router, sse

WORDS = ["the", "agent", "reads", "the", "tool", "output", "and", "decides", "what", "to", "call", "next"]


def prompt(seed: int, n: int) -> str:
    return " ".join(WORDS[(seed + i * 7) % len(WORDS)] + str(seed) for i in range(n))


# -- pure helpers ------------------------------------------------------------------------


def test_session_key_precedence() -> None:
    fields = parse_fields(DEFAULT_BODY_FIELDS)  # session_params.session_id, then session_id, then user
    body = {"session_id": "body", "session_params": {"session_id": "params"}}
    assert session_key({"X-Session-ID": "hdr"}, body, header="X-Session-ID", fields=fields) == "hdr"
    assert session_key({}, body, header="X-Session-ID", fields=fields) == "params"
    assert session_key({}, {"session_params": {"session_id": 7}}, header="X-Session-ID", fields=fields) == "7"
    with pytest.raises(SessionKeyError):
        session_key({}, {"session_id": True}, header="X-Session-ID", fields=fields)
    assert session_key({}, {}, header="X-Session-ID", fields=fields) is None


def test_config_validation_and_caps() -> None:
    assert parse_replica("a=http://h:1/") == ReplicaSpec("a", "http://h:1")
    with pytest.raises(ValueError, match="name=url"):
        parse_replica("http://h:1")
    with pytest.raises(ValueError, match="duplicate"):
        RouterConfig(replicas=(ReplicaSpec("a", "http://h:1"), ReplicaSpec("a", "http://h:2")))
    spec = ReplicaSpec("a", "http://h:1")
    assert cap_rule(RouterConfig(replicas=(spec,))) == CapRule()
    assert cap_rule(RouterConfig(replicas=(spec,), cap=3, cap_ceiling=9)) == CapRule(fixed=3, ceiling=9)
    assert ledger_config(RouterConfig(replicas=(spec,))).working_set == WorkingSetConfig()  # turns by default
    assert ledger_config(RouterConfig(replicas=(spec,), turns=None)).working_set is None


def test_event_relay_drops_only_the_injected_usage_chunk() -> None:
    usage = b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}\n\n'
    text = b'data: {"choices": [{"text": "a"}], "usage": null}\n\n'
    relay = EventRelay(drop_usage_chunk=True)
    stream = text + usage + b"data: [DONE]\n\n"
    out = b"".join(relay.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + relay.close()
    assert out == text + b"data: [DONE]\n\n"
    assert relay.usage is not None
    assert (relay.usage.prompt_tokens, relay.usage.completion_tokens, relay.usage.cached_tokens) == (5, 2, None)
    keep = EventRelay(drop_usage_chunk=False)
    assert keep.feed(stream) == stream


def test_usage_of_the_responses_api_is_read_and_anthropics_is_not() -> None:
    details = {"input_tokens_details": {"cached_tokens": 32}, "output_tokens_details": {"reasoning_tokens": 0}}
    responses = {"usage": {"input_tokens": 40, "output_tokens": 7, "total_tokens": 47, **details}}
    assert parse_usage(responses) == Usage(40, 7, 32)
    completed = {"type": "response.completed", "response": responses}
    assert parse_usage(completed) == Usage(40, 7, 32)  # the stream's last event nests the response
    assert parse_usage({"type": "response.created", "response": {"usage": None}}) is None
    assert parse_usage({"response": {"response": responses}}) is None  # one level of nesting, no deeper
    anthropic = {"usage": {"input_tokens": 40, "output_tokens": 7, "cache_read_input_tokens": 32}}
    assert parse_usage(anthropic) is None  # its input_tokens leave out cache reads: not a context
    assert parse_usage({"usage": {"input_tokens": "40", "output_tokens": 7, **details}}) is None
    relay = EventRelay(drop_usage_chunk=True)
    stream = b"event: response.completed\ndata: " + orjson.dumps(completed) + b"\n\n"
    assert relay.feed(stream) + relay.close() == stream
    assert relay.usage == Usage(40, 7, 32)


def test_parse_signals_reads_vllm_names() -> None:
    text = """
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:num_requests_waiting{engine="1",model_name="m"} 1.0
vllm:num_preemptions_total{engine="0",model_name="m"} 4.0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:cache_config_info{block_size="16",num_gpu_blocks="100",engine="0"} 1.0
"""
    signals = parse_signals(text)
    assert signals.waiting == 3.0
    assert signals.preemptions_total == 4.0
    assert signals.kv_cache_usage == 0.5
    assert signals.capacity_tokens == 1600


# -- over HTTP ---------------------------------------------------------------------------


async def test_places_new_sessions_least_loaded_under_caps() -> None:
    async with engines(3) as urls, router(urls, cap=2) as rt:
        served = []
        for i in range(6):
            status, body, replica = await rt.complete(prompt(i, 20), session=f"s{i}")
            assert status == 200, body
            served.append(replica)
        assert sorted(served[:3]) == ["e0", "e1", "e2"]
        assert rt.live() == {"e0": 2, "e1": 2, "e2": 2}
        assert await rt.metric("rolloutpool_router_live_sessions") == 6
        assert await rt.metric("rolloutpool_router_session_cap", replica="e1") == 2
        async with rt.http.get(f"{rt.url}/metrics") as resp:
            text = await resp.text()
            assert "measured_session_floor{" not in text  # no maxModelLen: nothing projected
            assert "eviction_budget_scale" not in text  # nor budgeted
        assert await rt.metric("rolloutpool_router_placements_total") == 6
        status, body = await rt.request("GET", "/v1/models")
        assert status == 200
        assert body["data"][0]["id"] == MODEL
        assert (await rt.request("GET", "/healthz"))[0] == 200
        assert (await rt.request("GET", "/readyz"))[0] == 200
    await no_leaked_tasks()


async def test_the_working_set_follows_the_reported_kv_capacity() -> None:
    async with engines(1, num_gpu_blocks=2048, max_model_len=512) as urls, router(urls) as rt:
        # 2048 blocks * 16 = 32,768 tokens; the budget 0.9 of it; room for 14 first contexts of 2,048
        assert await rt.metric("rolloutpool_router_working_set_budget_tokens", replica="e0") == 29491
        assert rt.manager.replica("e0").cap == 14
        assert await rt.metric("rolloutpool_router_session_cap") == 14
        assert await rt.metric("rolloutpool_router_held_turns", replica="e0") == 0
    await no_leaked_tasks()


async def test_sessions_stick_across_turns_and_streams() -> None:
    async with engines(3) as urls, router(urls) as rt:
        for i in range(3):  # load the fleet so that least-loaded would move a re-placed session
            assert (await rt.complete(prompt(i, 10), session=f"other{i}"))[0] == 200
        text = prompt(42, 60)
        status, body, first = await rt.complete(text, session="A")
        assert status == 200
        for turn in range(3):
            text = f"{text}{body['choices'][0]['text']} {prompt(turn, 10)}"
            status, body, replica = await rt.complete(text, session="A")
            assert status == 200
            assert replica == first
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        assert not rt.manager.replica(first).quarantined
        # the body's session_id and session_params.session_id name the same session
        for extra in ({"session_id": "A"}, {"session_params": {"session_id": "A"}}):
            body = {"model": MODEL, "prompt": text, "max_tokens": 4, **extra}
            async with rt.http.post(f"{rt.url}/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["X-RolloutPool-Replica"] == first
        # streaming chat: passed through chunk by chunk; the usage chunk only when asked for
        chat = {"model": MODEL, "messages": [{"role": "user", "content": prompt(1, 30)}], "max_tokens": 6}
        async with rt.http.post(
            f"{rt.url}/v1/chat/completions", json={**chat, "stream": True}, headers={"X-Session-ID": "A"}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["X-RolloutPool-Replica"] == first
            events = await sse(resp)
        assert events[-1] == "[DONE]"
        assert all("usage" not in e or e["usage"] is None for e in events[:-1])
        assert len(events) >= 3
        measured = rt.manager.lookup("A").context_tokens
        assert measured > 0  # the router asked for usage itself and measured the turn
        asked = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        async with rt.http.post(f"{rt.url}/v1/chat/completions", json=asked, headers={"X-Session-ID": "A"}) as resp:
            events = await sse(resp)
        assert events[-2]["choices"] == []
        assert events[-2]["usage"]["prompt_tokens"] > 0
        assert rt.live()[first] == 2
    await no_leaked_tasks()


async def test_group_members_break_ties_toward_their_group() -> None:
    async with engines(3) as urls, router(urls, cap=3) as rt:
        assert (await rt.post("/v1/sessions", {"session_id": "solo"}))[0] == 201
        placed = []
        for i in range(4):
            status, body, _ = await rt.post("/v1/sessions", {"session_id": f"g{i}"}, headers={"X-Session-Group": "G"})
            assert status == 201
            placed.append(body["replica"]["name"])
        assert placed[0] != "e0"  # least loaded: e0 holds "solo"
        # the group goes to the least loaded, its own replicas first among equals: never onto solo's e0 while
        # its replicas are as light (packing it would unbalance the decode batches: policies.SessionAware)
        assert set(placed) == {"e1", "e2"}
        assert placed[2] == placed[0]  # all three replicas hold one: the tie goes to the group's first
        status, body, _ = await rt.post("/v1/sessions", {"session_id": "g0"})
        assert status == 200
        assert body["created"] is False
        assert body["replica"] == {"name": placed[0], "url": urls[placed[0]]}
        assert sum(rt.live().values()) == 5
    await no_leaked_tasks()


async def test_sessions_opening_with_one_prompt_form_a_group_without_the_hint() -> None:
    """A GRPO group's rollouts open with one prompt: the router names their group by it (``infer_groups``), so the
    working set counts the prompt once per replica and the group breaks placement ties toward its replicas."""
    task, other = prompt(1, 40), prompt(2, 40)

    async def groups(rt: object, headers: dict[str, str] | None = None) -> dict[str, str | None]:
        opened = {"a": task, "b": task, "c": other}
        for sid, text in opened.items():
            assert (await rt.complete(text, session=sid, headers=headers))[0] == 200  # type: ignore[attr-defined]
        later = await rt.complete(other, session="a")  # type: ignore[attr-defined]  # a later turn names no group
        assert later[0] == 200
        return {sid: rt.manager.lookup(sid).group for sid in opened}  # type: ignore[attr-defined]

    async with engines(3) as urls:
        async with router(urls) as rt:
            named = await groups(rt)
            assert named["a"] == named["b"]
            assert named["a"] is not None
            assert named["a"].startswith("prompt-")
            assert named["c"] not in {None, named["a"]}
            assert sum(rt.manager.table.group_members(named["a"]).values()) == 2
            work = rt.manager.ledger.work
            assert work is not None  # the prompt counted once per replica, learned from the first usage
            assert any(r.groups.get(named["a"], [0, 0])[1] > 0 for r in work.replicas.values())
        async with router(urls) as rt:
            assert set((await groups(rt, {"X-Session-Group": "G"})).values()) == {"G"}  # the hint wins
        async with router(urls, infer_groups=False) as rt:
            assert set((await groups(rt)).values()) == {None}
        async with router(urls, turn_scheduler="thunderagent") as rt:  # a peer knows only the groups it is told
            assert set((await groups(rt)).values()) == {None}
    await no_leaked_tasks()


async def test_release_paths_and_unknown_releases() -> None:
    async with engines(2) as urls, router(urls, implicit=None) as rt:  # a sessionless request is one turn
        for sid in ("a", "b", "c"):
            assert (await rt.complete(prompt(1, 10), session=sid))[0] == 200
        assert (await rt.complete(prompt(2, 10)))[0] == 200  # no key: one turn, released at once
        assert sum(rt.live().values()) == 3
        status, body, _ = await rt.post("/finish_session?session_id=a")
        assert (status, body["released"]) == (200, True)
        status, _ = await rt.request("DELETE", "/v1/sessions/b")
        assert status == 200
        status, _, _ = await rt.complete(prompt(3, 10), session="c", headers={"X-Session-Final": "true"})
        assert status == 200
        await asyncio.sleep(0)
        assert sum(rt.live().values()) == 0
        for path in ("/finish_session?session_id=a", "/finish_session?session_id=nope"):
            status, body, _ = await rt.post(path)
            assert status == 200  # as vllm-router: RL clients call it on every exit path
            assert (body["status"], body["released"]) == ("ok", False)
        status, body = await rt.request("DELETE", "/v1/sessions/b")
        assert status == 404
        assert sum(rt.live().values()) == 0
        assert await rt.metric("rolloutpool_router_releases_total", how="finish_session") == 1
        assert await rt.metric("rolloutpool_router_releases_total", how="delete") == 1
        assert await rt.metric("rolloutpool_router_releases_total", how="final") == 1
        assert await rt.metric("rolloutpool_router_releases_total", how="request") == 1
        assert (await rt.post("/finish_session"))[0] == 400
    await no_leaked_tasks()


async def test_bad_input_is_an_openai_error_and_changes_nothing() -> None:
    async with engines(1) as urls, router(urls, max_body_bytes=4096) as rt:
        cases = [
            (b"{not json", 400),
            (b"[1, 2]", 400),
            (b'{"model": "sim", "prompt": "' + b"x" * 8192 + b'"}', 413),
        ]
        for raw, expected in cases:
            async with rt.http.post(
                f"{rt.url}/v1/completions", data=raw, headers={"Content-Type": "application/json", "X-Session-ID": "s"}
            ) as resp:
                body = await resp.json()
                assert resp.status == expected, body
                assert set(body["error"]) == {"message", "type", "param", "code"}
        status, body = await rt.request("GET", "/v1/nothing")
        assert status == 404  # an unknown path is the router's 404, naming --allow-path
        assert "--allow-path /v1/nothing" in body["error"]["message"]
        # no model: the engine's one model serves it, as vLLM does (AReaL sends none); an implicit session
        async with rt.http.post(f"{rt.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["model"] == "sim"
        status, body, _ = await rt.complete(prompt(1, 5), session="s", headers={})
        assert status == 200
        # the engine's own errors pass through
        async with rt.http.post(f"{rt.url}/v1/completions", json={"model": "other", "prompt": "x"}) as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["type"] == "NotFoundError"
        assert rt.live() == {"e0": 2}  # "s" and the sessionless request's implicit session
    await no_leaked_tasks()


async def test_reprefill_counter_exists_at_zero_for_every_replica() -> None:
    """A counter born at its first increment is invisible to PromQL's rate(); each replica's starts at 0."""
    async with engines(2) as urls, router(urls) as rt:
        async with rt.http.get(f"{rt.url}/metrics") as resp:
            text = await resp.text()
        for name in ("e0", "e1"):
            assert f'rolloutpool_router_reprefilled_tokens_total{{replica="{name}"}} 0.0' in text
    await no_leaked_tasks()
