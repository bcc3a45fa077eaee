"""Pseudo-random but valid log-probabilities of tokens (pure, no I/O).

The simulator has no model, yet RL clients need ``logprobs``: the sampled token's
log-probability, its rank, and the most likely tokens at each position (vLLM's
``logprobs=k``), and the same for prompt tokens (``prompt_logprobs``). This module makes
them up, deterministically and cheaply (a few integer mixes and two ``log`` calls per
position, plus ``k`` additions; nothing at all when no logprobs are asked for).

The distribution at a position is a function of the server seed, the position and the
token before it (the "context"): the top token has probability ``p1`` in [0.5, 0.99],
the rank-``r`` token (``r >= 2``) ``(1 - p1) (1 - q) q^(r - 2)`` with ``q`` in [0.3, 0.9],
so probabilities sum to at most 1, strictly decrease with rank and every log-probability is
finite and negative. The scored token's rank is a function of the context and the token
(rank 1 six times in ten, 2 or 3 three times, else 4 to 63); the other ranks are filled by
ids of the generation vocabulary, which detokenize to text. So a generated token scores the
same as the same token at the same position of a later prompt (``prompt_logprobs`` of the
next turn agree with ``logprobs`` of this one), as a real model's would.

Known simplification: the tokens around the scored one depend on which token is scored, so
two choices that sample different tokens in the same context see different top-k lists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rolloutpool.engine.model.tokenizer import GENERATION_VOCAB

__all__ = ["MAX_LOGPROBS", "ScoredToken", "score", "score_output", "score_prompt"]

MAX_LOGPROBS: Final = 20
"""vLLM's default ``--max-logprobs``: the most top-k entries a request may ask for."""

_MASK64: Final = (1 << 64) - 1
_CANDIDATES: Final = tuple(i for i, text in GENERATION_VOCAB.items() if text.startswith(" "))
_UNIT: Final = 1.0 / (1 << 53)


@dataclass(frozen=True, slots=True)
class ScoredToken:
    """One position: the scored token, its log-probability and rank, and the ``k`` most likely tokens."""

    token: int
    logprob: float
    rank: int
    """1-based rank of ``token`` in the vocabulary at this position."""
    top: tuple[tuple[int, float], ...]
    """``(token id, logprob)`` of ranks ``1..k``, most likely first (contains ``token`` when ``rank <= k``)."""


def _mix(z: int) -> int:
    """splitmix64's finaliser: a 64-bit avalanche of ``z``."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _rank(h: int) -> int:
    roll = h % 1000
    if roll < 600:
        return 1
    if roll < 800:
        return 2
    if roll < 900:
        return 3
    return 4 + (h >> 20) % 60


def score(token: int, *, prev: int, position: int, k: int, seed: int = 0) -> ScoredToken:
    """The scored ``token`` at ``position`` after ``prev``, with the ``k`` most likely tokens (``k >= 0``)."""
    ctx = _mix(seed * 0x9E3779B97F4A7C15 + position * 0xD1B54A32D192ED03 + prev * 0x8CB92BA72F3D8DD7 + 1)
    p1 = 0.5 + 0.49 * ((ctx >> 11) * _UNIT)
    q = 0.3 + 0.6 * ((_mix(ctx) >> 11) * _UNIT)
    lp1 = math.log(p1)
    lp2 = math.log((1.0 - p1) * (1.0 - q))
    lq = math.log(q)
    rank = _rank(_mix(ctx ^ (token * 0xA24BAED4963EE407 + 7)))
    own = lp1 if rank == 1 else lp2 + (rank - 2) * lq
    if k <= 0:
        return ScoredToken(token, own, rank, ())
    top: list[tuple[int, float]] = []
    base = ctx >> 32
    other = 0
    for r in range(1, k + 1):
        lp = lp1 if r == 1 else lp2 + (r - 2) * lq
        if r == rank:
            top.append((token, lp))
            continue
        candidate = _CANDIDATES[(base + other) % len(_CANDIDATES)]
        other += 1
        if candidate == token:  # the scored token sits at its own rank only
            candidate = _CANDIDATES[(base + other) % len(_CANDIDATES)]
            other += 1
        top.append((candidate, lp))
    return ScoredToken(token, own, rank, tuple(top))


def score_output(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    k: int,
    seed: int = 0,
    start: int = 0,
    stop: int | None = None,
) -> list[ScoredToken]:
    """Scores of ``output_ids[start:stop]``, generated after ``prompt_ids`` (positions continue the prompt's)."""
    end = len(output_ids) if stop is None else stop
    offset = len(prompt_ids)
    out = []
    for j in range(start, end):
        prev = output_ids[j - 1] if j else (prompt_ids[-1] if prompt_ids else 0)
        out.append(score(output_ids[j], prev=prev, position=offset + j, k=k, seed=seed))
    return out


def score_prompt(prompt_ids: Sequence[int], *, k: int, seed: int = 0) -> list[ScoredToken | None]:
    """vLLM's ``prompt_logprobs``: ``None`` for the first token (nothing precedes it), then one score per token."""
    out: list[ScoredToken | None] = [None]
    for i in range(1, len(prompt_ids)):
        out.append(score(prompt_ids[i], prev=prompt_ids[i - 1], position=i, k=k, seed=seed))
    return out
