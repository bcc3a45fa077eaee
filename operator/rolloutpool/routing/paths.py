"""What the data port serves: every engine path the router forwards, by kind (pure; DESIGN section 12).

The router's data port is what trainers reach, so it forwards only what acts on one request:

- :attr:`PathKind.GENERATION`: the paths that run a turn of a rollout (completions, chat, vLLM's
  token-in/token-out generate, responses, messages). Only these create and account for
  sessions; they are placed under caps and may wait in the admission queue.
- :attr:`PathKind.AUXILIARY`: requests that do not run a rollout's turn (tokenize, detokenize, render,
  embeddings and pooling, version, a stored response). They never create a session, never queue and
  are never refused for capacity: they follow a live session's replica when they name one, else any
  ready replica.
- :attr:`PathKind.CONTROL`: vLLM's engine control calls (pause and resume, weight transfer and
  updates, cache resets, sleep, collective RPC, profiling, LoRA loading, elastic scaling). They act on
  a whole engine, so the data port refuses them (403, naming the admin fan-out); they are reachable
  through the authenticated admin API, ``/admin/rl/{call}``, which sends them to every ready engine.
- :attr:`PathKind.UNKNOWN`: anything else (404). A site that needs another path forwarded names it
  with ``rolloutpool router --allow-path PATH`` (:func:`classify`'s ``allowed``): it is then served as an
  auxiliary request (control paths too, at that site's own risk).
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum

__all__ = [
    "AUXILIARY_PATHS",
    "CONTROL_PATHS",
    "GENERATION_PATHS",
    "RESPONSE_PREFIX",
    "PathKind",
    "classify",
    "control_call",
    "refusal",
]


class PathKind(Enum):
    """What a data-port path is for."""

    GENERATION = "generation"
    AUXILIARY = "auxiliary"
    CONTROL = "control"
    UNKNOWN = "unknown"


GENERATION_PATHS = frozenset(
    (
        "/v1/completions",
        "/v1/chat/completions",
        "/inference/v1/generate",
        "/skyrl/v1/generate",
        "/v1/responses",
        "/v1/messages",
    )
)
"""Paths that run a turn of a rollout: sessions are placed, counted and measured on them."""

AUXILIARY_PATHS = frozenset(
    (
        "/tokenize",
        "/detokenize",
        "/v1/chat/completions/render",
        "/v1/completions/render",
        "/v1/messages/count_tokens",
        "/v1/embeddings",
        "/pooling",
        "/classify",
        "/score",
        "/v1/score",
        "/rerank",
        "/v1/rerank",
        "/v2/rerank",
        "/version",
        "/ping",
        "/load",
    )
)
"""Requests that run no rollout turn: never a session, never queued, never refused for capacity."""

RESPONSE_PREFIX = "/v1/responses/"
"""``GET /v1/responses/{id}`` and its ``/cancel``: a stored response, auxiliary (it follows its session)."""

CONTROL_PATHS = frozenset(
    (
        "/pause",
        "/resume",
        "/is_paused",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/update_weight_version",
        "/weight_info",
        "/reset_prefix_cache",
        "/reset_mm_cache",
        "/reset_encoder_cache",
        "/sleep",
        "/wake_up",
        "/is_sleeping",
        "/collective_rpc",
        "/start_profile",
        "/stop_profile",
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/scale_elastic_ep",
        "/is_scaling_elastic_ep",
        "/server_info",
        "/abort_requests",
    )
)
"""vLLM 0.32's engine control calls (several need ``VLLM_SERVER_DEV_MODE``): admin fan-out only."""


def classify(path: str, *, allowed: Collection[str] = ()) -> PathKind:
    """The kind of a data-port path (pure); ``allowed`` paths (the site's ``--allow-path``) are auxiliary."""
    if path in GENERATION_PATHS:
        return PathKind.GENERATION
    if (
        path in AUXILIARY_PATHS
        or path in allowed
        or (path.startswith(RESPONSE_PREFIX) and len(path) > len(RESPONSE_PREFIX))
    ):
        return PathKind.AUXILIARY
    if path in CONTROL_PATHS:
        return PathKind.CONTROL
    return PathKind.UNKNOWN


def control_call(call: str) -> str | None:
    """The engine path of an admin fan-out call (``pause``, ``v1/load_lora_adapter``), or None when unknown."""
    path = "/" + call.strip("/")
    return path if path in CONTROL_PATHS else None


def refusal(path: str, kind: PathKind) -> tuple[int, str]:
    """The data port's answer to a path it does not forward: (status, message) (pure)."""
    if kind is PathKind.CONTROL:
        call = path.lstrip("/")
        return 403, (
            f"{path} acts on whole engines and is not served on the router's data port. Send it to every engine "
            f"through the admin fan-out, POST /admin/rl/{call} with the admin bearer token "
            "(docs/migrating-from-vllm-router.md)."
        )
    return 404, (
        f"{path} is not an inference path the router serves. A site that needs it forwarded starts the router "
        f"with --allow-path {path}."
    )
