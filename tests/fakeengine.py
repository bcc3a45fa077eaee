"""A small, deterministic vLLM-like engine for the data-path tests (a real aiohttp server).

engine-sim answers completions and chat; this one answers vLLM's RL paths the way
vLLM 0.32 shapes them (``/inference/v1/generate`` token ids in and out, stream and
not, with the OpenAI ``usage`` object), plus ``/tokenize``, ``/detokenize``,
``/v1/responses`` (shaped as vLLM's when asked with ``max_output_tokens``, stream and
not; else an echo), render, SkyRL's generate and any other path (an echo), and 404
for ``/missing/...``. Every request is recorded with its raw bytes and headers, and
every answer is a pure function of the request, so a test can compare what came
through the router with what the engine sends directly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeEngine", "Received"]

FINGERPRINT = "fp_test_0001"


@dataclass(frozen=True)
class Received:
    """One request as the engine saw it."""

    method: str
    path_qs: str
    body: bytes
    headers: dict[str, str]


@dataclass
class FakeEngine:
    """Deterministic answers; ``cached_tokens`` is what the next generate reports as cached."""

    name: str
    cached_tokens: int = 0
    received: list[Received] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_route("*", "/missing/{tail:.*}", self.missing)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        return app

    async def _record(self, request: web.Request) -> bytes:
        raw = await request.read()
        self.received.append(Received(request.method, request.path_qs, raw, dict(request.headers)))
        return raw

    async def metrics(self, _: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_waiting 0.0\nvllm:num_preemptions_total 0.0\n")

    async def missing(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.Response(status=404, text='{"detail":"Not Found"}', content_type="application/json")

    async def echo(self, request: web.Request) -> web.Response:
        return self._echo(request, await self._record(request))

    def _echo(self, request: web.Request, raw: bytes) -> web.Response:
        answer = {"engine": self.name, "method": request.method, "path": request.path_qs, "bytes": len(raw)}
        return web.json_response(answer, headers={"X-Engine-Header": "kept"})

    def usage(self, prompt: int, completion: int) -> dict[str, Any]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API's shape: ``input_tokens`` one per four characters of ``input`` plus one,
        ``output_tokens`` = ``max_output_tokens``; the stream's ``response.completed`` event nests the response."""
        raw = await self._record(request)
        body = json.loads(raw)
        if "max_output_tokens" not in body:
            return self._echo(request, raw)
        prompt = len(str(body.get("input", ""))) // 4 + 1
        n = int(body["max_output_tokens"])
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + n,
        }
        answer = {"id": "resp_1", "object": "response", "status": "completed", "output": [], "usage": usage}
        if body.get("stream") is not True:
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        events = [
            ("response.created", {"response": {**answer, "status": "in_progress", "usage": None}}),
            ("response.output_text.delta", {"delta": "a", "output_index": 0}),
            ("response.completed", {"response": answer}),
        ]
        for seq, (kind, data) in enumerate(events):
            event = json.dumps({"type": kind, "sequence_number": seq, **data})
            await response.write(f"event: {kind}\ndata: {event}\n\n".encode())
        await response.write_eof()
        return response

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await self._record(request)
        body = json.loads(raw)
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not ids:
            error = {"message": "token_ids: Field required", "type": "BadRequestError", "param": None, "code": 400}
            return web.json_response({"error": error}, status=400)
        n = int(body.get("sampling_params", {}).get("max_tokens", 4))
        out = [(sum(ids) + i) % 50000 for i in range(n)]
        if body.get("stream") is True:
            return await self._stream(request, body, ids, out)
        answer = {
            "request_id": "gen-1",
            "model": "fake",
            "created": 1,
            "prompt_token_ids": ids if body.get("return_token_ids") else None,
            "choices": [{"index": 0, "finish_reason": "length", "token_ids": out, "logprobs": None}],
            "usage": self.usage(len(ids), n),
        }
        return web.json_response(answer)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], ids: list[int], out: list[int]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Engine-Header": "kept"})
        await response.prepare(request)
        options = body.get("stream_options")
        include = isinstance(options, dict) and options.get("include_usage") is True
        for i, token in enumerate(out):
            last = i == len(out) - 1
            chunk = {
                "request_id": "gen-1",
                "system_fingerprint": FINGERPRINT,
                "choices": [{"index": 0, "token_ids": [token], "finish_reason": "length" if last else None}],
            }
            # as vLLM (exclude_unset): no "usage" key in the text chunks, only in the final usage chunk
            # odd but valid spacing, so that re-encoding anywhere would show
            await response.write(f"data:  {json.dumps(chunk, separators=(', ', ' : '))}\n\n".encode())
        if include:
            final = {"request_id": "gen-1", "choices": [], "usage": self.usage(len(ids), len(out))}
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
