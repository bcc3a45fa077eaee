"""Prefix renewal in the simulated fleet: the requests :mod:`rolloutpool.routing.renewal` asks for.

A renewal is an ordinary request to the session's replica, for the context its last
turn left (prompt + output) with ``max_tokens=1``; the engine model serves it like any
other (prefix hit, a few tokens of prefill, one sampled token, blocks freed at once).
Its sampled token is not part of the rollout, so the fleet's generated tokens, prefix
queries and hits leave renewals out (:meth:`SimRenewals.totals`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rolloutpool.engine.model.core import Request
from rolloutpool.routing.renewal import RenewalClock, RenewalConfig

__all__ = ["RenewalTotals", "SimRenewals"]


@dataclass(frozen=True)
class RenewalTotals:
    """What renewals cost, to keep them out of the rollouts' figures."""

    sent: int
    generated: int
    prefix_queries: int
    prefix_hits: int


class SimRenewals:
    """The clock of due renewals and the renewal requests in flight."""

    def __init__(self, config: RenewalConfig, *, block_size: int = 16) -> None:
        self.clock = RenewalClock(config)
        self._block_size = block_size
        self._inflight: dict[int, Request] = {}
        self._done = RenewalTotals(0, 0, 0, 0)

    def request(self, rid: int, *, chain_hashes: list[int], context_tokens: int, tag: object) -> Request:
        """A renewal of a context of ``context_tokens`` (the chain's first tokens); tracked until :meth:`finished`.

        Only the context's full blocks are hashed: the sampled token is not the rollout's next token, so the
        block it completes must not be cached under the chain's hash.
        """
        hashes = chain_hashes[: context_tokens // self._block_size]
        request = Request(rid, prompt_len=context_tokens, max_tokens=1, hashes=hashes, tag=tag)
        self._inflight[rid] = request
        return request

    def finished(self, request: Request) -> bool:
        """Whether a finished request was a renewal (then it is accounted for here)."""
        if self._inflight.pop(request.rid, None) is None:
            return False
        self._done = _add(self._done, request)
        return True

    def totals(self) -> RenewalTotals:
        """Renewals so far, including those still in flight (their sampled token counts once generated)."""
        totals = self._done
        for request in self._inflight.values():
            if request.scheduled_once:
                totals = _add(totals, request)
        return RenewalTotals(self.clock.renewals, totals.generated, totals.prefix_queries, totals.prefix_hits)


def _add(totals: RenewalTotals, request: Request) -> RenewalTotals:
    """Add one renewal's engine counts: its first admission queried its prompt (re-admissions are not counted)."""
    return RenewalTotals(
        totals.sent,
        totals.generated + request.num_output,
        totals.prefix_queries + request.prompt_len,
        totals.prefix_hits + request.cached_tokens,
    )
