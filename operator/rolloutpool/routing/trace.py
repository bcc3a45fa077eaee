"""The turn trace: what a router (or the simulator) saw of each session's turns, as versioned JSONL (pure).

One header line, then one line per event, each a JSON object with a ``kind``:

- ``header`` (first line, once): ``format`` (``rolloutpool-trace``), ``version``, the writer
  (``router_version``), ``clock`` (``unix``: wall seconds; ``virtual``: the simulator's), ``started_at``
  (the clock's reading at the start; every other time is seconds after it), ``session_ids``
  (``hashed`` or ``raw``), and ``model``/``max_model_len`` when known;
- ``turn``: a request of a session that was answered with usage: ``session``, ``turn`` (0 for the
  session's first), ``replica``, ``group`` (the client's, else the one the router named by the opening
  prompt), ``arrived`` (the request reached the router), ``ended`` (its answer was complete),
  ``prompt_tokens``, ``cached_tokens`` (``usage.prompt_tokens_details.cached_tokens``; null when the engine
  does not report it), ``output_tokens`` and ``tool_gap_s`` (``arrived`` minus the end of the session's previous turn;
  null on its first turn);
- ``replica``: a replica's reported KV capacity (``capacity_tokens``, ``block_size``), when first known or changed;
- ``release``: a session stopped being live (``how``: the release path, ``expired``, ...; ``turns``);
- ``stop``: the writer stopped (``reason``: ``max_bytes``); nothing follows it.

No prompt or output text is ever written, only counts. Session and group ids are hashed with a
key the writer keeps to itself (:func:`keyed_hash`) unless the trace is configured ``raw``.

:class:`TraceRecorder` turns the router's (or the simulator's) callbacks into lines;
:func:`encode_line` and :func:`read_trace` write and read them, the latter with pydantic
validation whose errors name the line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutpool.routing.events import Usage

__all__ = [
    "FORMAT",
    "VERSION",
    "ReleaseLine",
    "ReplicaLine",
    "StopLine",
    "Trace",
    "TraceError",
    "TraceHeader",
    "TraceRecorder",
    "TurnLine",
    "encode_line",
    "keyed_hash",
    "read_trace",
]

FORMAT = "rolloutpool-trace"
VERSION = 1


class _Line(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TraceHeader(_Line):
    """The first line of a trace."""

    kind: Literal["header"]
    format: Literal["rolloutpool-trace"]
    version: int = Field(ge=1)
    router_version: str
    """Who wrote it (the router's package version, or ``simulator``)."""
    clock: Literal["unix", "virtual"]
    started_at: float
    """The clock's reading when the trace started; every other time is seconds after it."""
    session_ids: Literal["hashed", "raw"]
    model: str | None = None
    max_model_len: int | None = Field(default=None, ge=1)


class TurnLine(_Line):
    """One answered turn of a session."""

    kind: Literal["turn"]
    session: str = Field(min_length=1)
    turn: int = Field(ge=0)
    replica: str
    group: str | None = None
    arrived: float = Field(ge=0)
    ended: float = Field(ge=0)
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int | None = Field(ge=0)
    output_tokens: int = Field(ge=0)
    tool_gap_s: float | None = Field(ge=0)


class ReleaseLine(_Line):
    """A session stopped being live."""

    kind: Literal["release"]
    session: str = Field(min_length=1)
    how: str
    at: float = Field(ge=0)
    turns: int = Field(ge=0)


class ReplicaLine(_Line):
    """A replica's reported KV capacity."""

    kind: Literal["replica"]
    name: str
    capacity_tokens: int | None = Field(ge=0)
    block_size: int | None = Field(ge=1)
    at: float = Field(ge=0)


class StopLine(_Line):
    """The writer stopped writing (its size bound); nothing follows."""

    kind: Literal["stop"]
    reason: str
    at: float = Field(ge=0)


_BODIES: dict[str, type[_Line]] = {"turn": TurnLine, "release": ReleaseLine, "replica": ReplicaLine, "stop": StopLine}


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line."""


@dataclass(frozen=True)
class Trace:
    """A whole trace, read and validated."""

    header: TraceHeader
    turns: tuple[TurnLine, ...]
    releases: tuple[ReleaseLine, ...]
    replicas: tuple[ReplicaLine, ...]
    stopped: StopLine | None


def encode_line(line: dict[str, Any]) -> bytes:
    """One trace line as compact UTF-8 JSON with its newline (orjson: about a microsecond, on the router's hot path)."""
    return orjson.dumps(line, option=orjson.OPT_APPEND_NEWLINE)


def _problem(number: int, error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "line"
    return f"line {number}: {where}: {first['msg']}"


def _parse(number: int, text: str, *, first: bool) -> _Line:
    """One line as its model; raises :class:`TraceError` naming the line."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceError(f"line {number}: not JSON: {err.msg}") from None
    if not isinstance(raw, dict):
        raise TraceError(f"line {number}: a trace line is a JSON object")
    kind = raw.get("kind")
    if first and kind != "header":
        raise TraceError(f"line {number}: the first line must be the header (kind 'header'), got {kind!r}")
    if first and raw.get("format") == FORMAT and isinstance(raw.get("version"), int) and raw["version"] > VERSION:
        raise TraceError(f"line {number}: trace version {raw['version']} is newer than this reader's {VERSION}")
    model = TraceHeader if first else _BODIES.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise TraceError(f"line {number}: unknown kind {kind!r}; expected one of {sorted(_BODIES)}")
    try:
        parsed = model.model_validate(raw)
    except ValidationError as err:
        raise TraceError(_problem(number, err)) from None
    if isinstance(parsed, TurnLine) and parsed.ended < parsed.arrived:
        raise TraceError(f"line {number}: ended {parsed.ended} is before arrived {parsed.arrived}")
    return parsed


def read_trace(lines: Iterable[str]) -> Trace:
    """Parse and validate a trace (pure: lines in, models out); raises :class:`TraceError` naming the line."""
    header: TraceHeader | None = None
    turns: list[TurnLine] = []
    releases: list[ReleaseLine] = []
    replicas: list[ReplicaLine] = []
    stopped: StopLine | None = None
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        if stopped is not None:
            raise TraceError(f"line {number}: a line after the 'stop' line")
        parsed = _parse(number, text, first=header is None)
        if isinstance(parsed, TraceHeader):
            header = parsed
        elif isinstance(parsed, TurnLine):
            turns.append(parsed)
        elif isinstance(parsed, ReleaseLine):
            releases.append(parsed)
        elif isinstance(parsed, ReplicaLine):
            replicas.append(parsed)
        elif isinstance(parsed, StopLine):
            stopped = parsed
    if header is None:
        raise TraceError("line 1: empty trace (no header)")
    return Trace(header=header, turns=tuple(turns), releases=tuple(releases), replicas=tuple(replicas), stopped=stopped)


def keyed_hash(key: bytes) -> Callable[[str], str]:
    """A function naming ids by a keyed BLAKE2b digest (16 hex digits): stable within one key, not reversible."""

    def name(value: str) -> str:
        return hashlib.blake2b(value.encode(), key=key, digest_size=8).hexdigest()

    return name


@dataclass
class _Live:
    name: str
    turns: int = 0
    group: str | None = None
    arrived: float | None = None
    last_end: float | None = None


@dataclass
class TraceRecorder:
    """Turns arrivals, answered turns and releases into trace lines (pure: times are passed in).

    Per live session it keeps the turn count, the pending arrival and the end of the last turn;
    a released session is forgotten (its id, used again, starts at turn 0).
    """

    started_at: float
    name: Callable[[str], str] = str
    """How a session or group id is written (:func:`keyed_hash`, or as given)."""
    _live: dict[str, _Live] = field(default_factory=dict)
    _capacity: dict[str, tuple[int | None, int | None]] = field(default_factory=dict)

    def header(self, *, writer: str, clock: Literal["unix", "virtual"], session_ids: Literal["hashed", "raw"],
               model: str | None = None, max_model_len: int | None = None) -> dict[str, Any]:  # fmt: skip
        """The header line."""
        return {
            "kind": "header",
            "format": FORMAT,
            "version": VERSION,
            "router_version": writer,
            "clock": clock,
            "started_at": round(self.started_at, 3),
            "session_ids": session_ids,
            "model": model,
            "max_model_len": max_model_len,
        }

    def _rel(self, now: float) -> float:
        return round(max(0.0, now - self.started_at), 6)

    def arrived(self, session_id: str, *, now: float, group: str | None = None) -> None:
        """A request of the session reached the router (kept until its turn ends; a retry keeps the first)."""
        live = self._live.get(session_id)
        if live is None:
            live = self._live[session_id] = _Live(self.name(session_id))
        if group is not None and live.group is None:
            live.group = self.name(group)
        if live.arrived is None:
            live.arrived = now

    def turn(self, session_id: str, *, replica: str, usage: Usage | None, now: float) -> dict[str, Any] | None:
        """The session's turn was answered: its line (None without usage: the pending arrival is dropped)."""
        live = self._live.get(session_id)
        if live is None:
            live = self._live[session_id] = _Live(self.name(session_id))
        arrived, live.arrived = (now if live.arrived is None else live.arrived), None
        if usage is None:
            return None
        gap = None if live.last_end is None else max(0.0, arrived - live.last_end)
        line = {
            "kind": "turn",
            "session": live.name,
            "turn": live.turns,
            "replica": replica,
            "group": live.group,
            "arrived": self._rel(arrived),
            "ended": self._rel(max(now, arrived)),
            "prompt_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "output_tokens": usage.completion_tokens,
            "tool_gap_s": None if gap is None else round(gap, 6),
        }
        live.turns += 1
        live.last_end = now
        return line

    def released(self, session_id: str, *, how: str, now: float) -> dict[str, Any] | None:
        """The session stopped being live: its line (None for a session never seen), and it is forgotten."""
        live = self._live.pop(session_id, None)
        if live is None:
            return None
        return {"kind": "release", "session": live.name, "how": how, "at": self._rel(now), "turns": live.turns}

    def replica(
        self, name: str, *, capacity_tokens: int | None, block_size: int | None, now: float
    ) -> dict[str, Any] | None:
        """A replica's reported KV capacity: its line when it is new or changed, else None."""
        if self._capacity.get(name) == (capacity_tokens, block_size):
            return None
        self._capacity[name] = (capacity_tokens, block_size)
        return {
            "kind": "replica",
            "name": name,
            "capacity_tokens": capacity_tokens,
            "block_size": block_size,
            "at": self._rel(now),
        }

    def stopped(self, *, reason: str, now: float) -> dict[str, Any]:
        """The last line of a trace whose writer stopped."""
        return {"kind": "stop", "reason": reason, "at": self._rel(now)}

    @property
    def live(self) -> int:
        """Sessions it keeps state for."""
        return len(self._live)
