"""``rolloutpool router``: the session router in front of engines (static, discovered, or one of a fleet)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.workingset_state import WorkingSetConfig

if TYPE_CHECKING:
    from rolloutpool.router.config import RouterConfig
    from rolloutpool.router.kv_sources import KvEventsSettings

__all__ = ["router_command"]

_SCHEDULER = WorkingSetConfig()
"""The turn scheduler's defaults: the flags below and the spec's ``concurrency`` (api/spec.py) start from them."""


def _check_writable(flag: str, path: Path) -> None:
    """A usage error, not a traceback at startup, when the router could not write ``path``."""
    if not path.parent.is_dir():
        raise click.UsageError(f"{flag} {path}: directory {path.parent} does not exist")
    try:
        with path.open("ab"):  # appends nothing: the file is only created when missing
            pass
    except OSError as err:
        raise click.UsageError(f"{flag} {path}: cannot write it ({err.strerror or err})") from err


def _default_state(host: str, port: int) -> Path | None:
    """The default snapshot path, its directory made; None (logged) where it cannot be."""
    import logging  # noqa: PLC0415
    import os  # noqa: PLC0415

    from rolloutpool.router.state import default_state_path  # noqa: PLC0415

    path = default_state_path(host=host, port=port, env=os.environ)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        logging.getLogger("rolloutpool.router").warning(
            "Running without a state file path=%s error=%s: give --state-path to keep sessions across restarts",
            path,
            err.strerror or err,
        )
        return None
    return path


@click.command(
    "router",
    # vllm-router's flags (--worker-urls URL..., --policy, ...) arrive as extra arguments: router/compat.py
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    epilog="vllm-router's flags are accepted too (--worker-urls URL..., --policy, --request-id-headers, ...): "
    "see docs/migrating-from-vllm-router.md.",
)
@click.pass_context
@click.option("--replica", "replicas", multiple=True, help="name=url of an engine (repeatable).")
@click.option("--discover-namespace", default=None, help="Discover replicas from the pods of this namespace.")
@click.option(
    "--discover-selector", default=None, help="Label selector of the engine pods (with --discover-namespace)."
)
@click.option("--kubeconfig", type=click.Path(dir_okay=False), default=None, help="Default: in-cluster config.")
@click.option(
    "--pool", default=None, help="RolloutPool (in --discover-namespace) whose status caps and quarantine apply."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option(
    "--target",
    type=click.FloatRange(0.05, 2.0),
    default=_SCHEDULER.target,
    show_default=True,
    help="Share of each replica's KV capacity its working set may fill (generating sessions' contexts and the idle "
    "prefixes kept): turns of sessions whose prefix was let go wait for room under it.",
)
@click.option(
    "--keep-quantile",
    type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True),
    default=_SCHEDULER.keep_quantile,
    show_default=True,
    help="An idle session's prefix is kept (its lease) until this quantile of its predicted tool time, learned from "
    "the gaps between turns, and no longer than its break-even (--prefill-rate); then it may be let go when room is "
    "needed.",
)
@click.option(
    "--prefill-rate",
    type=click.FloatRange(min=0),
    default=_SCHEDULER.prefill_tokens_per_s,
    show_default=True,
    metavar="TOKENS_PER_S",
    help="The engines' prefill rate (an 8B model on an H100: about 40,000). An idle prefix is kept no longer than "
    "its re-prefill would stall its replica's generating turns (its break-even): short where contexts are small or "
    "the GPU fast. 0: the lease alone.",
)
@click.option(
    "--hold-limit",
    type=click.FloatRange(min=0),
    default=_SCHEDULER.hold_limit_s,
    show_default=True,
    metavar="SECONDS",
    help="A held turn is served after this long whatever the room (bounded wait).",
)
@click.option(
    "--time-scale",
    "engine_time_scale",
    type=click.FloatRange(min=0.001),
    default=1.0,
    show_default=True,
    help="Engine seconds per wall second, for time-scaled engine-sims: the scheduler's engine-time constants (the "
    "hold limit, the lease before tool times are learned, the fairness wait, the fast quarantine's window and hold) "
    "are divided by it, the prefill rate multiplied.",
)
@click.option("--no-turn-scheduling", is_flag=True, help="Place sessions only (caps, no held turns): for comparisons.")
@click.option(
    "--turn-scheduler",
    type=click.Choice(["thunderagent", "progress-ttl"]),
    default=None,
    hidden=True,
    help="A peer's turn scheduler in place of ours, for comparisons (docs/peers.md).",
)
@click.option(
    "--turn-scheduler-config", default=None, hidden=True, metavar="JSON", help="Its config fields as a JSON object."
)
@click.option("--cap", type=click.IntRange(min=0), default=None, help="Fixed live-session cap per replica.")
@click.option(
    "--cap-ceiling", type=click.IntRange(min=0), default=None, help="Hard limit on live sessions per replica."
)
@click.option("--idle-timeout", type=click.FloatRange(min=0.1), default=1800.0, show_default=True)
@click.option(
    "--no-infer-groups",
    is_flag=True,
    help="Know a GRPO group only from X-Session-Group, not from sessions opening with the same prompt.",
)
@click.option(
    "--no-implicit-sessions",
    is_flag=True,
    help="A generation request without a session id is a one-turn session, instead of continuing the conversation "
    "its prefix extends (docs/sessionless-clients.md).",
)
@click.option(
    "--implicit-idle-timeout",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="An implicit (sessionless) session idle this long is released.",
)
@click.option(
    "--implicit-max-entries",
    type=click.IntRange(min=1),
    default=65536,
    show_default=True,
    help="Most conversation-prefix digests remembered for sessionless clients (LRU; about 150 bytes each).",
)
@click.option(
    "--implicit-yield-after",
    type=click.IntRange(min=0),
    default=16,
    show_default=True,
    help="Sessionless requests sharing one prefix (a GRPO group) co-located with the first; later ones are "
    "placed by load.",
)
@click.option("--queue-max", type=click.IntRange(min=0), default=1024, show_default=True)
@click.option("--queue-timeout", type=click.FloatRange(min=0.01), default=30.0, show_default=True)
@click.option("--scrape-interval", type=click.FloatRange(min=0.05), default=1.0, show_default=True)
@click.option("--upstream-timeout", type=click.FloatRange(min=0.1), default=600.0, show_default=True)
@click.option(
    "--request-read-timeout",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="A request's whole body must arrive within this long; a slower one is answered 408.",
)
@click.option(
    "--renew-every",
    type=float,
    default=None,
    metavar="SECONDS",
    help="Prefix renewal: re-send the last context of a session idle this long with max_tokens=1 so the engine "
    "keeps its prefix cached. Off by default: each renewal re-sends a whole prompt, which costs the engine's "
    "API server tokenization CPU.",
)
@click.option(
    "--admin-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File holding the admin API's bearer token (/admin: replicas, drains, the engine control fan-out "
    "/admin/rl/CALL); a fleet's routers also authenticate forwarded requests with it. Unset: /admin is off.",
)
@click.option(
    "--allow-path",
    "allow_paths",
    multiple=True,
    metavar="PATH",
    help="Forward PATH on the data port too (repeatable), as an auxiliary request: no session, no queue. By "
    "default only inference, tokenize/render, models and health paths are served; engine control calls "
    "(/pause, /update_weights, ...) go through the admin fan-out.",
)
@click.option(
    "--state-path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Snapshot of the session table, loaded at start, so a restart keeps every session on its replica. "
    "Default: $XDG_STATE_HOME/rolloutpool/router-HOST-PORT.json (XDG_STATE_HOME defaults to ~/.local/state).",
)
@click.option("--no-state", is_flag=True, help="Keep no snapshot: a restart places every session again.")
@click.option(
    "--trace-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Record every session's turns (token counts, no text) as JSONL here; off by default (docs/trace.md).",
)
@click.option("--trace-max-bytes", type=click.IntRange(min=512), default=256 * 1024 * 1024, show_default=True)
@click.option("--trace-session-ids", type=click.Choice(["hashed", "raw"]), default="hashed", show_default=True)
@click.option(
    "--session-body-field",
    "session_body_fields",
    multiple=True,
    help="Body field (dotted) read for the session key when no header carries it, in order (repeatable). "
    "Default: session_params.session_id, session_id, user.",
)
# -- KV events (router/kv_events.py): an exact residency index per replica, off by default --
@click.option(
    "--kv-events",
    "kv_events",
    multiple=True,
    metavar="NAME=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]",
    help="Subscribe to this replica's KV events (vLLM --kv-events-config; repeatable).",
)
@click.option(
    "--kv-events-port",
    default=None,
    metavar="PORT[,REPLAY_PORT]",
    help="Subscribe to every other replica's KV events at this port of its URL's host.",
)
# -- one of N routers (cli/router_fleet.py) --
@click.option("--self-name", default=None, help="Fleet: this router's pod name (with --peer-selector).")
@click.option("--peer-selector", default=None, help="Fleet: label selector of the router pods (Kubernetes).")
@click.option("--self-url", default=None, help="Static fleet: this router's base URL (with --peer-urls).")
@click.option("--peer-urls", multiple=True, help="Static fleet: every router's base URL (comma-separated or repeated).")
@click.option(
    "--peer-probe-interval",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    metavar="SECONDS",
    help="Static fleet: probe every peer's /healthz this often; one silent for 2 probes leaves the ring (its engines "
    "and sessions go to the others) until it answers 2 in a row. 0: no probes.",
)
def router_command(
    ctx: click.Context,
    replicas: tuple[str, ...],
    discover_namespace: str | None,
    discover_selector: str | None,
    kubeconfig: str | None,
    pool: str | None,
    host: str,
    port: int,
    target: float,
    keep_quantile: float,
    prefill_rate: float,
    hold_limit: float,
    engine_time_scale: float,
    no_turn_scheduling: bool,
    turn_scheduler: str | None,
    turn_scheduler_config: str | None,
    cap: int | None,
    cap_ceiling: int | None,
    idle_timeout: float,
    no_infer_groups: bool,
    no_implicit_sessions: bool,
    implicit_idle_timeout: float,
    implicit_max_entries: int,
    implicit_yield_after: int,
    queue_max: int,
    queue_timeout: float,
    scrape_interval: float,
    upstream_timeout: float,
    request_read_timeout: float,
    renew_every: float | None,
    admin_token_file: Path | None,
    allow_paths: tuple[str, ...],
    state_path: Path | None,
    no_state: bool,
    trace_file: Path | None,
    trace_max_bytes: int,
    trace_session_ids: str,
    session_body_fields: tuple[str, ...],
    self_name: str | None,
    peer_selector: str | None,
    self_url: str | None,
    peer_urls: tuple[str, ...],
    peer_probe_interval: float,
    kv_events: tuple[str, ...],
    kv_events_port: str | None,
) -> None:
    """Serve the session router (placement, caps, quarantine, release, admission) in front of engines."""
    import logging  # noqa: PLC0415

    from rolloutpool.router import ReplicaSpec, RouterConfig, parse_replica, run_router  # noqa: PLC0415
    from rolloutpool.router.compat import CompatError, replica_name, translate  # noqa: PLC0415
    from rolloutpool.routing.implicit import ImplicitConfig  # noqa: PLC0415
    from rolloutpool.routing.sessionkey import DEFAULT_BODY_FIELDS  # noqa: PLC0415

    try:
        compat = translate(list(ctx.args))
    except CompatError as err:
        raise click.UsageError(str(err)) from err
    level = getattr(logging, (compat.log_level or "info").upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for flag, reason in compat.accepted:
        logging.getLogger("rolloutpool.router.compat").info("Ignored vllm-router flag flag=%s reason=%s", flag, reason)
    if trace_file is not None:
        _check_writable("--trace-file", trace_file)
    if no_state and state_path is not None:
        raise click.UsageError("give --state-path or --no-state, not both")
    if not no_state and state_path is None:
        state_path = _default_state(host, port)
    if bool(replicas or compat.worker_urls) == bool(discover_namespace):
        raise click.UsageError(
            "give --replica or --worker-urls (static) or --discover-namespace/--discover-selector, not both"
        )
    try:
        specs = tuple(parse_replica(r) for r in replicas)
        specs += tuple(ReplicaSpec(name=replica_name(url), url=url) for url in compat.worker_urls)
        settings: dict[str, Any] = {
            "replicas": specs,
            "discovery": discover_namespace is not None,
            "host": host,
            "port": port,
            "turns": None
            if no_turn_scheduling
            else _turns(
                target=target,
                keep_quantile=keep_quantile,
                prefill_rate=prefill_rate,
                hold_limit=hold_limit,
                scale=engine_time_scale,
            ),
            "quarantine": _quarantine(engine_time_scale),
            "turn_scheduler": turn_scheduler,
            "turn_scheduler_config": _json_object(turn_scheduler_config),
            "cap": cap,
            "cap_ceiling": cap_ceiling,
            "idle_timeout_s": idle_timeout,
            "infer_groups": not no_infer_groups,
            "implicit": None
            if no_implicit_sessions
            else ImplicitConfig(
                max_entries=implicit_max_entries, idle_timeout_s=implicit_idle_timeout, yield_after=implicit_yield_after
            ),
            "queue_max": queue_max,
            "queue_timeout_s": queue_timeout,
            "scrape_interval_s": scrape_interval,
            "upstream_timeout_s": upstream_timeout,
            "request_read_timeout_s": request_read_timeout,
            "renew_every_s": renew_every,
            "state_path": state_path,
            "trace_path": trace_file,
            "trace_max_bytes": trace_max_bytes,
            "trace_session_ids": trace_session_ids,
            "admin_token": admin_token_file.read_text().strip() if admin_token_file else None,
            "session_body_fields": session_body_fields or DEFAULT_BODY_FIELDS,
            "allowed_paths": frozenset(allow_paths),
        }
        if kv_events or kv_events_port:
            settings["kv_events"] = _kv_events_settings(kv_events, kv_events_port)
        settings.update(compat.overrides)  # a vllm-router flag wins over our default
        config = RouterConfig(**settings)
        _check_turn_scheduler(config)
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    if self_url or peer_urls or self_name or peer_selector:
        from rolloutpool.cli.router_fleet import run_fleet_member  # noqa: PLC0415

        run_fleet_member(
            config,
            self_name=self_name,
            peer_selector=peer_selector,
            self_url=self_url,
            peer_urls=peer_urls,
            peer_probe_interval=peer_probe_interval,
            kubeconfig=kubeconfig,
            namespace=discover_namespace,
            selector=discover_selector,
            pool=pool,
        )
        return
    if discover_namespace is None:
        if pool is not None:
            raise click.UsageError("--pool needs --discover-namespace")
        run_router(config)
        return
    from rolloutpool.kube.pods import PodWatch, api_client  # noqa: PLC0415
    from rolloutpool.kube.pools import PoolWatch  # noqa: PLC0415

    api = api_client(kubeconfig)
    pods = PodWatch(api, namespace=discover_namespace, selector=discover_selector or "")
    limits = PoolWatch(api, namespace=discover_namespace, name=pool).events if pool else None
    run_router(config, discovery=pods.events, limits=limits)


def _turns(
    *, target: float, keep_quantile: float, prefill_rate: float, hold_limit: float, scale: float
) -> WorkingSetConfig:
    """The turn scheduler's settings; its engine-time constants in wall seconds at the engines' time scale."""
    return WorkingSetConfig(
        target=target,
        limit=max(1.0, target),
        keep_quantile=keep_quantile,
        prefill_tokens_per_s=prefill_rate * scale if prefill_rate > 0 else None,  # engine tokens per wall second
        hold_limit_s=hold_limit / scale,
        keep_s=_SCHEDULER.keep_s / scale,
        fair_after_s=_SCHEDULER.fair_after_s / scale,
    )


def _quarantine(scale: float) -> QuarantineConfig:
    """The fast quarantine's thresholds; its window and hold are engine time, in wall seconds at the engines' scale
    (the simulator's replicas run at scale 1: ten engine seconds either way)."""
    default = QuarantineConfig()
    return replace(default, window_seconds=default.window_seconds / scale, hold_seconds=default.hold_seconds / scale)


def _kv_events_settings(endpoints: tuple[str, ...], port: str | None) -> KvEventsSettings:
    """``--kv-events`` and ``--kv-events-port`` as the router's settings (ValueError naming the flag)."""
    from rolloutpool.router.kv_sources import (  # noqa: PLC0415
        KvEventsSettings,
        parse_kv_events_endpoint,
        parse_kv_events_port,
    )

    ports: tuple[int | None, int | None] = (None, None) if not port else parse_kv_events_port(port)
    return KvEventsSettings(
        endpoints=tuple(parse_kv_events_endpoint(e) for e in endpoints), port=ports[0], replay_port=ports[1]
    )


def _check_turn_scheduler(config: RouterConfig) -> None:
    """A peer's turn scheduler and its config are checked before anything starts (ValueError)."""
    if config.turn_scheduler is not None:
        from rolloutpool.routing.peers.registry import make_scheduler  # noqa: PLC0415

        make_scheduler(config.turn_scheduler, config.turn_scheduler_config)


def _json_object(text: str | None) -> dict[str, Any] | None:
    """``--turn-scheduler-config``: a JSON object, or ValueError naming the flag."""
    if text is None:
        return None
    import json  # noqa: PLC0415

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--turn-scheduler-config: not JSON ({err})") from None
    if not isinstance(value, dict):
        raise ValueError("--turn-scheduler-config: must be a JSON object")
    return value
