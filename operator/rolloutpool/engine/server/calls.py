"""One generation call of the engine simulator: its choices, final answer and stream events.

A call is ``n`` choices for each prompt of a (batched) request, numbered as vLLM numbers
them (``choice + n * prompt index``); each choice is one engine request (a
:class:`~rolloutpool.engine.server.runtime.Job`) and all of them share one wake-up
event. The answer shapes copy vLLM 0.32: the stream sends one event per generated
token and choice (the last token's event carries ``finish_reason``), chat streams
open with one role event per choice, ``return_token_ids`` adds ``token_ids`` (and
``prompt_token_ids`` on the first event), and usage counts each prompt once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rolloutpool.engine.model.logprobs import score_output, score_prompt
from rolloutpool.engine.model.tokenizer import detokenize
from rolloutpool.engine.server.logprob_shapes import chat_logprobs, completion_logprobs, prompt_logprobs
from rolloutpool.engine.server.protocol import GenerationParams, OpenAIError, parse_chat, parse_completion
from rolloutpool.engine.server.runtime import Job
from rolloutpool.engine.server.shapes import (
    SYSTEM_FINGERPRINT,
    Choice,
    chat_chunk,
    chat_response,
    completion_chunk,
    completion_response,
    usage,
    usage_chunk,
)

__all__ = ["Call", "StreamState", "final_body", "parse_call", "usage_of"]


@dataclass(eq=False)
class Call:
    """One HTTP generation call: its jobs (``n`` per prompt) share one wake-up event."""

    rid: str
    chat: bool
    params: GenerationParams
    jobs: list[Job] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    """The prompt of each job."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    score_seed: int = 0
    """Seeds the made-up log-probabilities (the server's seed: they belong to the model, not to the sampling)."""

    def logprobs(self, i: int, start: int, stop: int, *, text_offset: int = 0) -> dict[str, Any] | None:
        """Choice ``i``'s ``logprobs`` for its output tokens ``start:stop``; None when not asked for."""
        k = self.params.logprobs
        if k is None:
            return None
        scores = score_output(
            self.prompts[i], self.jobs[i].output_ids, k=k, seed=self.score_seed, start=start, stop=stop
        )
        as_ids = self.params.token_ids_as_strings
        if self.chat:
            return chat_logprobs(scores, top=k, as_ids=as_ids)
        return completion_logprobs(scores, as_ids=as_ids, text_offset=text_offset)

    def prompt_logprobs(self, i: int) -> list[dict[str, dict[str, Any]] | None] | None:
        """``prompt_logprobs`` of choice ``i``'s prompt; None when not asked for."""
        k = self.params.prompt_logprobs
        if k is None:
            return None
        return prompt_logprobs(score_prompt(self.prompts[i], k=k, seed=self.score_seed))


def parse_call(
    body: dict[str, Any], *, model: str, max_model_len: int, chat: bool
) -> tuple[list[list[int]], GenerationParams]:
    """The call's prompts and parameters, or an :class:`OpenAIError` as vLLM answers it."""
    if chat:
        ids, params = parse_chat(body)
        prompts = [ids]
    else:
        prompts, params = parse_completion(body)
    if params.model is not None and params.model != model:
        raise OpenAIError(404, f"The model `{params.model}` does not exist.", param="model")
    for ids in prompts:
        if len(ids) >= max_model_len:
            raise OpenAIError(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains "
                f"{len(ids)} input tokens, which exceeds this limit even without any output tokens. Please reduce "
                f"the length of the input prompt. (parameter=input_tokens, value={len(ids)})",
                param="input_tokens",
            )
    return prompts, params


def usage_of(call: Call, *, cached: int, details: bool, stream: bool = False) -> dict[str, Any]:
    """Usage of the whole call: each prompt once (not per choice), every choice's tokens."""
    prompt_tokens = sum(len(ids) for ids in call.prompts[:: call.params.n])
    return usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=sum(job.visible for job in call.jobs),
        cached_tokens=cached if details else None,
        stream=stream,
        created_cache_tokens=0 if call.chat else None,
    )


def final_body(call: Call, *, model: str, details: bool, created: int = 0) -> dict[str, Any]:
    """The non-streaming answer of a finished call (vLLM reports the cached tokens of the last choice it finished)."""
    rti = call.params.return_token_ids
    n = call.params.n
    prompt_scores = [call.prompt_logprobs(i) for i in range(0, len(call.jobs), n)]
    choices = [
        Choice(
            index=i,
            text=detokenize(job.output_ids[: job.visible]),
            finish_reason=job.finish_reason,
            token_ids=job.output_ids[: job.visible] if rti else None,
            prompt_token_ids=call.prompts[i] if rti and not call.chat else None,
            logprobs=call.logprobs(i, 0, job.visible),
            prompt_logprobs=prompt_scores[i // n],
        )
        for i, job in enumerate(call.jobs)
    ]
    cached = call.jobs[-1].request.cached_tokens
    use = usage_of(call, cached=cached, details=details)
    if call.chat:
        prompt_ids = call.prompts[0] if rti else None
        return chat_response(
            rid=call.rid,
            created=created,
            model=model,
            choices=choices,
            usage=use,
            prompt_token_ids=prompt_ids,
            prompt_logprobs=prompt_scores[0],
        )
    return completion_response(rid=call.rid, created=created, model=model, choices=choices, usage=use)


class StreamState:
    """What a call's stream has sent so far; yields the events due now (pure over the jobs' progress)."""

    def __init__(self, call: Call, *, model: str, created: int) -> None:
        self.call = call
        self.model = model
        self.created = created
        self.sent = [0] * len(call.jobs)
        self.done = [False] * len(call.jobs)
        self.text_offsets = [0] * len(call.jobs)
        """Completions' ``logprobs.text_offset`` of each choice's next token."""

    @property
    def ended(self) -> bool:
        """Every choice has sent its finish."""
        return all(self.done)

    def opening(self) -> list[dict[str, Any]]:
        """Chat streams open with one role event per choice (the first carries ``prompt_token_ids``)."""
        if not self.call.chat:
            return []
        return [self._chunk(i, [], None, role=True) for i in range(len(self.call.jobs))]

    def progress(self) -> list[dict[str, Any]]:
        """One event per token published since the last call; a choice's last event carries its finish."""
        events = []
        for i, job in enumerate(self.call.jobs):
            if self.done[i]:
                continue
            visible, done = job.visible, job.done
            if done and self.sent[i] == visible:  # nothing left to carry the finish: an empty event
                events.append(self._chunk(i, [], job.finish_reason, self._logprobs(i, visible, visible)))
            while self.sent[i] < visible:
                k = self.sent[i]
                finish = job.finish_reason if done and k == visible - 1 else None
                events.append(self._chunk(i, job.output_ids[k : k + 1], finish, self._logprobs(i, k, k + 1)))
                self.sent[i] = k + 1
            self.done[i] = done
        return events

    def usage_event(self, *, details: bool) -> dict[str, Any]:
        """The closing ``"choices": []`` event with usage (vLLM: the first answer's cached tokens)."""
        call = self.call
        obj = "chat.completion.chunk" if call.chat else "text_completion"
        use = usage_of(call, cached=call.jobs[0].request.cached_tokens, details=details, stream=True)
        return usage_chunk(rid=call.rid, obj=obj, created=self.created, model=self.model, usage=use)

    def _logprobs(self, i: int, start: int, stop: int) -> dict[str, Any] | None:
        logprobs = self.call.logprobs(i, start, stop, text_offset=self.text_offsets[i])
        if logprobs is not None and not self.call.chat and logprobs["tokens"]:
            self.text_offsets[i] = logprobs["text_offset"][-1] + len(logprobs["tokens"][-1])
        return logprobs

    def _chunk(
        self, i: int, ids: list[int], finish: str | None, logprobs: dict[str, Any] | None = None, *, role: bool = False
    ) -> dict[str, Any]:
        chunk = self._event(i, ids, finish, logprobs, role=role)
        if finish is not None and not self.call.params.include_usage:
            chunk["system_fingerprint"] = SYSTEM_FINGERPRINT  # vLLM stamps a choice's last event when no usage follows
        return chunk

    def _event(
        self, i: int, ids: list[int], finish: str | None, logprobs: dict[str, Any] | None, *, role: bool
    ) -> dict[str, Any]:
        call = self.call
        rti = call.params.return_token_ids
        if call.chat:
            delta = {"role": "assistant", "content": ""} if role else {"content": detokenize(ids)}
            return chat_chunk(
                rid=call.rid,
                created=self.created,
                model=self.model,
                finish_reason=finish,
                index=i,
                delta=delta,
                token_ids=ids if rti and not role else None,
                prompt_token_ids=call.prompts[0] if rti and role and i == 0 else None,
                opening=role,
                logprobs=logprobs,
            )
        return completion_chunk(
            rid=call.rid,
            created=self.created,
            model=self.model,
            finish_reason=finish,
            index=i,
            text=detokenize(ids),
            token_ids=ids if rti else None,
            prompt_token_ids=call.prompts[i] if rti and self.sent[i] == 0 else None,
            logprobs=logprobs,
        )
