"""Router configuration: replicas, the turn scheduler, session headers, queue, loops, admin and state (frozen).

Every knob of ``rolloutpool router`` lives in :class:`RouterConfig`; nothing reads
the environment behind its back. Turns are scheduled by each replica's working set
(``turns``, :mod:`rolloutpool.routing.workingset`) over its reported KV capacity
(``vllm:cache_config_info``: ``num_gpu_blocks * block_size``); live-session caps are only ceilings
(``cap``, a replica's own ``ReplicaSpec.cap``, ``cap_ceiling``), combined with the operator's by
:func:`rolloutpool.routing.caps.effective_cap`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from rolloutpool.router.kv_sources import KvEventsSettings
from rolloutpool.routing.caps import CapRule
from rolloutpool.routing.implicit import ImplicitConfig
from rolloutpool.routing.limits import LedgerConfig
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.sessionkey import DEFAULT_BODY_FIELDS, parse_fields
from rolloutpool.routing.workingset import WorkingSet, WorkingSetConfig

__all__ = ["ReplicaSpec", "RouterConfig", "cap_rule", "ledger_config", "parse_replica"]


@dataclass(frozen=True)
class ReplicaSpec:
    """One engine replica behind the router."""

    name: str
    """Stable name (labels, admin API, snapshots)."""
    url: str
    """Base URL, e.g. ``http://10.0.0.7:8000`` (no trailing slash)."""
    cap: int | None = None
    """Fixed live-session cap of this replica; overrides ``RouterConfig.cap``."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"replica name {self.name!r} must be non-empty and contain no '/'")
        parts = urlsplit(self.url)
        if parts.scheme not in {"http", "https"} or not parts.netloc:
            raise ValueError(f"replica {self.name}: url {self.url!r} must be http(s)://host[:port]")
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.cap is not None and self.cap < 0:
            raise ValueError(f"replica {self.name}: cap must be >= 0")


def parse_replica(text: str) -> ReplicaSpec:
    """A replica from ``name=url`` (the command-line form)."""
    name, sep, url = text.partition("=")
    if not sep:
        raise ValueError(f"replica {text!r} must be written name=url")
    return ReplicaSpec(name=name.strip(), url=url.strip())


@dataclass(frozen=True)
class RouterConfig:
    """Everything ``rolloutpool router`` (or a test) sets on one router."""

    replicas: tuple[ReplicaSpec, ...]
    """The static replica list (empty when replicas come from discovery)."""
    discovery: bool = False
    """Replicas are added and removed at run time by a discovery source (Kubernetes pods)."""
    host: str = "127.0.0.1"
    port: int = 8080

    # -- turns and caps --------------------------------------------------------------
    turns: WorkingSetConfig | None = field(default_factory=WorkingSetConfig)
    """Turn-level scheduling by each replica's working set (:mod:`rolloutpool.routing.workingset`): turns held,
    idle prefixes kept or let go, new sessions admitted where their first context fits. None: off (only caps)."""
    turn_scheduler: str | None = None
    """A peer's turn scheduler in place of ours (``thunderagent``, ``progress-ttl``: :mod:`rolloutpool.routing.peers`,
    for comparisons); it places new sessions its own way and runs without our fast quarantine."""
    turn_scheduler_config: dict[str, Any] | None = None
    """Its config fields (e.g. ``{"interval_s": 0.5}``)."""
    cap: int | None = None
    """Fixed live-session cap per replica (a ceiling over the working set); ``None``: none."""
    cap_ceiling: int | None = None
    """Hard limit on live sessions per replica (``maxSessionsPerReplica``)."""
    co_locate_groups: bool = True
    """Prefer a replica already holding members of the session's group."""

    # -- sessions --------------------------------------------------------------------
    session_header: str = "X-Session-ID"
    group_header: str = "X-Session-Group"
    infer_groups: bool = True
    """A new session without a ``group_header`` joins the group of every session that opened with the same prompt
    (:func:`rolloutpool.routing.prefixkey.prompt_group`): a GRPO group's rollouts, which a replica's cache shares.
    Our turn scheduler only; a peer's (``turn_scheduler``) knows no groups but those its clients send."""
    final_header: str = "X-Session-Final"
    """``true`` on a request releases its session after the response."""
    session_body_fields: tuple[str, ...] = DEFAULT_BODY_FIELDS
    """Body fields (dotted) read for the session key, in order, when no ``session_header`` carries it."""
    implicit: ImplicitConfig | None = field(default_factory=ImplicitConfig)
    """Implicit sessions for generation requests without a session id, matched on their conversation prefix
    (:mod:`rolloutpool.routing.implicit`, docs/sessionless-clients.md); None (``--no-implicit-sessions``): each such
    request is a one-turn session."""
    idle_timeout_s: float = 1800.0
    """A session idle this long is released (the safety net, never the main path)."""
    expiry_interval_s: float = 5.0

    # -- admission queue -------------------------------------------------------------
    queue_max: int = 1024
    """New sessions that may wait for a slot; one more is a 429."""
    queue_timeout_s: float = 30.0
    """A new session waiting this long gets a 503."""
    retry_after_s: int = 2
    """``Retry-After`` of 429 and 503 answers."""

    # -- fast control loop -----------------------------------------------------------
    scrape_interval_s: float = 1.0
    scrape_timeout_s: float = 2.0
    unready_after_failures: int = 3
    """Consecutive failed scrapes after which a replica takes no new sessions."""
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    default_block_size: int = 16
    """Block size assumed until a replica's ``cache_config_info`` is scraped."""
    measure_streams: bool = True
    """Ask for ``include_usage`` on streams whose client did not, and drop that extra chunk."""
    allowed_paths: frozenset[str] = frozenset()
    """Paths the data port forwards besides its own list (:mod:`rolloutpool.routing.paths`), as auxiliary
    requests: ``--allow-path``. Engine control paths are otherwise reachable only through the admin fan-out."""
    api_key: str | None = field(default=None, repr=False)
    """vllm-router's ``--api-key``: clients of the data port and the session API must send it as a bearer token
    (``Authorization: Bearer KEY``), and the router sends it to the engines on its own requests. Never logged."""

    renew_every_s: float | None = None
    """Prefix renewal: a live session idle this long has its last context re-sent with ``max_tokens=1``
    so its cached blocks rejoin vLLM's free queue as the newest; ``None`` (default) is off. Each renewal
    re-sends a whole prompt, which costs the engine's API server tokenization CPU."""

    # -- upstream --------------------------------------------------------------------
    upstream_connect_timeout_s: float = 5.0
    upstream_timeout_s: float = 600.0
    """Longest silence of an upstream (before its headers, between chunks) before a 504."""
    max_body_bytes: int = 32 * 1024 * 1024
    request_read_timeout_s: float = 60.0
    """A request's whole body must arrive within this long, or it is answered 408 (a trickled body holds nothing)."""

    # -- admin, state, lifecycle -------------------------------------------------------
    admin_token: str | None = field(default=None, repr=False)
    """Bearer token of ``/admin``; ``None`` disables the admin API. Never logged."""
    state_path: Path | None = None
    """JSON snapshot of the session table, written atomically, loaded at start."""
    state_debounce_s: float = 1.0
    trace_path: Path | None = None
    """Record every session's turns as JSONL here (:mod:`rolloutpool.router.trace_writer`); ``None``: off."""
    trace_max_bytes: int = 256 * 1024 * 1024
    """The trace stops (with a ``stop`` line and a warning) before it grows past this."""
    trace_session_ids: Literal["hashed", "raw"] = "hashed"
    """``hashed`` (keyed, the key never written) or ``raw`` session and group ids in the trace."""
    shutdown_timeout_s: float = 10.0
    """In-flight requests get this long to finish on shutdown; the rest are cancelled."""

    # -- KV events (router/kv_events.py) -------------------------------------------------
    kv_events: KvEventsSettings | None = None
    """Subscribe to each replica's vLLM KV events: an exact residency index per replica; None: off."""

    def __post_init__(self) -> None:
        parse_fields(self.session_body_fields)  # raises ValueError on a malformed field name
        if self.admin_token is not None and not self.admin_token.strip():
            raise ValueError("admin_token: empty; give a non-empty token or none (admin API disabled)")
        self._check_data_port()
        if not self.replicas and not self.discovery:
            raise ValueError("replicas: at least one replica is required (or discovery)")
        names = [r.name for r in self.replicas]
        if len(set(names)) != len(names):
            raise ValueError(f"replicas: duplicate names in {names}")
        for name in ("cap", "cap_ceiling"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0")
        positive = (
            "idle_timeout_s",
            "expiry_interval_s",
            "queue_timeout_s",
            "scrape_interval_s",
            "scrape_timeout_s",
            "upstream_connect_timeout_s",
            "upstream_timeout_s",
            "request_read_timeout_s",
            "state_debounce_s",
            "shutdown_timeout_s",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.renew_every_s is not None and not self.renew_every_s > 0:
            raise ValueError(f"renew_every_s must be positive (seconds) or unset (off), got {self.renew_every_s}")
        if self.queue_max < 0 or self.retry_after_s < 0 or self.unready_after_failures < 1:
            raise ValueError("queue_max and retry_after_s must be >= 0, unready_after_failures >= 1")
        if self.max_body_bytes < 1024 or self.default_block_size < 1 or self.trace_max_bytes < 512:
            raise ValueError("max_body_bytes must be >= 1024, default_block_size >= 1 and trace_max_bytes >= 512")

    def _check_data_port(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key: empty; give a non-empty key or none (the data port is open)")
        for path in self.allowed_paths:
            if not path.startswith("/") or any(c.isspace() for c in path):
                raise ValueError(f"allowed path {path!r} must start with '/' and hold no blanks")

    def replica(self, name: str) -> ReplicaSpec | None:
        """The replica named ``name``, if configured."""
        return next((r for r in self.replicas if r.name == name), None)


def cap_rule(config: RouterConfig) -> CapRule:
    """How this router limits live sessions (the input of :func:`~rolloutpool.routing.caps.effective_cap`)."""
    return CapRule(fixed=config.cap, ceiling=config.cap_ceiling)


def ledger_config(config: RouterConfig, *, scheduler: WorkingSet | None = None) -> LedgerConfig:
    """The ledger settings of a router configuration (pure); ``scheduler``: a peer's turn scheduler in place of ours
    (then without our fast quarantine)."""
    return LedgerConfig(
        caps=cap_rule(config),
        quarantine=config.quarantine if scheduler is None else None,
        working_set=config.turns,
        scheduler=None if scheduler is None else (lambda: scheduler),
        queue_max=config.queue_max,
        default_block_size=config.default_block_size,
    )
