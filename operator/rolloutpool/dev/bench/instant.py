"""An engine stand-in that answers at once, to measure router overhead.

``python -m rolloutpool.dev.bench.instant PORT``.

It reads each request body whole (as any engine must) but does not decode it, and
answers completions and chat completions with a fixed small JSON body carrying the
OpenAI ``usage`` object, so every router does its full accounting. ``/health``,
``/metrics`` (vLLM's names) and ``/v1/models`` make it look ready to every router.
The same stand-in is the "direct" target, so its own cost is in every figure alike.
"""

from __future__ import annotations

import sys

from aiohttp import web

from rolloutpool.api import vllm_metrics as vm

__all__ = ["build_app", "main"]

_ANSWER = (
    b'{"id":"cmpl-instant","object":"text_completion","created":1,"model":"m","choices":[{"index":0,'
    b'"text":" ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
)
_METRICS = f"{vm.NUM_REQUESTS_RUNNING} 0\n{vm.NUM_REQUESTS_WAITING} 0\n{vm.total(vm.NUM_PREEMPTIONS)} 0\n".encode()
_MODELS = b'{"object":"list","data":[{"id":"m","object":"model"}]}'


async def _health(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _models(_: web.Request) -> web.Response:
    return web.Response(body=_MODELS, content_type="application/json")


async def _metrics(_: web.Request) -> web.Response:
    return web.Response(body=_METRICS, content_type="text/plain")


async def _generate(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=_ANSWER, content_type="application/json")


def build_app() -> web.Application:
    """The stand-in's routes (request bodies up to 64 MiB)."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/completions", _generate)
    app.router.add_post("/v1/chat/completions", _generate)
    return app


def main(argv: list[str] | None = None) -> None:
    """Serve on 127.0.0.1:PORT until killed."""
    import uvloop  # noqa: PLC0415 - only the process that serves needs it

    args = sys.argv[1:] if argv is None else argv
    web.run_app(
        build_app(), host="127.0.0.1", port=int(args[0]), access_log=None, print=None, loop=uvloop.new_event_loop()
    )


if __name__ == "__main__":
    main()
