"""vLLM's KV-event wire format, written once: engine-sim publishes it, the router's subscriber decodes it.

vLLM 0.32 (``vllm/distributed/kv_events.py``, enabled by ``--kv-events-config``) sends each
engine step's prefix-cache changes as one ZMQ multipart message ``(topic, seq, payload)`` on a
PUB socket: ``seq`` an 8-byte big-endian counter from 0, ``payload`` a msgpack
:class:`KVEventBatch` (an array ``[ts, events, data_parallel_rank]``) whose events are maps
tagged ``"type": "BlockStored" | "BlockRemoved" | "AllBlocksCleared"``, fields equal to their
default left out. An optional ROUTER socket (``replay_endpoint``) answers a request frame
holding an 8-byte start ``seq`` with every buffered ``(topic, seq, payload)`` from there,
then an end marker whose ``seq`` is -1.

The structs below carry the same names, types, defaults and options, so a batch encoded by
either side decodes on the other; ``tests/test_kv_events.py`` checks the encoding against the
bytes vLLM writes, and the vLLM tier (``e2e/test_vllm_kv_events_e2e.py``) decodes a real vLLM's
stream with them. Unknown fields are ignored when decoding (msgspec's default), as vLLM adds
optional ones between releases.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Final

import msgspec

__all__ = [
    "END_SEQ",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "ExternalBlockHash",
    "KVEventBatch",
    "KVEventsConfig",
    "decode_seq",
    "encode_seq",
]

MEDIUM_GPU: Final = "GPU"
"""The ``medium`` of the tier an engine computes from (vLLM reports it on the CPU backend too)."""

END_SEQ: Final = -1
"""``seq`` of the replay socket's end marker."""

ExternalBlockHash = bytes | int
"""A block's chain hash as published: a 64-bit int by default (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``)."""


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events: encoded as a map with ``"type"`` = the class name."""


class BlockStored(KVCacheEvent):
    """Full blocks of one request became cached in one step."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    """The block before the first (None: the first is a chain's first block)."""
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    """The request's session (vLLM: body ``session_id``, header ``X-Session-ID`` or ``vllm_xargs.session_id``)."""


class BlockRemoved(KVCacheEvent):
    """Cached blocks were evicted (vLLM sends one event per block)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was reset."""


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One step's events: ``[ts, events, data_parallel_rank]`` on the wire."""

    ts: float
    """Wall time of the step (seconds since the epoch)."""
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def encode_seq(seq: int) -> bytes:
    """A message's sequence frame (8 bytes, big-endian, signed for the end marker)."""
    return seq.to_bytes(8, "big", signed=True)


def decode_seq(frame: bytes) -> int:
    """The sequence number of a frame; ``ValueError`` unless it has 8 bytes."""
    if len(frame) != 8:
        raise ValueError(f"a sequence frame has 8 bytes, got {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


_CONFIG_TYPES: dict[str, tuple[type, ...]] = {
    "enable_kv_cache_events": (bool,),
    "publisher": (str,),
    "endpoint": (str,),
    "replay_endpoint": (str, type(None)),
    "buffer_steps": (int,),
    "hwm": (int,),
    "max_queue_size": (int,),
    "topic": (str,),
}


@dataclass(frozen=True)
class KVEventsConfig:
    """``--kv-events-config`` as vLLM 0.32 takes it (a JSON object; these fields and defaults)."""

    enable_kv_cache_events: bool = False
    publisher: str = ""
    """``zmq`` or ``null``; empty: ``zmq`` when enabled, else ``null`` (vLLM's rule)."""
    endpoint: str = "tcp://*:5557"
    """PUB socket: bound when it holds ``*`` or ``::`` (or is ipc/inproc), otherwise connected."""
    replay_endpoint: str | None = None
    """ROUTER socket answering replay requests (always bound); None: no replay."""
    buffer_steps: int = 10_000
    """Batches kept for replay."""
    hwm: int = 100_000
    """The PUB socket's send high-water mark (messages past it are dropped)."""
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if not self.publisher:
            object.__setattr__(self, "publisher", "zmq" if self.enable_kv_cache_events else "null")
        if self.publisher not in {"zmq", "null"}:
            raise ValueError(f"kv-events-config: publisher must be 'zmq' or 'null', got {self.publisher!r}")
        if self.buffer_steps < 1 or self.hwm < 0 or self.max_queue_size < 1:
            raise ValueError("kv-events-config: buffer_steps and max_queue_size must be >= 1, hwm >= 0")
        for name in ("endpoint", "replay_endpoint"):
            value = getattr(self, name)
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"kv-events-config: {name} {value!r} must be a tcp://, ipc:// or inproc:// address")

    @property
    def publishes(self) -> bool:
        """Whether events are published at all."""
        return self.enable_kv_cache_events and self.publisher == "zmq"

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        """The config from its JSON text; ``ValueError`` naming the problem."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"kv-events-config: not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("kv-events-config: must be a JSON object")
        unknown = sorted(set(data) - set(_CONFIG_TYPES))
        if unknown:
            raise ValueError(f"kv-events-config: unknown field(s) {', '.join(unknown)}")
        for name, value in data.items():
            expected = _CONFIG_TYPES[name]
            if not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected):
                raise ValueError(f"kv-events-config: {name} has the wrong type ({type(value).__name__})")
        return cls(**data)
