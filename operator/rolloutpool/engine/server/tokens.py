"""Token endpoints of the engine simulator: ``/tokenize``, ``/detokenize`` and the render endpoints.

Generated ids and special tokens detokenize exactly (re-tokenizing gives them back); a
prompt word's id is a one-way hash of the word, so it renders as ``<tokN>``. The render
endpoints (``/v1/chat/completions/render`` with ``messages``, ``/v1/completions/render``
with ``prompt``) answer the prompt's ``token_ids`` and ``features`` (null: text only).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from rolloutpool.engine.model.tokenizer import token_text, tokenize
from rolloutpool.engine.server.protocol import OpenAIError, parse_chat, parse_json_object

__all__ = ["TokenAPI"]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


class TokenAPI:
    """Handlers of the token endpoints."""

    def __init__(self, *, max_model_len: int) -> None:
        self.max_model_len = max_model_len

    async def tokenize(self, request: web.Request) -> web.Response:
        """``POST /tokenize`` with ``prompt`` or ``messages``."""
        try:
            body = parse_json_object(await request.read())
            if "messages" in body:
                ids, _ = parse_chat(body)
            elif isinstance(body.get("prompt"), str):
                ids = tokenize(body["prompt"])
            else:
                raise OpenAIError(400, "Give prompt (a string) or messages.", param="prompt")
        except OpenAIError as exc:
            return _json(exc.body(), status=exc.status)
        return _json({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None})

    async def render(self, request: web.Request) -> web.Response:
        """``POST /v1/chat/completions/render`` (``messages``) and ``/v1/completions/render`` (``prompt``)."""
        try:
            body = parse_json_object(await request.read())
            if request.path.startswith("/v1/chat/"):
                ids, _ = parse_chat(body)
            elif isinstance(body.get("prompt"), str):
                ids = tokenize(body["prompt"])
            else:
                raise OpenAIError(400, "prompt must be a string.", param="prompt")
        except OpenAIError as exc:
            return _json(exc.body(), status=exc.status)
        return _json({"token_ids": ids, "features": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        """``POST /detokenize`` with ``tokens``."""
        try:
            body = parse_json_object(await request.read())
            tokens = body.get("tokens")
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise OpenAIError(400, "tokens must be a list of token ids.", param="tokens")
        except OpenAIError as exc:
            return _json(exc.body(), status=exc.status)
        return _json({"prompt": "".join(token_text(t) for t in tokens)})
