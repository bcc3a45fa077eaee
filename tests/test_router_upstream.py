"""The data path's HTTP/1.1 client against real servers: framing, keep-alive, stale connections, timeouts, faults.

Raw asyncio servers send exactly the bytes a test scripts (chunked, close-delimited,
interim 100, a close while idle, silence, a cut mid-body); an aiohttp server checks
keep-alive reuse against a real HTTP stack.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from rolloutpool.router.upstream import UpstreamError, UpstreamPool
from routerkit import serve

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def raw_server(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server running ``script`` per connection; yields its URL and a list counting connections."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    return head, await reader.readexactly(length)


def pool(read_timeout_s: float = 5.0, idle_s: float = 4.0) -> UpstreamPool:
    return UpstreamPool(connect_timeout_s=2.0, read_timeout_s=read_timeout_s, idle_s=idle_s)


async def test_framings_chunked_length_close_and_interim() -> None:
    answers = [
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
    ]
    seen: list[tuple[bytes, bytes]] = []

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in answers:
            seen.append(await read_request(reader))
            for i in range(0, len(answer), 3):  # in small pieces: every parser state is crossed
                writer.write(answer[i : i + 3])
                await writer.drain()
            if b"Connection: close" in answer:
                return

    async with raw_server(script) as (url, connections):
        p = pool()
        bodies = []
        for i in range(4):
            resp = await p.request(url, "POST", f"/p{i}?q=1", [("X-Session-ID", "s")], b"body%d" % i)
            bodies.append((resp.status, await resp.read()))
            if i == 0:
                assert resp.header("x-a") == "1"
            resp.release()
        p.close()
    assert bodies == [(200, b"hello"), (200, b"abc"), (204, b""), (200, b"until the end")]
    assert len(connections) == 1  # one keep-alive connection for all four
    head, body = seen[1]
    assert head.startswith(b"POST /p1?q=1 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"X-Session-ID: s\r\n" in head
    assert body == b"body1"


async def test_a_connection_closed_while_idle_is_replaced_once() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        # then close without a word, as an engine's keep-alive timeout does

    async with raw_server(script) as (url, connections):
        p = pool()
        for _ in range(3):
            resp = await p.request(url, "POST", "/x", [], b"{}")
            assert (resp.status, await resp.read()) == (200, b"ok")
            resp.release()
            await asyncio.sleep(0.05)
        p.close()
    assert len(connections) == 3


async def test_silence_is_a_timeout_and_a_cut_or_refusal_an_upstream_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(2)

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()

    async with raw_server(silent) as (url, _):
        p = pool(read_timeout_s=0.2)
        with pytest.raises(TimeoutError):
            await p.request(url, "POST", "/x", [], b"{}")
    async with raw_server(cut) as (url, _):
        p = pool()
        resp = await p.request(url, "POST", "/x", [], b"{}")
        assert await resp.next_chunk() == b"partial"
        with pytest.raises(UpstreamError) as info:
            await resp.next_chunk()
        assert info.value.kind == "ServerDisconnectedError"
        resp.release()
    async with raw_server(silent) as (url, _):
        dead = url
    with pytest.raises(UpstreamError) as info:
        await pool().request(dead, "GET", "/", [], None)
    assert info.value.kind == "ClientConnectorError"


async def test_keep_alive_against_aiohttp_and_streams_in_pieces() -> None:
    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f"data: {i}\n\n".encode())
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    async def echo(request: web.Request) -> web.Response:
        return web.Response(
            body=await request.read(), headers={"X-Peer": str(request.transport.get_extra_info("peername"))}
        )

    app = web.Application(client_max_size=4 << 20)
    app.router.add_get("/stream", stream)
    app.router.add_post("/echo", echo)
    async with serve(app) as (url, _):
        p = pool()
        peers = set()
        big = bytes(range(256)) * 8192  # 2 MiB: pauses and resumes reading on the way
        for _ in range(3):
            resp = await p.request(url, "POST", "/echo", [("Content-Type", "application/octet-stream")], big)
            assert await resp.read() == big
            peers.add(resp.header("X-Peer"))
            resp.release()
        assert len(peers) == 1
        resp = await p.request(url, "GET", "/stream", [], None)
        chunks = []
        while chunk := await resp.next_chunk():
            chunks.append(chunk)
        resp.release()
        assert b"".join(chunks) == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"
        p.close()


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        (b"SPDY/3 200 OK\r\n\r\n", "BadHead"),
        (b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\nok", "BadHead"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\nok", "BadHead"),
        (b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (80 * 1024), "BadHead"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", "BadBody"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok and more", "BadBody"),
    ],
    ids=["not-http", "bad-status", "bad-length", "head-too-large", "bad-chunk-size", "more-than-length"],
)
async def test_a_malformed_answer_is_an_upstream_error_and_the_connection_is_dropped(answer: bytes, kind: str) -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(1)

    async with raw_server(script) as (url, _):
        p = pool()

        async def exchange() -> bytes:
            resp = await p.request(url, "POST", "/x", [], b"{}")
            return await resp.read()

        with pytest.raises(UpstreamError) as info:
            await exchange()
        assert info.value.kind == kind
        p.close()


async def test_a_head_answer_has_no_body_and_keeps_the_connection() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n")
            await writer.drain()

    async with raw_server(script) as (url, connections):
        p = pool()
        for _ in range(2):
            resp = await p.request(url, "HEAD", "/x", [], None)
            assert (resp.status, resp.header("content-length"), await resp.read()) == (200, "9", b"")
            resp.release()
        p.close()
    assert len(connections) == 1
