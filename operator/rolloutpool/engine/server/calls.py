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

from rolloutpool.engine.model.tokenizer import detokenize
from rolloutpool.engine.server.protocol import GenerationParams, OpenAIError, parse_chat, parse_completion
from rolloutpool.engine.server.runtime import Job
from rolloutpool.engine.server.shapes import (
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
    )


def final_body(call: Call, *, model: str, details: bool, created: int = 0) -> dict[str, Any]:
    """The non-streaming answer of a finished call (vLLM reports the last prompt's cached tokens)."""
    rti = call.params.return_token_ids
    choices = [
        Choice(
            index=i,
            text=detokenize(job.output_ids[: job.visible]),
            finish_reason=job.finish_reason,
            token_ids=job.output_ids[: job.visible] if rti else None,
            prompt_token_ids=call.prompts[i] if rti and not call.chat else None,
        )
        for i, job in enumerate(call.jobs)
    ]
    cached = call.jobs[-call.params.n].request.cached_tokens
    use = usage_of(call, cached=cached, details=details)
    if call.chat:
        prompt_ids = call.prompts[0] if rti else None
        return chat_response(
            rid=call.rid, created=created, model=model, choices=choices, usage=use, prompt_token_ids=prompt_ids
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
                events.append(self._chunk(i, [], job.finish_reason))
            while self.sent[i] < visible:
                k = self.sent[i]
                finish = job.finish_reason if done and k == visible - 1 else None
                events.append(self._chunk(i, job.output_ids[k : k + 1], finish))
                self.sent[i] = k + 1
            self.done[i] = done
        return events

    def usage_event(self, *, details: bool) -> dict[str, Any]:
        """The closing ``"choices": []`` event with usage (vLLM: the first answer's cached tokens)."""
        call = self.call
        obj = "chat.completion.chunk" if call.chat else "text_completion"
        use = usage_of(call, cached=call.jobs[0].request.cached_tokens, details=details, stream=True)
        return usage_chunk(rid=call.rid, obj=obj, created=self.created, model=self.model, usage=use)

    def _chunk(self, i: int, ids: list[int], finish: str | None, *, role: bool = False) -> dict[str, Any]:
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
        )
