"""engine-sim's made-up log-probabilities: valid, deterministic, shaped per endpoint as vLLM 0.32 (pure)."""

from __future__ import annotations

import math

import pytest

from rolloutpool.engine.model.logprobs import MAX_LOGPROBS, ScoredToken, score, score_output, score_prompt
from rolloutpool.engine.model.tokenizer import GENERATION_VOCAB, generate_ids
from rolloutpool.engine.server.logprob_shapes import (
    chat_logprobs,
    completion_logprobs,
    generate_logprobs,
    prompt_logprobs,
)
from rolloutpool.engine.server.protocol import OpenAIError, parse_chat, parse_completion

PROMPT = list(range(100, 164))
OUTPUT = generate_ids(PROMPT, 300, seed=3)


@pytest.mark.parametrize("k", [0, 1, 2, 5, MAX_LOGPROBS])
def test_every_score_is_a_valid_distribution_head_with_the_scored_token_at_its_rank(k: int) -> None:
    for s in score_output(PROMPT, OUTPUT, k=k, seed=7):
        assert math.isfinite(s.logprob)
        assert s.logprob < 0
        assert s.rank >= 1
        assert len(s.top) == k
        values = [lp for _, lp in s.top]
        assert values == sorted(values, reverse=True)
        assert len(set(values)) == len(values)  # strictly decreasing: no ties
        assert len({t for t, _ in s.top}) == k
        assert math.fsum(math.exp(lp) for lp in values) <= 1.0
        if s.rank <= k:
            assert s.top[s.rank - 1] == (s.token, s.logprob)
        else:
            assert s.token not in {t for t, _ in s.top}
            assert not s.top or s.logprob < s.top[-1][1]
        assert all(t in GENERATION_VOCAB or t == s.token for t, _ in s.top)


def test_sampled_tokens_are_mostly_the_most_likely() -> None:
    ranks = [s.rank for s in score_output(PROMPT, OUTPUT, k=0)]
    assert 0.45 < ranks.count(1) / len(ranks) < 0.75
    assert max(ranks) > 3


def test_scores_are_deterministic_and_depend_on_the_seed() -> None:
    a = score_output(PROMPT, OUTPUT, k=3, seed=1)
    assert a == score_output(PROMPT, OUTPUT, k=3, seed=1)
    assert a != score_output(PROMPT, OUTPUT, k=3, seed=2)
    assert score_output(PROMPT, OUTPUT, k=3, seed=1, start=10, stop=20) == a[10:20]


def test_a_generated_token_scores_the_same_in_the_next_turns_prompt() -> None:
    # a real model gives the same logprob to the same token in the same context
    out = score_output(PROMPT, OUTPUT[:40], k=2)
    again = score_prompt(PROMPT + OUTPUT[:40], k=2)
    assert again[len(PROMPT) :] == out


def test_prompt_scores_start_with_none() -> None:
    scores = score_prompt([5, 6, 7], k=1)
    assert scores[0] is None
    assert [s.token for s in scores[1:] if s is not None] == [6, 7]
    assert score_prompt([5], k=1) == [None]


def test_top_k_ties_with_the_scored_token_never_repeat_it() -> None:
    # whatever the token, the other ranks are filled with other ids
    for token in list(GENERATION_VOCAB)[:200]:
        s = score(token, prev=1, position=9, k=MAX_LOGPROBS)
        assert len({t for t, _ in s.top}) == MAX_LOGPROBS


# -- shapes ---------------------------------------------------------------------------------

IN_TOP = ScoredToken(token=11, logprob=-0.5, rank=1, top=((11, -0.5), (12, -1.5)))
OUT_OF_TOP = ScoredToken(token=13, logprob=-4.0, rank=7, top=((11, -0.5), (12, -1.5)))


def test_completion_logprobs_list_k_entries_or_k_plus_one_keyed_by_token_id() -> None:
    got = completion_logprobs([IN_TOP, OUT_OF_TOP], as_ids=True, text_offset=3)
    assert got["tokens"] == ["token_id:11", "token_id:13"]
    assert got["token_logprobs"] == [-0.5, -4.0]
    assert got["text_offset"] == [3, 3 + len("token_id:11")]
    assert got["top_logprobs"] == [
        {"token_id:11": -0.5, "token_id:12": -1.5},
        {"token_id:13": -4.0, "token_id:11": -0.5, "token_id:12": -1.5},
    ]
    assert list(got["top_logprobs"][1]) == ["token_id:13", "token_id:11", "token_id:12"]  # the sampled token first


def test_chat_logprobs_keep_the_first_top_entries_sampled_first() -> None:
    got = chat_logprobs([OUT_OF_TOP], top=2, as_ids=True)
    (entry,) = got["content"]
    assert entry["token"] == "token_id:13"  # noqa: S105 - a token, not a password
    assert [t["token"] for t in entry["top_logprobs"]] == ["token_id:13", "token_id:11"]
    assert entry["top_logprobs"][1]["bytes"] == list(b"token_id:11")
    assert chat_logprobs([IN_TOP], top=0, as_ids=False)["content"][0]["top_logprobs"] == []


def test_generate_logprobs_carry_ids_and_ranks() -> None:
    (entry,) = generate_logprobs([OUT_OF_TOP], k=0)["content"]
    assert entry == {
        "token_id": 13,
        "logprob": -4.0,
        "rank": 7,
        "top_logprobs": [{"token_id": 13, "logprob": -4.0, "rank": 7}],
    }
    (entry,) = generate_logprobs([OUT_OF_TOP], k=2)["content"]
    assert [t["token_id"] for t in entry["top_logprobs"]] == [13, 11]


def test_prompt_logprobs_are_keyed_by_id_strings() -> None:
    got = prompt_logprobs([None, OUT_OF_TOP])
    assert got[0] is None
    assert got[1] is not None
    assert list(got[1]) == ["13", "11", "12"]
    assert got[1]["13"]["rank"] == 7
    assert isinstance(got[1]["11"]["decoded_token"], str)


# -- request parameters ------------------------------------------------------------------------


def test_completion_and_chat_logprob_parameters() -> None:
    _, params = parse_completion(
        {"prompt": [1, 2], "logprobs": 3, "prompt_logprobs": 1, "return_tokens_as_token_ids": True}
    )
    assert (params.logprobs, params.prompt_logprobs, params.token_ids_as_strings) == (3, 1, True)
    _, params = parse_completion({"prompt": [1, 2]})
    assert (params.logprobs, params.prompt_logprobs, params.token_ids_as_strings) == (None, None, False)
    _, params = parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 4})
    assert params.logprobs == 4
    _, params = parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": True})
    assert params.logprobs == 0
    _, params = parse_chat({"messages": [{"role": "user", "content": "x"}], "logprobs": False})
    assert params.logprobs is None


@pytest.mark.parametrize(
    ("chat", "fields", "param"),
    [
        (False, {"logprobs": MAX_LOGPROBS + 1}, "logprobs"),
        (False, {"logprobs": -1}, "logprobs"),
        (False, {"logprobs": -2}, "logprobs"),
        (False, {"logprobs": "x"}, "logprobs"),
        (False, {"prompt_logprobs": MAX_LOGPROBS + 1}, "prompt_logprobs"),
        (False, {"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        (True, {"top_logprobs": 2}, "top_logprobs"),
        (True, {"logprobs": True, "top_logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ],
)
def test_bad_logprob_parameters_are_400s_naming_the_field(chat: bool, fields: dict[str, object], param: str) -> None:
    parse = parse_chat if chat else parse_completion
    base: dict[str, object] = {"messages": [{"role": "user", "content": "x"}]} if chat else {"prompt": [1, 2]}
    with pytest.raises(OpenAIError) as err:
        parse({**base, **fields})
    assert err.value.status == 400
    assert err.value.param == param
