"""The router's data path: any engine path routed by session, bytes passed through, the session key.

Pure parts (the body scan, the session key, the include_usage splice) are checked
against a JSON decoder; the rest runs over real HTTP: a router on loopback in front
of deterministic vLLM-like engines (:mod:`fakeengine`, real aiohttp servers).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakeengine import FINGERPRINT, FakeEngine
from rolloutpool.routing.bodyscan import ScanBudgetError, ScanError, scan_object, splice
from rolloutpool.routing.requestbody import BodyError, read_body
from rolloutpool.routing.sessionkey import DEFAULT_BODY_FIELDS, SessionKeyError, parse_fields, session_key
from routerkit import Router, no_leaked_tasks, router, serve

FIELDS = parse_fields(DEFAULT_BODY_FIELDS)

# -- pure: the body scan -------------------------------------------------------------------

_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
_text = st.text(alphabet=st.sampled_from('ab"\\{}[]:, \n\u00e9\U0001f600'), max_size=12)
_json = st.recursive(
    _scalars | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, _json, max_size=6), st.sampled_from([None, 2]), st.booleans())
def test_scan_finds_each_top_level_value_as_a_decoder_does(
    obj: dict[str, Any], indent: int | None, ascii_: bool
) -> None:
    raw = json.dumps(obj, indent=indent, ensure_ascii=ascii_).encode()
    keys = {json.dumps(k, ensure_ascii=ascii_)[1:-1].encode() for k in obj}
    spans = scan_object(raw, keys, budget=1 << 20)
    plain = {k: v for k, v in obj.items() if "\\" not in json.dumps(k, ensure_ascii=ascii_)}
    assert {k.decode(): json.loads(raw[s:e]) for k, (s, e) in spans.items() if k.decode() in plain} == plain


def test_scan_rejects_what_it_cannot_walk_and_gives_up_past_its_budget() -> None:
    for bad in (b"", b"[1]", b"{", b'{"a" 1}', b'{"a": "x}', b'{"a": [1, 2}', b'{"a": 1} x', b'{"a": 1,}'):
        with pytest.raises(ScanError):
            scan_object(bad, {b"a"})
    many = orjson.dumps({"messages": [{"content": f"m{i}"} for i in range(100)], "stream": True})
    with pytest.raises(ScanBudgetError):
        scan_object(many, {b"stream"}, budget=50)
    assert scan_object(many, {b"stream"}, budget=10_000) == {b"stream": (len(many) - 5, len(many) - 1)}
    assert splice(b'{"a":1}', None, b"k", b"2") == b'{"k":2,"a":1}'
    assert splice(b'{"k": 1 , "a":1}', (6, 7), b"k", b"[2]") == b'{"k": [2] , "a":1}'


# -- pure: the session key and the body ----------------------------------------------------


def test_session_key_header_then_body_fields_in_order() -> None:
    both = {"session_params": {"session_id": "params"}, "session_id": "flat", "user": "u"}
    assert session_key({"x-session-id": " hdr "}, both, header="X-Session-ID", fields=FIELDS) == "hdr"
    assert session_key({"X-Session-ID": "  "}, both, header="X-Session-ID", fields=FIELDS) == "params"
    assert session_key({}, {"session_id": "flat", "user": "u"}, header="X-Session-ID", fields=FIELDS) == "flat"
    assert session_key({}, {"user": "u", "session_id": None}, header="X-Session-ID", fields=FIELDS) == "u"
    assert session_key({}, {"session_id": 7}, header="X-Session-ID", fields=FIELDS) == "7"  # as vllm-router
    assert session_key({}, {"session_id": ""}, header="X-Session-ID", fields=FIELDS) is None
    assert session_key({}, {"episode": "e"}, header="H", fields=parse_fields(["episode"])) == "e"
    for bad, name in (
        ({"session_id": {"a": 1}}, "session_id"),
        ({"session_id": True}, "session_id"),
        ({"session_id": 1.5}, "session_id"),
        ({"session_params": "x"}, "session_params"),
        ({"user": ["u"]}, "user"),
        ({"session_id": "x" * 5000}, "session_id"),
    ):
        with pytest.raises(SessionKeyError) as info:
            session_key({}, bad, header="X-Session-ID", fields=FIELDS)
        assert info.value.field == name
    with pytest.raises(ValueError, match="dotted"):
        parse_fields(["session_params."])


@pytest.mark.parametrize("pad", [0, 10_000])  # decoded whole, and scanned
def test_read_body_forwards_the_received_bytes_and_splices_only_include_usage(pad: int) -> None:
    def read(raw: bytes, header: str | None = None) -> Any:
        return read_body(raw, header_key=header, fields=FIELDS, json_path=True, measure_stream=True)

    filler = "x" * pad
    raw = b'{ "model" : "m",  "prompt": "' + filler.encode() + b'", "stream" : true , "session_id": "s"}'
    body = read(raw)
    assert (body.key, body.stream, body.injected) == ("s", True, True)
    assert (
        body.body
        == b'{"stream_options":{"include_usage":true}, "model" : "m",  "prompt": "' + filler.encode() + raw[-39:]
    )
    asked = raw[:-1] + b', "stream_options": {"include_usage": true}}'
    assert read(asked).body is asked
    other = raw[:-1] + b', "stream_options": {"continuous_usage_stats": false}}'
    spliced = read(other).body
    assert spliced == raw[:-1] + b', "stream_options": {"continuous_usage_stats":false,"include_usage":true}}'
    plain = raw.replace(b"true", b"false")
    assert read(plain, header="h").body is plain
    for bad, message in ((b"{nope", "Invalid JSON"), (b"[1]", "JSON object")):
        with pytest.raises(BodyError, match=message):
            read(bad)
    assert read(b'{"prompt": "p"}').key is None  # no model: the engine serves its one model, as vLLM does
    opaque = read_body(b"not json", header_key=None, fields=FIELDS, json_path=False, measure_stream=False)
    assert (opaque.key, opaque.body) == (None, b"not json")


# -- over HTTP -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def fleet(count: int = 2, **overrides: Any) -> AsyncIterator[tuple[Router, list[FakeEngine], dict[str, str]]]:
    fakes = [FakeEngine(f"f{i}") for i in range(count)]
    async with contextlib.AsyncExitStack() as stack:
        urls = {}
        for fake in fakes:
            url, _ = await stack.enter_async_context(serve(fake.app()))
            urls[fake.name] = url
        rt = await stack.enter_async_context(router(urls, **overrides))
        yield rt, fakes, urls


async def raw_post(http: aiohttp.ClientSession, url: str, raw: bytes, **headers: str) -> tuple[int, bytes, Any]:
    async with http.post(url, data=raw, headers={"Content-Type": "application/json", **headers}) as resp:
        return resp.status, await resp.read(), resp.headers


def engine_of(fakes: list[FakeEngine], name: str) -> FakeEngine:
    return next(f for f in fakes if f.name == name)


async def test_generate_token_in_token_out_routed_by_session_and_measured() -> None:
    async with fleet() as (rt, fakes, urls):
        ids = list(range(1, 101))
        sent = orjson.dumps(
            {
                "token_ids": ids,
                "sampling_params": {"max_tokens": 10, "temperature": 1.0},
                "cache_salt": "policy-v3",
                "priority": 2,
                "return_token_ids": True,
                "routed_experts": [[1, 2]],
                "features": None,
            }
        )
        status, first, headers = await raw_post(
            rt.http, f"{rt.url}/inference/v1/generate", sent, **{"x-session-id": "traj-1"}
        )
        assert status == 200
        replica = headers["X-RolloutPool-Replica"]
        fake = engine_of(fakes, replica)
        assert fake.received[-1].body == sent  # the received bytes, forwarded unchanged
        assert fake.received[-1].headers["x-session-id"] == "traj-1"
        _, direct, _ = await raw_post(rt.http, f"{urls[replica]}/inference/v1/generate", sent)
        assert first == direct  # and the answer too
        assert orjson.loads(first)["choices"][0]["token_ids"] == [(sum(ids) + i) % 50000 for i in range(10)]
        assert rt.manager.lookup("traj-1").context_tokens == 110
        assert rt.live() == {"f0": 1, "f1": 0} or rt.live() == {"f0": 0, "f1": 1}
        # turn 2 (same cache_salt: a new salt would excuse the miss, routing/weights.py): 130 prompt tokens,
        # nothing cached: the previous context's 96 whole-block tokens were re-prefilled
        fake.cached_tokens = 0
        turn2 = orjson.dumps(
            {"token_ids": list(range(1, 131)), "sampling_params": {"max_tokens": 5}, "cache_salt": "policy-v3"}
        )
        status, _, headers = await raw_post(
            rt.http, f"{rt.url}/inference/v1/generate", turn2, **{"X-Session-ID": "traj-1"}
        )
        assert (status, headers["X-RolloutPool-Replica"]) == (200, replica)
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total", replica=replica) == 96
        # turn 3: everything cached: no re-prefill
        fake.cached_tokens = 128
        turn3 = orjson.dumps({"token_ids": list(range(1, 141)), "sampling_params": {"max_tokens": 5}})
        assert (await raw_post(rt.http, f"{rt.url}/inference/v1/generate", turn3, **{"X-Session-ID": "traj-1"}))[
            0
        ] == 200
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total", replica=replica) == 96
        assert sum(rt.live().values()) == 1
        assert (await rt.post("/finish_session?session_id=traj-1"))[0] == 200
        assert sum(rt.live().values()) == 0
        # the id reused after its finish (SkyRL reuses {instance}_{repetition}) is a new session: placed again,
        # and its first turn is not compared with the old session's context
        placed = await rt.metric("rolloutpool_router_placements_total")
        status, _, _ = await raw_post(rt.http, f"{rt.url}/inference/v1/generate", turn3, **{"X-Session-ID": "traj-1"})
        assert status == 200
        assert await rt.metric("rolloutpool_router_placements_total") == placed + 1
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total") == 96
        assert sum(rt.live().values()) == 1
    await no_leaked_tasks()


async def test_generate_stream_is_byte_identical_and_only_the_injected_usage_chunk_is_dropped() -> None:
    async with fleet(1) as (rt, fakes, urls):
        base = {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 4}, "stream": True}
        for asked in (True, False):
            body = {**base, "stream_options": {"include_usage": True}} if asked else base
            raw = orjson.dumps(body)
            via = await raw_post(rt.http, f"{rt.url}/inference/v1/generate", raw, **{"X-Session-ID": f"s-{asked}"})
            direct = await raw_post(rt.http, f"{urls['f0']}/inference/v1/generate", raw)
            assert via[0] == direct[0] == 200
            assert via[1] == direct[1], (via[1], direct[1])  # the client's stream, byte for byte
            assert FINGERPRINT.encode() in via[1]
            assert via[2]["X-Engine-Header"] == "kept"
            assert (b'"choices": []' in via[1]) is asked
            seen = json.loads(fakes[0].received[-2].body)  # what the engine got through the router
            assert seen["stream_options"]["include_usage"] is True  # injected when not asked
            assert rt.manager.lookup(f"s-{asked}").context_tokens == 3 + 4  # measured either way
        assert rt.live() == {"f0": 2}
    await no_leaked_tasks()


async def test_responses_api_turns_are_measured_streamed_or_not() -> None:
    """``/v1/responses`` reports ``input_tokens`` / ``output_tokens`` / ``input_tokens_details.cached_tokens``,
    nested in the ``response.completed`` event when streamed: both feed the session's context and re-prefill."""
    async with fleet(1) as (rt, fakes, urls):
        first = orjson.dumps({"model": "m", "input": "x" * 400, "max_output_tokens": 8})
        status, _, _ = await raw_post(rt.http, f"{rt.url}/v1/responses", first, **{"X-Session-ID": "r"})
        assert status == 200
        assert rt.manager.lookup("r").context_tokens == 101 + 8
        fakes[0].cached_tokens = 0  # turn 2, streamed: nothing cached, the 96 whole-block tokens of 109 re-prefilled
        second = orjson.dumps({"model": "m", "input": "x" * 800, "max_output_tokens": 8, "stream": True})
        via = await raw_post(rt.http, f"{rt.url}/v1/responses", second, **{"X-Session-ID": "r"})
        direct = await raw_post(rt.http, f"{urls['f0']}/v1/responses", second)
        assert via[0] == direct[0] == 200
        assert via[1] == direct[1]  # the stream, byte for byte
        assert b"response.completed" in via[1]
        assert rt.manager.lookup("r").context_tokens == 201 + 8
        assert await rt.metric("rolloutpool_router_reprefilled_tokens_total", replica="f0") == 96
    await no_leaked_tasks()


AUXILIARY = [
    ("POST", "/tokenize", b'{"model": "m", "prompt": "hi", "cache_salt": "v1"}'),
    ("POST", "/detokenize", b'{"model": "m", "tokens": [1, 2]}'),
    ("POST", "/v1/chat/completions/render", b'{"model": "m", "messages": []}'),
    ("GET", "/v1/responses/resp_1?x=1", b""),
    ("PUT", "/custom/allowed", b"opaque bytes, not JSON"),
]
GENERATION = [
    ("POST", "/v1/responses", b'{"model": "m", "input": "hi", "priority": 1}'),
    ("POST", "/skyrl/v1/generate", b'{"prompt_token_ids": [1], "sampling_params": {}}'),
]


async def test_auxiliary_paths_follow_a_live_session_and_never_create_one() -> None:
    async with fleet(allowed_paths=frozenset({"/custom/allowed"})) as (rt, fakes, _):
        for method, path, raw in GENERATION:  # generation paths: session S, on one replica, bytes as sent
            async with rt.http.request(method, f"{rt.url}{path}", data=raw, headers={"X-Session-ID": "S"}) as resp:
                assert resp.status == 200, (path, await resp.text())
                home = resp.headers["X-RolloutPool-Replica"]
        assert rt.live() == {home: 1, next(n for n in rt.live() if n != home): 0}
        for key in ("S", "unknown", None):
            for method, path, raw in AUXILIARY:
                headers = {} if key is None else {"X-Session-ID": key}
                async with rt.http.request(method, f"{rt.url}{path}", data=raw or None, headers=headers) as resp:
                    assert resp.status == 200, (path, await resp.text())
                    answer = await resp.json()
                    assert resp.headers["X-Engine-Header"] == "kept"
                    if key == "S":  # a live session's auxiliary requests go to its replica
                        assert resp.headers["X-RolloutPool-Replica"] == home
                got = engine_of(fakes, answer["engine"]).received[-1]
                assert (got.method, got.path_qs, got.body) == (method, path, raw)
        assert sum(rt.live().values()) == 1  # only S: no auxiliary request made a session
        assert rt.manager.lookup("unknown") is None
        assert rt.manager.lookup("S").context_tokens == 0  # no usage in these answers: no turn recorded
        assert await rt.metric("rolloutpool_router_upstream_errors_total") == 0
    await no_leaked_tasks()


async def test_engine_errors_and_bad_bodies_pass_or_fail_without_accounting_damage() -> None:
    async with fleet() as (rt, fakes, _):
        ok = b'{"token_ids": [1, 2], "sampling_params": {"max_tokens": 2}}'
        status, _, headers = await raw_post(rt.http, f"{rt.url}/inference/v1/generate", ok, **{"X-Session-ID": "A"})
        assert status == 200
        replica = headers["X-RolloutPool-Replica"]
        # a generate body without token_ids: forwarded, the engine's 400 passes through; session A stays
        no_ids = b'{"sampling_params": {"max_tokens": 2}}'
        status, body, headers = await raw_post(
            rt.http, f"{rt.url}/inference/v1/generate", no_ids, **{"X-Session-ID": "A"}
        )
        assert status == 400
        assert orjson.loads(body)["error"]["message"] == "token_ids: Field required"
        assert headers["X-RolloutPool-Replica"] == replica
        assert rt.manager.lookup("A") is not None
        # a request the engine refuses leaves no session it created
        status, _, _ = await raw_post(rt.http, f"{rt.url}/inference/v1/generate", no_ids, **{"X-Session-ID": "B"})
        assert status == 400
        assert rt.manager.lookup("B") is None
        assert await rt.metric("rolloutpool_router_releases_total", how="rejected") == 1
        assert rt.manager.replica(replica).ready
        assert sum(rt.live().values()) == 1  # session A only
        assert await rt.metric("rolloutpool_router_upstream_errors_total") == 0
        before = sum(len(f.received) for f in fakes)
        # a body session id of the wrong type: the router's 400 naming the field; nothing placed or sent
        for raw, param in (
            (b'{"token_ids": [1], "session_id": {"a": 1}}', "session_id"),
            (b'{"token_ids": [1], "session_params": {"session_id": true}}', "session_params.session_id"),
            (b'{"token_ids": [1], "user": 1.5}', "user"),
        ):
            status, body, _ = await raw_post(rt.http, f"{rt.url}/inference/v1/generate", raw)
            error = orjson.loads(body)["error"]
            assert (status, error["param"], error["type"]) == (400, param, "BadRequestError"), error
            assert set(error) == {"message", "type", "param", "code"}
        assert sum(len(f.received) for f in fakes) == before
        status, _, _ = await raw_post(
            rt.http, f"{rt.url}/inference/v1/generate", b'{"token_ids": [1], "session_id": 7}'
        )
        assert status == 200
        assert rt.manager.lookup("7") is not None  # an integer id is coerced, as vllm-router does
        assert sum(rt.live().values()) == 2
        # paths the router owns, engine control paths and unknown paths are never forwarded
        async with rt.http.get(f"{rt.url}/finish_session") as resp:
            assert resp.status == 405
        for path, status, words in (
            ("/pause?mode=keep", 403, "POST /admin/rl/pause"),
            ("/v1/load_lora_adapter", 403, "POST /admin/rl/v1/load_lora_adapter"),
            ("/missing/route", 404, "--allow-path /missing/route"),
        ):
            answer = await raw_post(rt.http, f"{rt.url}{path}", b"{}", **{"X-Session-ID": "C"})
            assert answer[0] == status
            assert words in orjson.loads(answer[1])["error"]["message"]
        assert rt.manager.lookup("C") is None
        assert sum(len(f.received) for f in fakes) == before + 1
    await no_leaked_tasks()


async def test_body_session_fields_are_configurable() -> None:
    async with fleet(1, session_body_fields=("episode.id",)) as (rt, _, _):
        raw = b'{"token_ids": [1], "session_id": "ignored", "episode": {"id": "E"}}'
        assert (await raw_post(rt.http, f"{rt.url}/inference/v1/generate", raw))[0] == 200
        assert rt.manager.lookup("E") is not None
        assert rt.manager.lookup("ignored") is None
    await no_leaked_tasks()
