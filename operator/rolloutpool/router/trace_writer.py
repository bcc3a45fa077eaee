"""The router's turn trace (``--trace-file``): lines buffered on the event loop, written by a thread, bounded.

The hot path only encodes a small dict and appends it to a list (:meth:`TraceWriter.write`); a
background task hands the buffer to a worker thread every ``flush_interval_s`` (or sooner once it
holds ``flush_bytes``), so no request ever waits on the disk. The size bound is counted when a
line is accepted: the file never grows past ``max_bytes``. The line that would cross it is replaced
by a ``stop`` line (the bound keeps room for it), a warning is logged once, and nothing more is
written: a trace is a complete prefix of what the router saw, never a rotated middle. Should the
disk fall behind by more than ``max_buffer_bytes``, lines are dropped and counted (logged once).

Session and group ids are hashed with a key drawn at start and never written, unless
``session_ids="raw"``. Format: :mod:`rolloutpool.routing.trace`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Literal

from rolloutpool.router.config import RouterConfig
from rolloutpool.routing.events import Usage
from rolloutpool.routing.trace import TraceRecorder, encode_line, keyed_hash

__all__ = ["TraceWriter", "trace_writer"]

_log = logging.getLogger(__name__)

_STOP_RESERVE = 128
"""Bytes kept free under the bound for the ``stop`` line."""


def _version() -> str:
    try:
        return version("rolloutpool")
    except PackageNotFoundError:  # pragma: no cover - a source tree without an install
        return "unknown"


class TraceWriter:
    """Records the router's turns into a JSONL file (see the module docstring)."""

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        now: float,
        session_ids: Literal["hashed", "raw"] = "hashed",
        max_model_len: int | None = None,
        flush_interval_s: float = 1.0,
        flush_bytes: int = 256 * 1024,
        max_buffer_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        if max_bytes < 4 * _STOP_RESERVE:
            raise ValueError(f"trace max_bytes must be at least {4 * _STOP_RESERVE}, got {max_bytes}")
        self.path = path
        self.max_bytes = max_bytes
        name = keyed_hash(os.urandom(16)) if session_ids == "hashed" else str
        self.recorder = TraceRecorder(started_at=now, name=name)
        self.flush_interval_s = flush_interval_s
        self.flush_bytes = flush_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.written = 0
        """Bytes accepted for the file (the bound counts these)."""
        self.dropped = 0
        """Lines dropped because the disk fell behind."""
        self.stopped = False
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._wake = asyncio.Event()
        self._lock = threading.Lock()  # a write cancelled on the loop may still run in its thread
        self._file = path.open("wb")  # a new trace per router start
        header = self.recorder.header(
            writer=_version(), clock="unix", session_ids=session_ids, max_model_len=max_model_len
        )
        self._accept(encode_line(header), now=now)
        _log.info("Started trace path=%s max_bytes=%d session_ids=%s", path, max_bytes, session_ids)

    # -- the hot path (event loop; never blocks) -------------------------------------------

    def arrived(self, session_id: str, *, now: float, group: str | None) -> None:
        """A request of the session was admitted (``now``: when it reached the router)."""
        if not self.stopped:
            self.recorder.arrived(session_id, now=now, group=group)

    def turn(self, session_id: str, *, replica: str, usage: Usage | None, now: float) -> None:
        """A request of the session ended (with the usage it carried, if any)."""
        if not self.stopped:
            line = self.recorder.turn(session_id, replica=replica, usage=usage, now=now)
            if line is not None:
                self._accept(encode_line(line), now=now)

    def released(self, session_id: str, *, how: str, now: float) -> None:
        """The session stopped being live."""
        if not self.stopped:
            line = self.recorder.released(session_id, how=how, now=now)
            if line is not None:
                self._accept(encode_line(line), now=now)

    def replica(self, name: str, *, capacity_tokens: int | None, block_size: int | None, now: float) -> None:
        """A replica's reported KV capacity (written when it changes)."""
        if not self.stopped:
            line = self.recorder.replica(name, capacity_tokens=capacity_tokens, block_size=block_size, now=now)
            if line is not None:
                self._accept(encode_line(line), now=now)

    def _accept(self, data: bytes, *, now: float) -> None:
        if self.written + len(data) > self.max_bytes - _STOP_RESERVE:
            self._stop(now=now)
            return
        if self._buffered + len(data) > self.max_buffer_bytes:
            if not self.dropped:
                _log.warning("Dropped trace lines path=%s: the disk fell behind", self.path)
            self.dropped += 1
            return
        self.written += len(data)
        self._push(data)

    def _stop(self, *, now: float) -> None:
        self.stopped = True
        self._push(encode_line(self.recorder.stopped(reason="max_bytes", now=now)))
        _log.warning(
            "Stopped trace path=%s max_bytes=%d written=%d: the size bound was reached, later turns are not recorded",
            self.path,
            self.max_bytes,
            self.written,
        )
        self._wake.set()

    def _push(self, data: bytes) -> None:
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered >= self.flush_bytes:
            self._wake.set()

    # -- the background writer ----------------------------------------------------------------

    def _take(self) -> bytes:
        data = b"".join(self._buffer)
        self._buffer.clear()
        self._buffered = 0
        return data

    def _write(self, data: bytes) -> None:
        with self._lock:
            self._file.write(data)
            self._file.flush()

    async def run(self) -> None:
        """Write the buffer from a worker thread, every ``flush_interval_s`` or when it fills."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.flush_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            data = self._take()
            if not data:
                continue
            try:
                await asyncio.to_thread(self._write, data)
            except OSError as err:  # a full or gone disk: stop tracing, never the router
                self.stopped = True
                _log.error("Stopped trace path=%s error=%s: the file could not be written", self.path, err)
                return

    async def close(self) -> None:
        """Write what is buffered and close the file (after :meth:`run` was cancelled); never raises."""
        data = self._take()
        try:
            await asyncio.to_thread(self._close, data)
        except OSError as err:
            _log.error("Failed to write trace path=%s error=%s", self.path, err)
        _log.info(
            "Closed trace path=%s bytes=%d stopped=%s dropped=%d", self.path, self.written, self.stopped, self.dropped
        )

    def _close(self, data: bytes) -> None:
        if data:
            self._write(data)
        with self._lock:
            self._file.close()

    def stats(self) -> dict[str, Any]:
        """For logs and tests."""
        return {"written": self.written, "stopped": self.stopped, "dropped": self.dropped}


def trace_writer(config: RouterConfig, *, now: float) -> TraceWriter:
    """The writer a router configuration asks for (``config.trace_path`` set)."""
    assert config.trace_path is not None  # noqa: S101 -- called only with tracing on
    return TraceWriter(
        config.trace_path,
        max_bytes=config.trace_max_bytes,
        now=now,
        session_ids=config.trace_session_ids,
    )
