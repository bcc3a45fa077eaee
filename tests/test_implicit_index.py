"""Implicit sessions (pure): prefix keys, answer tips, and the bounded index (routing/implicit.py)."""

from __future__ import annotations

import pytest

from rolloutpool.routing.answers import answer_tips, output_ids, streamed_tips
from rolloutpool.routing.implicit import ImplicitConfig, ImplicitIndex
from rolloutpool.routing.prefixkey import TOKEN_BLOCK, chat_keys, prompt_group, request_keys, token_keys

SYSTEM = {"role": "system", "content": "You are an agent."}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, object]:
    return {"role": "assistant", "content": text}


def chat_answer(text: str) -> dict[str, object]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}}]}


def turn(index: ImplicitIndex, messages: list[dict[str, object]], answer: str, *, now: float) -> str:
    """One whole sessionless chat turn through the index; returns its session id."""
    keys = request_keys("/v1/chat/completions", {"messages": messages})
    assert keys is not None
    match = index.match(keys.chain, now=now)
    index.answered(match.session_id, answer_tips(keys, chat_answer(answer)), now=now)
    index.ended(match.session_id, now=now)
    return match.session_id


# -- prefix keys -----------------------------------------------------------------------------


def test_chat_chain_links_one_digest_per_message_and_shares_prefixes() -> None:
    a = chat_keys([SYSTEM, user("task A"), assistant("ok")])
    b = chat_keys([SYSTEM, user("task A"), assistant("other")])
    assert len(a.chain) == 3
    assert a.chain[:2] == b.chain[:2]
    assert a.chain[2] != b.chain[2]


def test_answer_fields_a_client_drops_or_adds_do_not_change_the_key() -> None:
    sent = chat_keys([SYSTEM, {"role": "assistant", "content": "hi", "refusal": None, "reasoning_content": "x"}])
    back = chat_keys([SYSTEM, {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}])
    assert sent.chain == back.chain
    tool = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
    }
    same = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
    }
    assert chat_keys([tool]).chain == chat_keys([same]).chain


def test_token_chain_keys_full_blocks_only() -> None:
    keys = token_keys(list(range(TOKEN_BLOCK * 2 + 5)))
    assert len(keys.chain) == 2
    assert keys.tail == tuple(range(TOKEN_BLOCK * 2, TOKEN_BLOCK * 2 + 5))
    longer = token_keys(list(range(TOKEN_BLOCK * 3)))
    assert longer.chain[:2] == keys.chain


def test_request_shapes_without_keys() -> None:
    assert request_keys("/v1/completions", {"prompt": ["a", "b"]}) is None  # a batch
    assert request_keys("/v1/chat/completions", {"messages": []}) is None
    assert request_keys("/v1/responses", {"input": "x"}) is None
    assert request_keys("/v1/completions", {"prompt": [[1, 2, 3]]}) is not None  # a batch of one
    assert request_keys("/inference/v1/generate", {"token_ids": [1, 2]}) is not None
    assert request_keys("/v1/completions", {"prompt": [1.5] * 20}) is None  # not token ids
    assert request_keys("/v1/completions", {"prompt": [2**70] * 20}) is None  # past 64 bits


def test_a_prompt_group_names_the_whole_opening_prompt_its_model_and_salt() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "solve task 7"}]}
    assert prompt_group("/v1/chat/completions", chat) == prompt_group("/v1/chat/completions", {**chat, "n": 2})
    named = {
        prompt_group("/v1/chat/completions", chat),
        prompt_group("/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": "solve task 8"}]}),
        prompt_group("/v1/chat/completions", {**chat, "model": "lora-a"}),  # an adapter shares no KV with the base
        prompt_group("/v1/chat/completions", {**chat, "cache_salt": "s"}),
        prompt_group("/v1/chat/completions", {**chat, "tools": [{"type": "function"}]}),  # rendered first
    }
    assert len(named) == 5
    assert None not in named
    thinking = {**chat, "chat_template_kwargs": {"enable_thinking": False, "x": 1}}
    reordered = {**chat, "chat_template_kwargs": {"x": 1, "enable_thinking": False}}
    assert prompt_group("/v1/chat/completions", thinking) == prompt_group("/v1/chat/completions", reordered)
    ids = list(range(2 * TOKEN_BLOCK + 3))
    tokens = prompt_group("/inference/v1/generate", {"token_ids": ids})
    assert tokens == prompt_group("/v1/completions", {"prompt": ids})  # one token prompt, either path
    assert tokens != prompt_group("/inference/v1/generate", {"token_ids": [*ids[:-1], 9999]})  # the tail counts
    assert prompt_group("/v1/completions", {"prompt": "short"}) is not None  # shorter than one link: its tail
    assert prompt_group("/v1/completions", {"prompt": ["a", "b"]}) is None  # a batch names no group
    assert prompt_group("/v1/embeddings", {"input": "x"}) is None


def test_the_tip_of_a_token_turn_is_the_next_prompts_prefix() -> None:
    prompt = list(range(40))
    keys = request_keys("/v1/completions", {"prompt": prompt})
    assert keys is not None
    out = [100 + i for i in range(30)]
    response = {"choices": [{"index": 0, "text": "", "logprobs": {"tokens": [f"token_id:{t}" for t in out]}}]}
    assert output_ids(response["choices"][0]) == out
    (tip,) = answer_tips(keys, response)
    following = token_keys([*prompt, *out, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7])
    assert tip in following.chain
    assert answer_tips(keys, {"choices": [{"index": 0, "text": "x"}]}) == ()  # ids unknown: no tip


def test_streamed_chat_text_gives_the_same_tip_as_the_whole_answer() -> None:
    keys = chat_keys([SYSTEM, user("q")])
    assert streamed_tips(keys, "done") == answer_tips(keys, chat_answer("done"))
    assert streamed_tips(keys, None) == ()


# -- the index ---------------------------------------------------------------------------


def test_a_conversation_that_extends_its_answer_continues_its_session() -> None:
    index = ImplicitIndex()
    history: list[dict[str, object]] = [SYSTEM, user("task A")]
    first = turn(index, history, "step 1", now=0.0)
    history += [assistant("step 1"), {"role": "tool", "content": "result", "tool_call_id": "t"}]
    assert turn(index, history, "step 2", now=1.0) == first
    history += [assistant("step 2"), user("more")]
    assert turn(index, history, "step 3", now=2.0) == first
    other = turn(index, [SYSTEM, user("task B")], "x", now=2.0)
    assert other != first


def test_a_grpo_group_is_not_one_session_but_shares_a_group() -> None:
    index = ImplicitIndex()
    keys = chat_keys([SYSTEM, user("same prompt")])
    matches = [index.match(keys.chain, now=0.0) for _ in range(4)]  # all in flight at once
    assert len({m.session_id for m in matches}) == 4
    assert [m.outcome for m in matches] == ["created", "forked", "forked", "forked"]
    assert len({m.group for m in matches}) == 1
    for i, m in enumerate(matches):
        index.answered(m.session_id, answer_tips(keys, chat_answer(f"sample {i}")), now=1.0)
        index.ended(m.session_id, now=1.0)
    for i, m in enumerate(matches):  # each sample's next turn returns to its own session
        nxt = chat_keys([SYSTEM, user("same prompt"), assistant(f"sample {i}"), user("go on")])
        again = index.match(nxt.chain, now=2.0)
        assert (again.session_id, again.outcome) == (m.session_id, "matched")


def test_a_later_sample_of_an_answered_prompt_is_a_new_session() -> None:
    index = ImplicitIndex()
    first = turn(index, [SYSTEM, user("p")], "a", now=0.0)
    keys = chat_keys([SYSTEM, user("p")])
    second = index.match(keys.chain, now=1.0)
    assert second.session_id != first
    assert second.outcome == "forked"


def test_forks_of_one_prefix_yield_after_the_limit() -> None:
    index = ImplicitIndex(ImplicitConfig(yield_after=2))
    keys = chat_keys([SYSTEM, user("p")])
    outcomes = [index.match(keys.chain, now=0.0).outcome for _ in range(5)]
    assert outcomes == ["created", "forked", "forked", "yielded", "yielded"]


def test_without_a_known_answer_a_longer_prompt_continues_the_idle_session() -> None:
    index = ImplicitIndex()
    prompt = list(range(64))
    keys = token_keys(prompt)
    first = index.match(keys.chain, now=0.0)
    index.answered(first.session_id, (), now=0.0)  # no ids in the response
    index.ended(first.session_id, now=0.0)
    nxt = token_keys([*prompt, *range(500, 540)])
    assert index.match(nxt.chain, now=1.0).session_id == first.session_id
    index.ended(first.session_id, now=1.0)
    same = index.match(keys.chain, now=2.0)  # the same prompt again is a sample, not a continuation
    assert same.session_id != first.session_id


def test_memory_is_bounded_and_evicted_sessions_are_released() -> None:
    index = ImplicitIndex(ImplicitConfig(max_entries=8))
    ids = [turn(index, [SYSTEM, user(f"task {i}")], "a", now=float(i)) for i in range(20)]
    assert len(index) <= 8
    assert len(index.sessions) <= 20
    released = index.expire(now=20.0)
    assert {how for _, how in released} == {"implicit_evicted"}
    assert len(index.sessions) <= 8
    assert ids[-1] in index.sessions  # the newest stays


def test_idle_sessions_expire_but_not_while_a_turn_runs() -> None:
    index = ImplicitIndex(ImplicitConfig(idle_timeout_s=30.0))
    done = turn(index, [SYSTEM, user("a")], "x", now=0.0)
    running = index.match(chat_keys([SYSTEM, user("b")]).chain, now=0.0).session_id
    assert index.expire(now=10.0) == []
    assert index.expire(now=31.0) == [(done, "implicit_idle")]
    assert running in index.sessions
    assert index.expire(now=100.0) == []
    assert all(sid != done for sid in index.entries.values())


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        ImplicitConfig(max_entries=0)


def test_idle_sessions_yield_to_a_queue_longest_idle_first() -> None:
    from rolloutpool.routing.implicit import ImplicitConfig, ImplicitIndex  # noqa: PLC0415

    index = ImplicitIndex(ImplicitConfig(idle_timeout_s=30.0, yield_idle_s=2.0))
    made = [index.match([bytes([i + 1]) * 16], now=float(i)) for i in range(3)]
    for i, resolved in enumerate(made):
        index.ended(resolved.session_id, now=float(i))
    assert index.expire(now=2.5) == []  # nobody waits: idle sessions stay until the idle timeout
    assert index.expire(now=2.5, waiting=5) == [(made[0].session_id, "implicit_yield")]  # the others idle < 2 s
    assert index.expire(now=10.0, waiting=1) == [(made[1].session_id, "implicit_yield")]
