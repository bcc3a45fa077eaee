"""State across restarts: a JSON snapshot of the session table, written atomically.

Mechanism: after every change of the table a debounced writer serialises the live
sessions (id, replica, group, last_seen, context tokens, first prompt tokens: what a GRPO group shares; a
snapshot without the last is read as unknown; not one-turn sessions, nor sessions
whose release waits for their request to end) and the drained replicas
to ``state_path`` through a temporary file in the same directory, ``fsync`` and
``os.replace`` — a reader sees the old snapshot or the new one, never half of one.
A final snapshot is written on shutdown. At start the snapshot is loaded before
the router serves: each session is bound again to its replica, so live counts are
rebuilt from the sessions themselves (never added to anything, hence never double
counted); sessions of replicas no longer configured are dropped; idle expiry then
applies as usual. A missing file is a fresh start; an unreadable one is logged and
ignored (the router must start).

A crash loses at most the last ``state_debounce_s`` of changes: a session placed in
that window is placed again on its next turn (least-loaded, possibly elsewhere),
and one released in that window lingers until idle expiry.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolloutpool.router.sessions import SessionManager

__all__ = [
    "SNAPSHOT_VERSION",
    "SessionRecord",
    "SnapshotWriter",
    "default_state_path",
    "load_snapshot",
    "parse_snapshot",
    "snapshot",
]

_log = logging.getLogger(__name__)

SNAPSHOT_VERSION = 1


def default_state_path(*, host: str, port: int, env: Mapping[str, str]) -> Path:
    """Where ``rolloutpool router`` keeps its snapshot unless told (pure given ``env``).

    ``$XDG_STATE_HOME/rolloutpool/router-HOST-PORT.json``, else ``~/.local/state/rolloutpool/...``
    (the XDG base directory rules): one file per address, so two routers of one host never share one.
    """
    base = env.get("XDG_STATE_HOME", "").strip()
    root = (
        Path(base) if base and Path(base).is_absolute() else Path(env.get("HOME") or "~").expanduser() / ".local/state"
    )
    safe_host = "".join(c if c.isalnum() or c in ".-_" else "_" for c in host) or "any"
    return root / "rolloutpool" / f"router-{safe_host}-{port}.json"


@dataclass(frozen=True)
class SessionRecord:
    """One session as stored in a snapshot."""

    session_id: str
    replica: str
    group: str | None
    last_seen: float
    context_tokens: int
    prompt_tokens: int = 0
    """Its first turn's prompt (what its group shares; 0: unknown, or a snapshot without it)."""


def snapshot(manager: SessionManager, *, now: float) -> dict[str, Any]:
    """The snapshot document of the manager's table."""
    sessions = [
        [s.session_id, s.replica, s.group, round(s.last_seen, 3), s.context_tokens, s.prompt_tokens]
        for s in manager.table.sessions.values()
        if not s.one_turn and s.release_how is None  # both end with their request: restored, they would linger
    ]
    draining = sorted(r.name for r in manager.table.replicas.values() if r.draining)
    return {"version": SNAPSHOT_VERSION, "saved_at": now, "draining": draining, "sessions": sessions}


def parse_snapshot(document: Any, *, replicas: set[str]) -> tuple[list[SessionRecord], list[str], int]:
    """Records of the configured replicas, drained replicas, and how many sessions were dropped (pure).

    Raises ``ValueError`` when the document is not a snapshot of this version.
    """
    if not isinstance(document, dict) or document.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"not a version {SNAPSHOT_VERSION} router snapshot")
    records: list[SessionRecord] = []
    dropped = 0
    for row in document.get("sessions", []):
        sid, replica, group, last_seen, context, *rest = row
        prompt = rest[0] if len(rest) == 1 and isinstance(rest[0], int) else 0
        if not isinstance(sid, str) or not isinstance(replica, str) or not isinstance(last_seen, (int, float)):
            raise ValueError(f"malformed session row {row!r}")
        if replica not in replicas:
            dropped += 1
            continue
        group = group if isinstance(group, str) else None
        records.append(SessionRecord(sid, replica, group, last_seen, int(context), prompt))
    draining = [name for name in document.get("draining", []) if name in replicas]
    return records, draining, dropped


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(tmp).unlink()
        raise


def load_snapshot(manager: SessionManager, path: Path) -> int:
    """Restore the sessions of a snapshot into an empty manager; returns how many were restored."""
    try:
        document = json.loads(path.read_bytes())
        records, draining, dropped = parse_snapshot(document, replicas=set(manager.runtime))
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, TypeError) as exc:
        _log.warning("Ignored unreadable session snapshot path=%s error=%s", path, exc)
        return 0
    for record in records:
        manager.restore(
            record.session_id,
            record.replica,
            group=record.group,
            last_seen=record.last_seen,
            context=record.context_tokens,
            prompt=record.prompt_tokens,
        )
    for name in draining:
        manager.set_draining(name, True)
    _log.info("Restored sessions path=%s sessions=%d dropped=%d", path, len(records), dropped)
    return len(records)


class SnapshotWriter:
    """Writes the snapshot a short while after each change (debounced) and once more at shutdown."""

    def __init__(self, manager: SessionManager, path: Path, *, debounce_s: float) -> None:
        self.manager = manager
        self.path = path
        self.debounce_s = debounce_s
        self._dirty = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot")
        """One writer thread: writes land in the order they were taken, the final one last."""
        self.writes = 0

    def mark_dirty(self) -> None:
        """The table changed."""
        self._dirty.set()

    async def flush(self) -> None:
        """Write the snapshot now."""
        self._dirty.clear()
        data = json.dumps(snapshot(self.manager, now=self.manager.clock()), separators=(",", ":")).encode()
        await asyncio.get_running_loop().run_in_executor(self._executor, _write_atomic, self.path, data)
        self.writes += 1

    async def close(self) -> None:
        """Write the final snapshot and stop the writer thread."""
        try:
            await self.flush()
        except OSError as exc:
            _log.warning("Failed to write session snapshot path=%s error=%s", self.path, exc)
        finally:
            self._executor.shutdown(wait=True)

    async def run(self) -> None:
        """Write after changes, at most once per ``debounce_s`` (cancelled on shutdown)."""
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.debounce_s)
            try:
                await self.flush()
            except OSError as exc:
                _log.warning("Failed to write session snapshot path=%s error=%s", self.path, exc)
