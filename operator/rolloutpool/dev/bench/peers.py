"""Router configurations of the benchmark and their command lines (pure, no I/O).

Each peer is configured at its best (DESIGN section 8):

- ``rolloutpool``: our router alone (no operator), its default admission by projected KV tokens;
- ``rolloutpool-adaptive``: our router with the operator's adaptive law driving its caps
  (:mod:`rolloutpool.dev.bench.adaptive`: the law runs in the bench, caps go in through ``PUT /admin/limits``);
- ``vllm-consistent-hash``: vllm-router ``--policy consistent_hash`` (the key is ``X-Session-ID``);
- ``vllm-sticky-least-loaded``: ``--policy sticky_least_loaded``; the client calls
  ``POST /finish_session`` at every trajectory end;
- ``vllm-program``: ``--enable-program-scheduling`` with ``program_scheduling_enable_key:
  auto`` (so ``x-session-id`` opts in), ``token_capacity_per_target`` = the replica's KV
  tokens, ``binding_strategy: least_program_count``, ``global_queue: true`` and cost
  coefficients calibrated to engine-sim's cost model.

``vllm-cache-aware``, ``vllm-power-of-two`` and ``vllm-round-robin`` can be asked for
(``--router``); they keep no session affinity by key, so they are not run by default.

The turn schedulers re-implemented from other systems (``docs/peers.md``) run when named:
``thunderagent`` and ``progress-ttl`` are our router with ``--turn-scheduler`` (their time
constants divided by ``time_scale`` like everything else); ``continuum`` and ``continuum-fixed``
are engine-sims with ``--continuum paper|fixed`` behind vllm-router's sticky least-loaded.

Engine-sim runs ``time_scale`` simulated seconds per wall second, while vllm-router
measures wall time; so every coefficient and time constant that describes the
engine or the workload is divided by ``time_scale`` (what vllm-router would see on
the real hardware, compressed like everything else).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rolloutpool.engine.model.cost import CostModel
from rolloutpool.routing.peers.progress_ttl_math import BOUNDS_S

__all__ = [
    "ADAPTIVE",
    "CONTINUUM",
    "DEFAULT_ROUTERS",
    "OURS",
    "OUR_ROUTERS",
    "PEER_ROUTERS",
    "ROUTER_NAMES",
    "TURN_SCHEDULERS",
    "VLLM_ROUTERS",
    "RouterLaunch",
    "our_router_argv",
    "program_scheduling_config",
    "turn_scheduler_config",
    "uses_vllm_router",
    "vllm_router_argv",
]

OURS = "rolloutpool"
ADAPTIVE = "rolloutpool-adaptive"
OUR_ROUTERS: tuple[str, ...] = (OURS, ADAPTIVE)
"""The configurations that run our router."""
VLLM_ROUTERS: dict[str, str] = {
    "vllm-consistent-hash": "consistent_hash",
    "vllm-sticky-least-loaded": "sticky_least_loaded",
    "vllm-program": "consistent_hash",
    "vllm-cache-aware": "cache_aware",
    "vllm-power-of-two": "power_of_two",
    "vllm-round-robin": "round_robin",
}
"""Benchmark name -> vllm-router ``--policy`` (program scheduling keeps consistent hash as its fallback)."""
TURN_SCHEDULERS: tuple[str, ...] = ("thunderagent", "progress-ttl")
"""Peers that run as our router with another turn scheduler (``--turn-scheduler``)."""
CONTINUUM: dict[str, str] = {"continuum": "paper", "continuum-fixed": "fixed"}
"""Peers that run as pinning engine-sims (``--continuum RULE``) behind vllm-router's sticky least-loaded."""
PEER_ROUTERS: tuple[str, ...] = (*TURN_SCHEDULERS, *CONTINUUM)
ROUTER_NAMES: tuple[str, ...] = (*OUR_ROUTERS, *VLLM_ROUTERS, *PEER_ROUTERS)
"""Every configuration ``bench`` can run."""
DEFAULT_ROUTERS: tuple[str, ...] = (OURS, "vllm-consistent-hash", "vllm-sticky-least-loaded", "vllm-program")
"""What ``bench`` runs unless told otherwise: vllm-router's session-aware configurations."""


@dataclass(frozen=True)
class RouterLaunch:
    """What a router process needs to know about the fleet and the run."""

    replica_urls: tuple[str, ...]
    port: int
    kv_capacity_tokens: int
    """Per replica."""
    max_model_len: int | None
    """``None``: no caps (the overhead measurement)."""
    time_scale: float
    scrape_interval_s: float
    queue_timeout_s: float
    typical_prefill_tokens: int = 1000
    """New (uncached) tokens of a typical returning turn: calibrates ``decode_throughput_alpha``."""
    prometheus_port: int = 0
    """vllm-router's metrics port (it binds one; never its default 29000)."""
    admin_token_file: str | None = None
    """Our router's admin token (``rolloutpool-adaptive`` writes the operator's caps through the admin API)."""
    cost: CostModel | None = None
    """The engine-sims' step-time model (vllm-router's program scheduling is calibrated to it); None: the default."""
    kv_events: tuple[str, ...] = ()
    """Our router's ``--kv-events`` subscriptions (``NAME=tcp://HOST:PORT,tcp://HOST:REPLAY_PORT``), if any."""
    renew_every_s: float | None = None
    """Our router's ``--renew-every`` (wall seconds); None: no renewal."""


def uses_vllm_router(name: str) -> bool:
    """Whether configuration ``name`` runs vllm-router."""
    return name in VLLM_ROUTERS or name in CONTINUUM


def turn_scheduler_config(name: str, launch: RouterLaunch) -> dict[str, Any]:
    """A peer's turn-scheduler config for a time-scaled bench: its engine-time constants in wall seconds (pure)."""
    wall = 1.0 / launch.time_scale
    if name == "thunderagent":  # the Dynamo port's 5 s tick and 1,800 s resume timeout
        return {"interval_s": 5.0 * wall, "resume_timeout_s": 1800.0 * wall}
    if name == "progress-ttl":  # as vllm-program: its loop at the scrape interval, the TTLs scaled
        return {
            "interval_s": launch.scrape_interval_s,
            "max_acting_ttl_s": 10.0 * wall,
            "force_resume_timeout_s": 300.0 * wall,
            "bucket_bounds_s": [b * wall for b in BOUNDS_S],
        }
    raise ValueError(f"{name!r} is not a turn scheduler; choose from {', '.join(TURN_SCHEDULERS)}")


def our_router_argv(launch: RouterLaunch, *, prefix: list[str], turn_scheduler: str | None = None) -> list[str]:
    """``rolloutpool router`` arguments (``prefix`` runs the ``rolloutpool`` command); ``turn_scheduler``: a peer's."""
    argv = [*prefix, "router", "--host", "127.0.0.1", "--port", str(launch.port), "--no-state"]
    for i, url in enumerate(launch.replica_urls):
        argv += ["--replica", f"r{i}={url}"]
    if launch.max_model_len is None:  # the overhead measurement: placement only
        argv += ["--no-turn-scheduling"]
    elif turn_scheduler is not None:
        config = json.dumps(turn_scheduler_config(turn_scheduler, launch))
        argv += ["--turn-scheduler", turn_scheduler, "--turn-scheduler-config", config]
    else:  # the hold limit is engine time: the engine-sims run time-scaled
        argv += ["--time-scale", f"{launch.time_scale:g}"]  # its hold limit, lease prior and fairness wait
    argv += [
        "--scrape-interval", str(launch.scrape_interval_s),
        "--queue-timeout", str(launch.queue_timeout_s),
        "--queue-max", "100000",
    ]  # fmt: skip
    if launch.admin_token_file is not None:
        argv += ["--admin-token-file", launch.admin_token_file]
    for subscription in launch.kv_events:
        argv += ["--kv-events", subscription]
    if launch.renew_every_s is not None:
        argv += ["--renew-every", f"{launch.renew_every_s:g}"]
    return argv


def program_scheduling_config(
    *,
    kv_capacity_tokens: int,
    time_scale: float,
    metrics_interval_s: float,
    queue_timeout_s: float,
    typical_prefill_tokens: int,
    cost: CostModel | None = None,
) -> dict[str, Any]:
    """vllm-router's program-scheduling object, calibrated to engine-sim's cost model (pure).

    A lone prefill of ``n`` tokens in one chunk (``n`` past the knee) costs engine-sim
    ``fixed + (scale * n - knee) / linear_rate + scale * a_pair * n**2 / 2``, which is exactly vllm-router's
    ``intercept + linear * n/1k + quadratic * (n/1k)**2`` with the coefficients below. A decode step costs
    ``fixed + context_tokens * kv_bytes / kv_bandwidth`` below the knee (no per-request term: the
    bench's batches stay under it); while a typical prefill shares a step, decode keeps
    ``fixed / (fixed + prefill)`` of its throughput. Times are wall seconds: simulated seconds / ``time_scale``.
    """
    c = cost or CostModel()
    fixed = c.fixed_step_seconds
    scale = c.prefill_cost_scale
    n = typical_prefill_tokens
    prefill_s = c.step_seconds(prefill_tokens=n, attention_pairs=n * n / 2) - fixed
    wall = 1.0 / time_scale
    return {
        "program_scheduling_enable_key": "auto",
        "token_capacity_per_target": kv_capacity_tokens,
        "binding_strategy": "least_program_count",
        "global_queue": True,
        "metrics_interval_seconds": metrics_interval_s,
        "queue_timeout_seconds": queue_timeout_s,
        # the defaults' time constants, in simulated seconds like everything else
        "max_acting_ttl_seconds": 10.0 * wall,
        "force_resume_timeout_seconds": 300.0 * wall,
        "paused_retention_ttl_seconds": 1800.0 * wall,
        "shared_prefix_freshness_warmup_seconds": 100.0 * wall,
        "prefill_cost_model": {
            "intercept_seconds": (fixed - c.knee_tokens / c.linear_tokens_per_s) * wall,
            "linear_seconds_per_1k_tokens": 1000.0 * scale / c.linear_tokens_per_s * wall,
            "quadratic_seconds_per_1k_tokens_squared": 1e6 * scale * c.attention_pair_s / 2 * wall,
            "decode_throughput_alpha": min(1.0, max(0.0, fixed / (fixed + prefill_s))),
        },
        "decode_throughput_model": {
            "fixed_step_seconds": fixed * wall,
            "batch_step_seconds_per_request": 0.0,
            "context_step_seconds_per_token": c.kv_read_seconds(1) * wall,
        },
    }


def vllm_router_argv(name: str, launch: RouterLaunch, *, binary: str) -> list[str]:
    """The vllm-router command line of benchmark configuration ``name`` (Continuum: sticky least-loaded)."""
    policy = VLLM_ROUTERS["vllm-sticky-least-loaded" if name in CONTINUUM else name]
    argv = [
        binary,
        "--host", "127.0.0.1",
        "--port", str(launch.port),
        "--worker-urls", *launch.replica_urls,
        "--policy", policy,
        "--prometheus-host", "127.0.0.1",
        "--prometheus-port", str(launch.prometheus_port),
        "--worker-startup-check-interval", "1",
        "--request-timeout-secs", "3600",
        "--queue-timeout-secs", str(int(max(1, launch.queue_timeout_s))),
        "--log-level", "warning",
    ]  # fmt: skip
    if name == "vllm-program":
        config = program_scheduling_config(
            kv_capacity_tokens=launch.kv_capacity_tokens,
            time_scale=launch.time_scale,
            metrics_interval_s=launch.scrape_interval_s,
            queue_timeout_s=launch.queue_timeout_s,
            typical_prefill_tokens=launch.typical_prefill_tokens,
            cost=launch.cost,
        )
        argv += ["--enable-program-scheduling", "--program-scheduling-config-json", json.dumps(config)]
    return argv
