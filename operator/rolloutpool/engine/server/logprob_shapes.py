"""``logprobs`` and ``prompt_logprobs`` of the engine simulator's answers, shaped as vLLM 0.32's (pure).

The scores come from :mod:`rolloutpool.engine.model.logprobs`. vLLM keeps one dict per
position: the scored token first (with its rank), then ranks ``1..k`` without repeating
it, so a position lists ``k`` entries when the scored token is in the top ``k`` and
``k + 1`` otherwise. Each answer cuts that list its own way:

- ``/v1/completions``: ``{"text_offset", "token_logprobs", "tokens", "top_logprobs"}``,
  ``top_logprobs`` one ``{token string: logprob}`` dict per position with every entry;
- ``/v1/chat/completions``: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``
  with the first ``top_logprobs`` entries (the scored token first);
- ``/inference/v1/generate`` (token mode): ``{"content": [{"token_id", "logprob", "rank",
  "top_logprobs": [{"token_id", "logprob", "rank"}]}]}`` with the first ``max(k, 1)``;
- ``prompt_logprobs``: ``[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]``.

With ``return_tokens_as_token_ids`` a token string is ``token_id:<id>``; otherwise it is
the simulator's text of the id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rolloutpool.engine.model.logprobs import ScoredToken
from rolloutpool.engine.model.tokenizer import token_text

__all__ = [
    "chat_logprobs",
    "completion_logprobs",
    "generate_logprobs",
    "prompt_logprobs",
    "token_string",
]


def token_string(token: int, *, as_id: bool) -> str:
    """A token as the OpenAI shapes name it: ``token_id:<id>`` or its text."""
    return f"token_id:{token}" if as_id else token_text(token)


def _entries(score: ScoredToken) -> list[tuple[int, float, int]]:
    """vLLM's dict order: the scored token, then ranks 1..k without it."""
    out = [(score.token, score.logprob, score.rank)]
    out.extend((token, lp, rank) for rank, (token, lp) in enumerate(score.top, start=1) if token != score.token)
    return out


def completion_logprobs(scores: Sequence[ScoredToken], *, as_ids: bool, text_offset: int = 0) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/completions`` (``text_offset`` continues a stream's)."""
    offsets: list[int] = []
    tokens: list[str] = []
    values: list[float] = []
    tops: list[dict[str, float]] = []
    for score in scores:
        token = token_string(score.token, as_id=as_ids)
        offsets.append(text_offset)
        text_offset += len(token)
        tokens.append(token)
        values.append(score.logprob)
        tops.append({token_string(t, as_id=as_ids): lp for t, lp, _ in _entries(score)})
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}


def _chat_entry(token: int, logprob: float, *, as_ids: bool) -> dict[str, Any]:
    text = token_string(token, as_id=as_ids)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(scores: Sequence[ScoredToken], *, top: int, as_ids: bool) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/v1/chat/completions`` (and of generate's ``output_mode: text``)."""
    content = []
    for score in scores:
        entry = _chat_entry(score.token, score.logprob, as_ids=as_ids)
        entry["bytes"] = list(token_text(score.token).encode("utf-8"))  # the decoded token's bytes, even as an id
        entry["top_logprobs"] = [_chat_entry(t, lp, as_ids=as_ids) for t, lp, _ in _entries(score)[:top]]
        content.append(entry)
    return {"content": content}


def generate_logprobs(scores: Sequence[ScoredToken], *, k: int) -> dict[str, Any]:
    """``choices[i].logprobs`` of ``/inference/v1/generate`` in token mode: ids, no strings."""
    content = []
    for score in scores:
        top = [{"token_id": t, "logprob": lp, "rank": rank} for t, lp, rank in _entries(score)[: max(k, 1)]]
        content.append({"token_id": score.token, "logprob": score.logprob, "rank": score.rank, "top_logprobs": top})
    return {"content": content}


def prompt_logprobs(scores: Sequence[ScoredToken | None]) -> list[dict[str, dict[str, Any]] | None]:
    """``prompt_logprobs``: null for the first prompt token, then ``{"<id>": {logprob, rank, decoded_token}}``."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for score in scores:
        if score is None:
            out.append(None)
            continue
        out.append(
            {str(t): {"logprob": lp, "rank": rank, "decoded_token": token_text(t)} for t, lp, rank in _entries(score)}
        )
    return out
