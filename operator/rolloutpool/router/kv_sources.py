"""Where each replica publishes its KV events: the router's ``--kv-events`` settings (no I/O).

``--kv-events NAME=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]`` names one replica's publisher
(and its replay socket); ``--kv-events-port PORT[,REPLAY_PORT]`` derives it for every other
replica, static or discovered, from the host of its URL. :mod:`rolloutpool.router.kv_events`
subscribes to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = ["KvEventSource", "KvEventsSettings", "parse_kv_events_endpoint", "parse_kv_events_port"]


@dataclass(frozen=True)
class KvEventSource:
    """Where one replica publishes."""

    endpoint: str
    """The PUB socket to connect to, ``tcp://host:port``."""
    replay_endpoint: str | None = None
    """Its replay (ROUTER) socket, or None."""


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def _check_endpoint(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.scheme not in {"tcp", "ipc", "inproc"} or (
        parts.scheme == "tcp" and (not parts.hostname or "*" in endpoint)
    ):
        raise ValueError(f"KV event endpoint {endpoint!r} must be tcp://host:port (or ipc://, inproc://) to connect to")
    if parts.scheme == "tcp":
        try:
            port = parts.port
        except ValueError:
            port = None
        if port is None:
            raise ValueError(f"KV event endpoint {endpoint!r} needs a port")
    return endpoint


def parse_kv_events_endpoint(text: str) -> tuple[str, KvEventSource]:
    """``NAME=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]`` (the command-line form)."""
    name, sep, rest = text.partition("=")
    if not sep or not name.strip() or not rest.strip():
        raise ValueError(f"--kv-events {text!r} must be NAME=tcp://HOST:PORT[,tcp://HOST:REPLAY_PORT]")
    pub, _, replay = rest.partition(",")
    return name.strip(), KvEventSource(
        endpoint=_check_endpoint(pub.strip()), replay_endpoint=_check_endpoint(replay.strip()) if replay else None
    )


def parse_kv_events_port(text: str) -> tuple[int, int | None]:
    """``PORT[,REPLAY_PORT]`` (the command-line form of :attr:`KvEventsSettings.port`)."""
    try:
        ports = [int(p) for p in text.split(",")]
    except ValueError:
        ports = []
    if len(ports) not in (1, 2) or not all(0 < p < 65536 for p in ports):
        raise ValueError(f"--kv-events-port {text!r} must be PORT or PORT,REPLAY_PORT (1-65535)")
    return ports[0], ports[1] if len(ports) == 2 else None


@dataclass(frozen=True)
class KvEventsSettings:
    """Which replicas' KV events the router subscribes to (off unless a field is set)."""

    endpoints: tuple[tuple[str, KvEventSource], ...] = ()
    """Replicas whose publisher is named explicitly (``--kv-events``)."""
    port: int | None = None
    """Every other replica: ``tcp://<its URL's host>:port`` (``--kv-events-port``)."""
    replay_port: int | None = None
    """With ``port``: the replay socket on the same host."""
    replay_timeout_s: float = 2.0
    """How long a replay may take before the missed batches count as lost."""

    def __post_init__(self) -> None:
        names = [name for name, _ in self.endpoints]
        if len(set(names)) != len(names):
            raise ValueError(f"--kv-events: a replica named twice in {names}")
        if self.replay_port is not None and self.port is None:
            raise ValueError("kv events: a replay port needs a port")
        if not self.replay_timeout_s > 0:
            raise ValueError("kv events: replay_timeout_s must be positive")

    def source(self, name: str, url: str) -> KvEventSource | None:
        """Where replica ``name`` (base URL ``url``) publishes, or None when it is not subscribed to (pure)."""
        explicit = dict(self.endpoints).get(name)
        if explicit is not None:
            return explicit
        host = urlsplit(url).hostname
        if self.port is None or not host:
            return None
        replay = None if self.replay_port is None else _tcp(host, self.replay_port)
        return KvEventSource(endpoint=_tcp(host, self.port), replay_endpoint=replay)
