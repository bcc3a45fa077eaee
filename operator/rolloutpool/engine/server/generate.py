"""``POST /inference/v1/generate`` on the engine simulator: token ids in, ``n`` choices of token ids out.

Each choice is one engine request (vLLM runs ``n`` child requests of one parent: the
later children find the first one's prompt blocks cached), all sharing one wake-up
event. The answer copies vLLM 0.32's (:mod:`rolloutpool.engine.server.rl_protocol`):
``logprobs`` in token mode carry ids and ranks, in text mode token strings;
``prompt_logprobs`` skip the prefix-cache lookup, as vLLM's do; a stream sends one
event per token and choice, ``weight_versions`` on each choice's last event, then the
usage event (if asked) and ``[DONE]``. Usage counts the prompt once; its
``cached_tokens`` are the last choice's in a whole answer and the first choice's in a
stream, as vLLM reports them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from rolloutpool.engine.model.logprobs import score_output, score_prompt
from rolloutpool.engine.model.tokenizer import detokenize, generate_ids
from rolloutpool.engine.server.logprob_shapes import chat_logprobs, generate_logprobs, prompt_logprobs
from rolloutpool.engine.server.protocol import SESSION_ID_HEADER, OpenAIError, parse_json_object
from rolloutpool.engine.server.rl_protocol import (
    GenerateParams,
    Span,
    generate_choice,
    generate_chunk,
    generate_response,
    generate_usage_chunk,
    parse_generate,
    salt_hash,
    weight_version_spans,
)
from rolloutpool.engine.server.runtime import EngineRunner, Job
from rolloutpool.engine.server.shapes import usage

__all__ = ["GenerateAPI"]

_log = logging.getLogger(__name__)

_POLL_S = 0.05


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data), status=status, content_type="application/json")


def _gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class GenerateAPI:
    """The generate handler of one simulated replica; the RL control keeps each job's weight-version spans."""

    def __init__(
        self,
        runner: EngineRunner,
        *,
        model: str,
        max_model_len: int,
        seed: int,
        details: bool,
        track: Callable[[Job], list[Span]],
        untrack: Callable[[Job], None],
    ) -> None:
        self.runner = runner
        self.model = model
        self.max_model_len = max_model_len
        self.seed = seed
        self.details = details
        """vLLM's ``--enable-prompt-tokens-details``: off, ``usage.prompt_tokens_details`` is null."""
        self._track = track
        self._untrack = untrack

    def _check(self, params: GenerateParams) -> None:
        if params.model is not None and params.model != self.model:
            raise OpenAIError(404, f"The model `{params.model}` does not exist.", param="model")
        max_num_seqs = self.runner.engine.config.max_num_seqs
        if params.n > max_num_seqs:
            raise OpenAIError(
                400,
                f"sampling_params.n must be at most the server's max_num_seqs ({max_num_seqs}), got {params.n}.",
            )
        if len(params.token_ids) >= self.max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, your request "
                f"has {len(params.token_ids)} input tokens.",
                param="token_ids",
            )

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """``POST /inference/v1/generate``."""
        try:
            params = parse_generate(parse_json_object(await request.read()))
            self._check(params)
        except OpenAIError as exc:
            return _json(exc.body(), status=exc.status)
        prompt = params.token_ids
        max_tokens = min(params.max_tokens, self.max_model_len - len(prompt))
        base_seed = self.seed if params.seed is None else hash((self.seed, params.seed))
        changed = asyncio.Event()
        jobs: list[Job] = []
        spans: list[list[Span]] = []
        for i in range(params.n):  # vLLM's child requests; choice i samples with its own seed
            seed = hash((base_seed, i)) if i else base_seed
            job = self.runner.submit(
                prompt,
                generate_ids(prompt, max_tokens, seed=seed),
                hash_parent=salt_hash(params.cache_salt),
                skip_cache_read=params.prompt_logprobs is not None,
                session_id=request.headers.get(SESSION_ID_HEADER) or None,  # vLLM's generate reads the header only
                cache_salt=params.cache_salt,
            )
            job.changed = changed
            jobs.append(job)
            spans.append(self._track(job))
        base_id = request.headers.get("X-Request-Id") or params.request_id or uuid.uuid4().hex
        rid = f"generate-tokens-{base_id}"  # vLLM's
        try:
            if params.stream:
                return await self._stream(request, params, jobs, spans, rid=rid, changed=changed)
            while not all(job.done for job in jobs):
                if not await self._wait(request, changed):
                    return web.Response(status=499)
            choices = [
                self._choice(params, i, job, start=0, stop=job.visible, spans=spans[i], final=True)
                for i, job in enumerate(jobs)
            ]
            plp = None
            if params.prompt_logprobs is not None:
                plp = prompt_logprobs(score_prompt(prompt, k=params.prompt_logprobs, seed=self.seed))
            answer = generate_response(
                rid=rid,
                created=int(time.time()),
                model=self.model,
                choices=choices,
                usage=self._usage(jobs, cached_from=jobs[-1]),
                prompt_ids=prompt if params.return_token_ids else None,
                prompt_logprobs=plp,
                text_mode=params.text_output,
            )
            return _json(answer)
        finally:
            for job in jobs:
                self.runner.abort(job)  # a no-op once the request finished
                self._untrack(job)

    def _choice(
        self, params: GenerateParams, i: int, job: Job, *, start: int, stop: int, spans: list[Span], final: bool
    ) -> dict[str, Any]:
        ids = job.output_ids[start:stop]
        logprobs = None
        if params.logprobs is not None:
            scores = score_output(
                params.token_ids, job.output_ids, k=params.logprobs, seed=self.seed, start=start, stop=stop
            )
            if params.text_output:
                logprobs = chat_logprobs(scores, top=max(params.logprobs, 1), as_ids=False)
            else:
                logprobs = generate_logprobs(scores, k=params.logprobs)
        return generate_choice(
            index=i,
            token_ids=ids,
            finish_reason=job.finish_reason if final else None,
            logprobs=logprobs,
            weight_versions=weight_version_spans(spans, job.visible) if final else None,
            text=detokenize(ids) if params.text_output else None,
        )

    def _usage(self, jobs: list[Job], *, cached_from: Job, stream: bool = False) -> dict[str, Any]:
        cached = cached_from.request.cached_tokens if self.details else None
        return usage(
            prompt_tokens=jobs[0].request.prompt_len,
            completion_tokens=sum(job.visible for job in jobs),
            cached_tokens=cached,
            stream=stream,
        )

    async def _wait(self, request: web.Request, changed: asyncio.Event) -> bool:
        while not changed.is_set():
            if _gone(request):
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_POLL_S):
                    await changed.wait()
        changed.clear()
        return True

    async def _stream(
        self,
        request: web.Request,
        params: GenerateParams,
        jobs: list[Job],
        spans: list[list[Span]],
        *,
        rid: str,
        changed: asyncio.Event,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)

        def event(data: dict[str, Any]) -> bytes:
            return f"data: {json.dumps(data)}\n\n".encode()

        prompt_ids = params.token_ids if params.return_token_ids else None
        sent = [0] * len(jobs)
        ended = [False] * len(jobs)
        try:
            while not all(ended):
                for i, job in enumerate(jobs):
                    if ended[i]:
                        continue
                    visible, done = job.visible, job.done
                    # one event per token; the last token's event (or an empty one) carries the finish
                    while sent[i] < visible or (done and not ended[i]):
                        stop = min(sent[i] + 1, visible)
                        final = done and stop == visible
                        choice = self._choice(params, i, job, start=sent[i], stop=stop, spans=spans[i], final=final)
                        await response.write(
                            event(
                                generate_chunk(
                                    rid=rid, choice=choice, prompt_ids=prompt_ids, text_mode=params.text_output
                                )
                            )
                        )
                        prompt_ids = None
                        sent[i] = stop
                        ended[i] = final
                if all(ended):
                    break
                if not await self._wait(request, changed):
                    return response
            if params.include_usage:
                use = self._usage(jobs, cached_from=jobs[0], stream=True)
                await response.write(event(generate_usage_chunk(rid=rid, usage=use, text_mode=params.text_output)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            _log.info("Lost streaming client request_id=%s", rid)
        return response
