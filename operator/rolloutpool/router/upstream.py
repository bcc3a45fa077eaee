"""A lean HTTP/1.1 client for the data path: keep-alive connections to the replicas, bytes in, bytes out.

aiohttp's client costs more per request than everything else the router does
(URL objects, request and response objects, payload writers, timer contexts); the
data path needs much less: write one request whose bytes are already known, read
one response (``Content-Length``, chunked, or to the end), keep the connection for
the next request. :class:`UpstreamPool` does that on asyncio protocols. aiohttp's
client stays for everything off the hot path (scrapes, ``/v1/models``, renewals).

Timeouts: connecting is bounded by ``connect_timeout_s``; then the longest silence
of the replica (before the head, between body chunks) by ``read_timeout_s``, as
aiohttp's ``sock_read``: one timer per request, re-armed only when it fires.
A connection idle for ``idle_s`` is not reused (engines close idle keep-alive
connections, uvicorn after 5 s); a request whose reused connection was closed
before any answer byte arrived is sent once more on a new connection.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import ssl
from collections.abc import Sequence
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = ["UpstreamError", "UpstreamPool", "UpstreamResponse"]

_MAX_HEAD = 64 * 1024
_HIGH_WATER = 4 * 1024 * 1024


class UpstreamError(ConnectionError):
    """The replica could not be reached, or closed the connection before the answer was complete."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class UpstreamResponse(asyncio.Protocol):
    """One connection, carrying one response at a time (the protocol of its transport)."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool]) -> None:
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        # a fresh parser per request: a HEAD answer, an error or a close-delimited body leave llhttp mid-message
        self._parser = httptools.HttpResponseParser(self)
        self._mode = "head"  # head, body, close, done
        self._sized = False  # Content-Length or Transfer-Encoding seen: the body does not run to the end
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._keep_alive = True
        self._head_only = False
        self.received = 0

    # -- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # uvloop's is not an asyncio.Transport subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a request is written whole: never let Nagle hold its tail for an ACK
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        try:
            if self._mode == "done":
                raise UpstreamError("BadBody", "the replica sent data after its answer")
            self._parser.feed_data(data)
            if self._mode == "head" and self.received > _MAX_HEAD:
                raise UpstreamError("BadHead", "the replica's response head is too large")
        except UpstreamError as exc:
            self._fail(exc)
            self.close()
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, UpstreamError):
                self._fail(cause)
            else:
                kind = "BadHead" if self._mode == "head" else "BadBody"
                self._fail(UpstreamError(kind, f"malformed answer from the replica: {exc}"))
            self.close()
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("BadHead", "the replica switched protocols"))
            self.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._mode == "close":
            self._mode = "done"
        elif self._mode != "done":
            self._fail(UpstreamError("ServerDisconnectedError", "the replica closed the connection mid-answer"))
        self._wake()

    # -- llhttp's callbacks (httptools.HttpResponseParser) ------------------------------------

    def on_message_begin(self) -> None:
        if self._mode == "done":  # a second answer to one request: the replica is out of step
            raise UpstreamError("BadBody", "the replica sent data after its answer")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._mode != "head":  # a chunked body's trailer: not forwarded
            return
        self.headers.append((name.decode("latin-1"), value.decode("latin-1").strip()))
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding"):
            self._sized = True

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (100 Continue): llhttp parses the real head next
            self.headers = []
            self._sized = False
            return
        self.status = status
        self._keep_alive = self._parser.should_keep_alive()
        if self._head_only or status in (204, 304):
            self._mode = "done"
        elif self._sized:
            self._mode = "body"
        else:  # no length: the body runs to the end of the connection
            self._mode, self._keep_alive = "close", False

    def on_body(self, body: bytes) -> None:
        if self._mode == "done":  # after a HEAD answer, what llhttp takes for its body
            raise UpstreamError("BadBody", "the replica sent data after its answer")
        self._push(body)

    def on_message_complete(self) -> None:
        if self._mode in ("body", "close"):
            self._mode = "done"

    def _push(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered > _HIGH_WATER and self.transport is not None:
                self.transport.pause_reading()

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        self._waiter = self._pool.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    # -- the response, for the caller ---------------------------------------------------

    def header(self, name: str, default: str = "") -> str:
        """The first value of a response header (case-insensitive)."""
        lower = name.lower()
        return next((v for k, v in self.headers if k.lower() == lower), default)

    async def start(self) -> None:
        """Wait for the response's head."""
        while self._mode == "head":
            if self._error is not None:
                raise self._error
            await self._pool.waited(self)

    async def next_chunk(self) -> bytes:
        """The next body bytes; ``b""`` at the end of the body."""
        while True:
            if self._chunks:
                data = self._chunks.popleft()
                self._buffered -= len(data)
                if self._buffered <= _HIGH_WATER // 2 and self.transport is not None and not self.closed:
                    self.transport.resume_reading()
                return data
            if self._error is not None:
                raise self._error
            if self._mode == "done":
                return b""
            await self._pool.waited(self)

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.next_chunk():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        """Back to the pool when the answer was read whole on a keep-alive connection; closed otherwise."""
        if self._mode == "done" and self._keep_alive and not self.closed and self._error is None:
            self._pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        """Close the connection."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class UpstreamPool:
    """Keep-alive connections per replica address, reused last-in first-out."""

    def __init__(
        self, *, connect_timeout_s: float, read_timeout_s: float, idle_s: float = 4.0, max_idle: int = 512
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.idle_s = idle_s
        self.max_idle = max_idle
        self._idle: dict[tuple[str, int, bool], list[UpstreamResponse]] = {}
        self._addresses: dict[str, tuple[str, int, bool, str]] = {}
        self._ssl: ssl.SSLContext | None = None

    def _address(self, base_url: str) -> tuple[str, int, bool, str]:
        known = self._addresses.get(base_url)
        if known is None:
            parts = urlsplit(base_url)
            tls = parts.scheme == "https"
            host = parts.hostname or "127.0.0.1"
            port = parts.port or (443 if tls else 80)
            known = self._addresses[base_url] = (host, port, tls, parts.netloc)
        return known

    async def request(
        self, base_url: str, method: str, target: str, headers: Sequence[tuple[str, str]], body: bytes | None
    ) -> UpstreamResponse:
        """Send one request; returns its response once the head arrived (``release()`` it when done)."""
        host, port, tls, netloc = self._address(base_url)
        key = (host, port, tls)
        lines = [f"{method} {target} HTTP/1.1\r\nHost: {netloc}\r\n"]
        lines += [f"{name}: {value}\r\n" for name, value in headers]
        if body is not None or method not in {"GET", "HEAD", "DELETE", "OPTIONS"}:
            lines.append(f"Content-Length: {0 if body is None else len(body)}\r\n")
        lines.append("\r\n")
        head = "".join(lines).encode("utf-8", "surrogateescape")
        for attempt in range(2):
            conn, reused = self._take(key)
            if conn is None:
                conn = await self._connect(key)
            conn._reset()
            conn._head_only = method == "HEAD"
            if conn.transport is None:  # pragma: no cover - set by connection_made
                raise UpstreamError("ClientConnectorError", "no transport")
            if body:
                conn.transport.writelines((head, body))
            else:
                conn.transport.write(head)
            try:
                await conn.start()
            except UpstreamError:
                conn.close()
                if reused and conn.received == 0 and attempt == 0:
                    continue  # closed while idle, before it saw this request: once more on a new connection
                raise
            except BaseException:
                conn.close()
                raise
            return conn
        raise AssertionError("unreachable")  # pragma: no cover

    def _take(self, key: tuple[str, int, bool]) -> tuple[UpstreamResponse | None, bool]:
        idle = self._idle.get(key)
        now = self.loop.time()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_s:
                return conn, True
            conn.close()
        return None, False

    async def _connect(self, key: tuple[str, int, bool]) -> UpstreamResponse:
        host, port, tls = key
        if tls and self._ssl is None:
            self._ssl = ssl.create_default_context()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await self.loop.create_connection(
                    lambda: UpstreamResponse(self, key), host, port, ssl=self._ssl if tls else None
                )
        except TimeoutError:
            raise
        except OSError as exc:
            raise UpstreamError("ClientConnectorError", f"cannot connect to {host}:{port}: {exc}") from None
        return conn

    def put(self, conn: UpstreamResponse) -> None:
        """Keep a connection whose answer was read whole."""
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        idle.append(conn)

    async def waited(self, conn: UpstreamResponse) -> None:
        """Wait for the connection's next event; TimeoutError after ``read_timeout_s`` of silence."""
        before = (conn.received, conn._error, conn._mode)
        handle = self.loop.call_later(self.read_timeout_s, conn._wake)
        try:
            await conn._wait()
        finally:
            handle.cancel()
        if (conn.received, conn._error, conn._mode) == before:  # woken by the timer: the replica went silent
            conn.close()
            raise TimeoutError(f"no answer within {self.read_timeout_s:g} s")

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
