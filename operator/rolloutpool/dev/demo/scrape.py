"""Read one side of the demo at one instant: its engines' ``/metrics`` and (ours) the router's."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable

from rolloutpool.api import vllm_metrics as vm
from rolloutpool.dev.bench.adaptive import samples
from rolloutpool.dev.demo.figures import EngineTotals, RouterGauges
from rolloutpool.engine.server.instruments import LAG_SECONDS
from rolloutpool.router.instruments import PREFIX

__all__ = ["engine_totals", "router_gauges"]

_ENGINE = {
    vm.total(vm.GENERATION_TOKENS): "generated",
    vm.total(vm.PROMPT_TOKENS): "prompt",
    vm.total(vm.PROMPT_TOKENS_CACHED): "cached",
    vm.total(vm.NUM_PREEMPTIONS): "preemptions",
    vm.total(LAG_SECONDS): "lag_s",
}
_ROUTER = {
    f"{PREFIX}held_turns": "held",
    f"{PREFIX}kept_sessions": "kept",
    f"{PREFIX}let_go_sessions": "let_go",
    f"{PREFIX}replica_quarantined": "quarantined",
}
_DECISIONS = f"{PREFIX}turn_decisions_total"


def _get(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5.0) as response:  # noqa: S310 - our http URL
        body: bytes = response.read()
    return body.decode()


def engine_totals(urls: Iterable[str]) -> EngineTotals:
    """The engines' counters summed over ``urls`` (``OSError`` when one does not answer)."""
    sums = dict.fromkeys(_ENGINE.values(), 0.0)
    for url in urls:
        for name, _, value in samples(_get(url)):
            if name in _ENGINE:
                sums[_ENGINE[name]] += value
    return EngineTotals(**sums)


def router_gauges(url: str) -> RouterGauges:
    """Our router's turn-scheduling gauges and decision counters, summed over its replicas."""
    sums = dict.fromkeys([*_ROUTER.values(), "held_total", "moved_total"], 0)
    for name, labels, value in samples(_get(url)):
        if name in _ROUTER:
            sums[_ROUTER[name]] += round(value)
        elif name == _DECISIONS and labels.get("decision") in {"held", "moved"}:
            sums[f"{labels['decision']}_total"] += round(value)
    return RouterGauges(**sums)
