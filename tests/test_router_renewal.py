"""Prefix renewal in the router keeps an idle live session's context cached (real engine simulators).

The pure pieces (what a renewal sends for each request shape, the text of streamed and
plain responses) are tested directly; the effect is shown end to end: a small KV cache,
session A makes a turn and idles, finished sessions churn the cache, A returns. Without
renewal stock LRU eviction takes A's prefix (the same test shows it, so it can fail);
with renewal A finds its whole previous context cached.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.dev.wait import wait_until_async
from rolloutpool.router import ReplicaSpec, RouterConfig
from rolloutpool.router.relay import EventRelay
from rolloutpool.router.renewal_body import CHAT_PATH, COMPLETIONS_PATH, TextCollector, renewal_body, response_text
from rolloutpool.routing.quarantine import expected_cached_tokens
from routerkit import MODEL, Router, engines, killable_engine, no_leaked_tasks, router

RENEWAL_FIELDS = {"stream": False, "n": 1, "temperature": 0, "max_tokens": 1}


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


# -- what a renewal sends ------------------------------------------------------------------


def test_completion_renewal_bodies_for_each_prompt_shape() -> None:
    body = {
        "model": MODEL,
        "prompt": "solve it",
        "max_tokens": 64,
        "min_tokens": 8,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": 5,
        "temperature": 0.9,
        "session_id": "A",
        "request_id": "r1",
    }
    out = renewal_body(COMPLETIONS_PATH, body, text=" done.")
    assert out == {"model": MODEL, "prompt": "solve it done.", "session_id": "A", **RENEWAL_FIELDS}
    assert body["prompt"] == "solve it"  # the client's body is left alone
    # token ids: only the prompt part (the output's ids are not in the response)
    ids = renewal_body(COMPLETIONS_PATH, {"model": MODEL, "prompt": [1, 2, 3]}, text=" x")
    assert ids == {"model": MODEL, "prompt": [1, 2, 3], **RENEWAL_FIELDS}
    # a batch of one is that one prompt
    assert renewal_body(COMPLETIONS_PATH, {"prompt": ["a b"]}, text=" c") == {"prompt": "a b c", **RENEWAL_FIELDS}
    assert renewal_body(COMPLETIONS_PATH, {"prompt": [[7, 8]]}, text=" c") == {"prompt": [7, 8], **RENEWAL_FIELDS}
    # shapes that are not renewed
    for odd in (
        {"prompt": ["a", "b"]},
        {"prompt": [[1], [2]]},
        {"prompt": "a", "n": 2},
        {"prompt": "a", "echo": True},
        {"prompt": "a", "suffix": "z"},
        {"prompt": []},
        {"prompt": [True, 2]},
        {"prompt_embeds": "..."},
        {},
    ):
        assert renewal_body(COMPLETIONS_PATH, odd, text=" x") is None, odd
    assert renewal_body("/v1/embeddings", {"prompt": "a"}, text="") is None


def test_chat_renewal_bodies() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = {"model": MODEL, "messages": messages, "max_completion_tokens": 99, "top_logprobs": 2, "logprobs": True}
    out = renewal_body(CHAT_PATH, body, text="hello")
    assert out == {
        "model": MODEL,
        "messages": [*messages, {"role": "assistant", "content": "hello"}],
        "max_completion_tokens": 1,
        **RENEWAL_FIELDS,
    }
    assert len(messages) == 2
    # a continued final assistant message grows in place
    cont = {"messages": [*messages, {"role": "assistant", "content": "Sure"}], "continue_final_message": True}
    grown = renewal_body(CHAT_PATH, cont, text=", here")
    assert grown is not None
    assert grown["messages"][-1] == {"role": "assistant", "content": "Sure, here"}
    assert len(grown["messages"]) == 3
    # a forced tool call becomes none (one token needs no grammar); tools stay, they shape the prompt
    tools = [{"type": "function", "function": {"name": "f"}}]
    forced = renewal_body(CHAT_PATH, {"messages": messages, "tools": tools, "tool_choice": "required"}, text="")
    assert forced is not None
    assert (forced["tools"], forced["tool_choice"]) == (tools, "none")
    for odd in ({"messages": []}, {"messages": "hi"}, {"messages": ["hi"]}, {"messages": messages, "n": 3}):
        assert renewal_body(CHAT_PATH, odd, text="x") is None, odd


def test_response_text_of_plain_responses() -> None:
    assert response_text(COMPLETIONS_PATH, {"choices": [{"index": 0, "text": " abc"}]}) == " abc"
    assert response_text(CHAT_PATH, {"choices": [{"message": {"role": "assistant", "content": "hi"}}]}) == "hi"
    tool = {"choices": [{"message": {"content": None, "tool_calls": [{"id": "c"}]}}]}
    assert response_text(CHAT_PATH, tool) is None
    assert response_text(COMPLETIONS_PATH, {"choices": [{"text": "a"}, {"text": "b"}]}) is None
    assert response_text(COMPLETIONS_PATH, None) is None
    assert response_text(COMPLETIONS_PATH, {"choices": []}) is None


def _sse(*objs: Any) -> bytes:
    return b"".join(f"data: {json.dumps(o)}\n\n".encode() for o in objs) + b"data: [DONE]\n\n"


def test_streamed_text_is_collected_while_relayed() -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}}
    stream = _sse(
        {"choices": [{"index": 0, "text": " one", "finish_reason": None}]},
        {"choices": [{"index": 0, "text": " two,", "finish_reason": "length"}]},
        {"choices": [], "usage": usage},
    )
    collector = TextCollector(COMPLETIONS_PATH)
    relay = EventRelay(drop_usage_chunk=True, collector=collector)
    out = b"".join(relay.feed(stream[i : i + 7]) for i in range(0, len(stream), 7)) + relay.close()
    assert b'"usage"' not in out  # the injected usage chunk is still dropped
    assert out.count(b"data:") == 3
    assert collector.text() == " one two,"
    assert relay.usage is not None
    assert relay.usage.completion_tokens == 3

    chat = TextCollector(CHAT_PATH)
    EventRelay(drop_usage_chunk=False, collector=chat).feed(
        _sse(
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
            {"choices": [{"index": 0, "delta": {"content": " there"}, "finish_reason": "stop"}]},
        )
    )
    assert chat.text() == "Hi there"
    for spoiler in ({"index": 1, "delta": {"content": "b"}}, {"index": 0, "delta": {"tool_calls": [{"id": "c"}]}}):
        odd = TextCollector(CHAT_PATH)
        odd.feed({"choices": [{"index": 0, "delta": {"content": "a"}}, spoiler]})
        assert odd.text() is None


def test_renew_every_must_be_positive() -> None:
    replicas = (ReplicaSpec("e0", "http://127.0.0.1:1"),)
    assert RouterConfig(replicas=replicas, renew_every_s=0.5).renew_every_s == 0.5
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="renew_every_s must be positive"):
            RouterConfig(replicas=replicas, renew_every_s=bad)


# -- the effect, against real engine simulators ----------------------------------------------

SMALL_CACHE: dict[str, Any] = {"num_gpu_blocks": 64, "max_model_len": 512}
"""63 usable blocks of 16 tokens: A's context takes 13, each churn round 20."""


async def _turn(rt: Router, api: str, session: str, history: Any, *, final: bool = False) -> tuple[Any, str, Any]:
    """One turn; returns (usage, generated text, the request's history: prompt or messages)."""
    headers = {"X-Session-ID": session}
    if final:
        headers["X-Session-Final"] = "true"
    if api == "chat":
        body = {"model": MODEL, "messages": history, "max_tokens": 16}
        async with rt.http.post(f"{rt.url}{CHAT_PATH}", json=body, headers=headers) as resp:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
        return answer["usage"], answer["choices"][0]["message"]["content"], history
    body = {"model": MODEL, "prompt": history, "max_tokens": 16, "stream": True}
    body["stream_options"] = {"include_usage": True}
    text, usage = "", None
    async with rt.http.post(f"{rt.url}{COMPLETIONS_PATH}", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event.get("usage"):
                usage = event["usage"]
            for choice in event["choices"]:
                text += choice["text"]
    return usage, text, history


def _first(api: str, tag: str, n: int) -> Any:
    return [{"role": "user", "content": words(tag, n)}] if api == "chat" else words(tag, n)


def _next(api: str, history: Any, text: str, observation: str) -> Any:
    if api == "chat":
        return [*history, {"role": "assistant", "content": text}, {"role": "user", "content": observation}]
    return f"{history}{text} {observation}"


async def _returning_turn(api: str, *, renew_every_s: float | None) -> dict[str, Any]:
    """A turns, idles while six rounds of finished sessions churn the cache, and returns."""
    async with (
        engines(1, **SMALL_CACHE) as urls,
        router(urls, renew_every_s=renew_every_s, turns=None) as rt,
    ):  # the stock LRU, placement only
        usage, text, history = await _turn(rt, api, "A", _first(api, "a", 180))
        context = usage["prompt_tokens"] + usage["completion_tokens"]
        session = rt.manager.lookup("A")
        assert session.context_tokens == context
        seen = session.last_seen
        for round_ in range(6):
            for k in range(2):
                await _turn(rt, api, f"churn{round_}-{k}", _first(api, f"c{round_}x{k}y", 150), final=True)
            if renew_every_s is not None:  # at least one renewal sent after this round (they are sequential)
                floor = await rt.metric("rolloutpool_router_renewals_total", outcome="ok") + 2
                await wait_until_async(lambda f=floor: _at_least(rt, "rolloutpool_router_renewals_total", f))
        # renewals are not turns: the session's context and last activity are as its turn left them
        assert (session.context_tokens, session.last_seen) == (context, seen)
        assert rt.manager.is_current(session)
        usage, _, _ = await _turn(rt, api, "A", _next(api, history, text, words("obs", 20)))
        path = CHAT_PATH if api == "chat" else COMPLETIONS_PATH
        return {
            "cached": usage["prompt_tokens_details"]["cached_tokens"],
            "expected": expected_cached_tokens(previous_context=context - 1, prompt_tokens=usage["prompt_tokens"]),
            "renewals_ok": await rt.metric("rolloutpool_router_renewals_total", outcome="ok"),
            "renewals_failed": await rt.metric("rolloutpool_router_renewals_total", outcome="failed"),
            "reprefilled": await rt.metric("rolloutpool_router_reprefilled_tokens_total"),
            "turns": await rt.metric("rolloutpool_router_request_duration_seconds_count", endpoint=path),
        }


async def _at_least(rt: Router, name: str, floor: float) -> bool:
    return await rt.metric(name, outcome="ok") >= floor


@pytest.mark.parametrize("api", ["completions-stream", "chat"])
async def test_renewal_keeps_an_idle_sessions_prefix_cached(api: str) -> None:
    stock = await _returning_turn(api, renew_every_s=None)
    # stock LRU: finished sessions' newer blocks pushed A's idle prefix out
    assert stock["expected"] >= 176
    assert stock["cached"] < stock["expected"] // 2, stock
    assert stock["reprefilled"] >= stock["expected"] // 2
    assert stock["renewals_ok"] == 0
    renewed = await _returning_turn(api, renew_every_s=0.2)
    assert renewed["cached"] == renewed["expected"] == stock["expected"], renewed
    assert renewed["renewals_ok"] >= 12
    assert renewed["renewals_failed"] == 0
    assert renewed["reprefilled"] == 0
    assert renewed["turns"] == stock["turns"] == 1 + 12 + 1  # renewals never pass as client requests
    await no_leaked_tasks()


async def test_renewals_to_a_dead_engine_are_counted_and_never_disturb_serving() -> None:
    async with (
        killable_engine(seed=7) as dying,
        engines(1) as others,
        router({"dying": dying.url, **others}, renew_every_s=0.1, scrape_interval_s=0.5) as rt,
    ):
        for sid in ("A", "B"):  # least-loaded: A on the dying replica, B on e0
            usage, _, _ = await _turn(rt, "completions-stream", sid, words(sid, 40))
            assert usage["prompt_tokens"] > 0
        a, b = rt.manager.lookup("A"), rt.manager.lookup("B")
        assert (a.replica, b.replica) == ("dying", "e0")
        renewals = "rolloutpool_router_renewals_total"
        await wait_until_async(lambda: _at_least(rt, renewals, 2))
        await dying.kill()
        # retried after each idle period (the scraper needs three failed scrapes, over 1 s, to see it down)
        await wait_until_async(lambda: _failed_at_least(rt, renewals, 2))
        assert rt.manager.lookup("A") is a  # a failed renewal never unbinds its session
        assert "A" in rt.service.renewer.records
        # the router keeps serving: the live replica's session, and a new session
        status, body, replica = await rt.complete(words("more", 10), session="B")
        assert (status, replica) == (200, "e0"), body
        await wait_until_async(lambda: not rt.manager.replica("dying").ready)  # the scraper, not the renewals
        status, body, replica = await rt.complete(words("new", 10), session="C")
        assert (status, replica) == (200, "e0"), body
        # once the replica is seen down its sessions wait: no more renewals are sent there
        failed = await rt.metric(renewals, outcome="failed", replica="dying")
        assert failed >= 2
        ok = await rt.metric(renewals, outcome="ok", replica="e0")
        await wait_until_async(lambda: _ok_at_least(rt, renewals, ok + 8))  # four renewal periods later
        assert await rt.metric(renewals, outcome="failed", replica="dying") <= failed + 1  # one was in flight
        assert await rt.metric(renewals, outcome="failed", replica="e0") == 0
        assert await rt.metric(renewals, outcome="ok", replica="e0") >= 1
        # releasing the dead replica's session forgets it: it is never renewed again
        assert (await rt.request("DELETE", "/v1/sessions/A"))[0] == 200
        assert "A" not in rt.service.renewer.records
        assert rt.service.renewer.clock.idle_sessions <= 2  # B and C at most
    await no_leaked_tasks()


async def _ok_at_least(rt: Router, name: str, floor: float) -> bool:
    return await rt.metric(name, outcome="ok", replica="e0") >= floor


async def _failed_at_least(rt: Router, name: str, floor: float) -> bool:
    return await rt.metric(name, outcome="failed") >= floor


async def test_renewal_records_follow_the_sessions_life() -> None:
    """Turns proceed while a renewal is in flight; expiry, release and a replica's removal forget a session."""
    async with (
        engines(2, added_latency_ms=150.0) as urls,  # slow answers: renewals are in flight most of the time
        router(urls, renew_every_s=0.05, idle_timeout_s=60.0, implicit=None) as rt,  # T's placement counts on it
    ):
        renewer = rt.service.renewer
        history = words("s", 60)
        status, body, replica = await rt.complete(history, session="S")
        assert status == 200
        await wait_until_async(lambda: renewer.inflight > 0)  # a renewal of S is in flight
        history = f"{history}{body['choices'][0]['text']} {words('obs', 5)}"
        status, body, again = await rt.complete(history, session="S")
        assert (status, again) == (200, replica)  # the turn went through beside the renewal
        context = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        assert rt.manager.lookup("S").context_tokens == context  # the renewal's answer changed nothing
        assert renewer.records["S"].body["prompt"] == f"{history}{body['choices'][0]['text']}"
        await wait_until_async(lambda: _at_least(rt, "rolloutpool_router_renewals_total", 2))
        assert rt.manager.lookup("S").context_tokens == context
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 0
        # one-shot requests (no session id) are never renewed
        status, _, _ = await rt.complete(words("once", 10))
        assert status == 200
        assert set(renewer.records) == {"S"}
        # a replica leaving forgets its sessions
        assert (await rt.complete(words("t", 10), session="T"))[0] == 200
        assert set(renewer.records) == {"S", "T"}
        other = rt.manager.lookup("T").replica
        assert other != replica
        rt.manager.remove_replica(other, reason="Deleted")
        assert set(renewer.records) == {"S"}
        # idle expiry forgets the session (renewals do not keep it alive)
        rt.manager.lookup("S").last_seen -= 120.0
        rt.manager.expire()
        assert renewer.records == {}
        assert renewer.clock.idle_sessions == 0
        assert renewer.tick() == 0
    await no_leaked_tasks()


def test_cli_refuses_a_non_positive_renewal_period() -> None:
    result = CliRunner().invoke(main, ["router", "--replica", "e0=http://127.0.0.1:1", "--renew-every", "-1"])
    assert result.exit_code == 2
    assert "renew_every_s must be positive" in result.output


async def test_a_renewal_the_engine_refuses_is_dropped_not_retried() -> None:
    """A turn that filled the context: its renewal is one token too long (400), so the record goes."""
    async with engines(1, **SMALL_CACHE) as urls, router(urls, renew_every_s=0.05, turns=None) as rt:
        status, body, _ = await rt.complete(words("w", 500), session="S", max_tokens=100)
        assert status == 200
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] == SMALL_CACHE["max_model_len"]
        await wait_until_async(lambda: "S" not in rt.service.renewer.records)
        assert await rt.metric("rolloutpool_router_renewals_total", outcome="failed") == 1
        assert rt.service.renewer.clock.idle_sessions == 0  # not scheduled again
        assert rt.manager.lookup("S") is not None  # the session itself is untouched
        status, body, _ = await rt.complete(words("x", 20), session="S")  # a new turn records again
        assert status == 200
        assert "S" in rt.service.renewer.records
    await no_leaked_tasks()
