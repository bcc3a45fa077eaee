"""Parse cost of one upstream response in the router's data-path client, without sockets.

``python -m rolloutpool.dev.bench.parse_cost [--repeat N]`` feeds recorded-looking
answers of a vLLM server into :class:`rolloutpool.router.upstream.UpstreamResponse`
(``data_received`` as the event loop would call it, then the body read back from its
queue) and prints the CPU microseconds per response (this thread's CPU time, which a
loaded machine disturbs far less than wall time), the median of ``--repeat`` timings.
It only uses the protocol's data path (``_reset``, ``data_received``, ``_chunks``), so
the same script measures any parser behind that interface: run it with ``PYTHONPATH``
on another checkout to compare. docs/datapath.md holds the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from rolloutpool.router.upstream import UpstreamPool, UpstreamResponse

__all__ = ["answers", "main", "parse_cost_us"]

_HEAD = (
    "HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 06:00:00 GMT\r\nserver: uvicorn\r\n"
    "content-type: {ctype}\r\n{framing}\r\n"
)


def answers() -> dict[str, list[bytes]]:
    """Each case as the list of reads the socket delivers (pure)."""
    completion = json.dumps(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": "m",
            "choices": [{"index": 0, "text": "word " * 100, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 24000, "completion_tokens": 100, "total_tokens": 24100},
        }
    ).encode()
    small = (
        _HEAD.format(ctype="application/json", framing=f"content-length: {len(completion)}\r\n").encode() + completion
    )
    events = [
        b"data: " + json.dumps({"id": "cmpl-1", "choices": [{"index": 0, "text": f"tok{i}"}]}).encode() + b"\n\n"
        for i in range(64)
    ] + [b"data: [DONE]\n\n"]
    chunked = [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]
    sse_head = _HEAD.format(ctype="text/event-stream", framing="transfer-encoding: chunked\r\n").encode()
    big_body = b"x" * (256 * 1024)
    big = _HEAD.format(ctype="application/json", framing=f"content-length: {len(big_body)}\r\n").encode() + big_body
    return {
        "json-1-read": [small],
        "sse-65-events": [sse_head + chunked[0], *chunked[1:]],
        "json-256k-5-reads": [big[i : i + 65536] for i in range(0, len(big), 65536)],
    }


def parse_cost_us(conn: UpstreamResponse, reads: list[bytes], *, number: int, repeat: int) -> float:
    """Median CPU microseconds (this thread's) to parse one answer delivered as ``reads`` and drain its body."""
    timings = []
    for _ in range(repeat):
        started = time.thread_time()
        for _ in range(number):
            conn._reset()
            for data in reads:
                conn.data_received(data)
            conn._chunks.clear()
        timings.append((time.thread_time() - started) * 1e6 / number)
    return statistics.median(timings)


async def _measure(number: int, repeat: int) -> dict[str, Any]:
    pool = UpstreamPool(connect_timeout_s=1.0, read_timeout_s=1.0)
    conn = UpstreamResponse(pool, ("127.0.0.1", 1, False))
    out: dict[str, Any] = {}
    for name, reads in answers().items():
        out[name] = round(parse_cost_us(conn, reads, number=number, repeat=repeat), 2)
        if conn._error is not None or conn._mode != "done":
            raise RuntimeError(f"{name}: not parsed whole ({conn._mode}, {conn._error})")
    return out


def main() -> None:
    """Print the per-response parse cost of each case, in microseconds, as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--number", type=int, default=2000, help="responses per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings; the median is printed")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_measure(args.number, args.repeat))))


if __name__ == "__main__":
    main()
