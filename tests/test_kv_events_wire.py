"""vLLM's KV-event wire format (api/kv_events.py), --kv-events-config, and the router's --kv-events settings.

``data/vllm-0.32-kv-event-batch.hex`` is what vLLM 0.32.0's own classes
(``vllm.distributed.kv_events``) encode for the batch :func:`_batch` builds: two stores
(one with a session, one continuing it with extra keys), a removal and a reset, rank 0.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from rolloutpool.api.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVEventsConfig,
    decode_seq,
    encode_seq,
)
from rolloutpool.router.kv_sources import (
    KvEventSource,
    KvEventsSettings,
    parse_kv_events_endpoint,
    parse_kv_events_port,
)

VLLM_BYTES = bytes.fromhex((Path(__file__).parent / "data" / "vllm-0.32-kv-event-batch.hex").read_text().strip())


def _batch() -> KVEventBatch:
    big = 2**63 + 5  # an unsigned 64-bit hash, as vLLM publishes int hashes
    return KVEventBatch(
        ts=1700000000.25,
        events=[
            BlockStored(
                block_hashes=[1, big],
                parent_block_hash=None,
                token_ids=[1, 2, 3, 4],
                block_size=2,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                group_idx=0,
                session_id="s-1",
            ),
            BlockStored(
                block_hashes=[7],
                parent_block_hash=big,
                token_ids=[5, 6],
                block_size=2,
                lora_id=None,
                medium="GPU",
                lora_name=None,
                extra_keys=[("salt",)],
                group_idx=0,
            ),
            BlockRemoved(block_hashes=[1], medium="GPU", group_idx=0),
            AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )


def test_our_structs_encode_byte_for_byte_what_vllm_encodes() -> None:
    assert msgspec.msgpack.encode(_batch()) == VLLM_BYTES


def test_vllm_s_bytes_decode_into_our_structs() -> None:
    batch = msgspec.msgpack.Decoder(KVEventBatch).decode(VLLM_BYTES)
    assert batch == _batch()
    stored = batch.events[0]
    assert isinstance(stored, BlockStored)
    assert stored.session_id == "s-1"
    assert stored.extra_keys is None  # a default left out on the wire


def test_unknown_fields_of_a_later_release_are_ignored() -> None:
    raw = msgspec.msgpack.decode(VLLM_BYTES)
    raw[1][2]["new_field_of_a_later_vllm"] = [1, 2]
    batch = msgspec.msgpack.Decoder(KVEventBatch).decode(msgspec.msgpack.encode(raw))
    assert batch.events[2] == BlockRemoved(block_hashes=[1], medium="GPU", group_idx=0)


def test_sequence_frames_are_8_byte_big_endian() -> None:
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"
    assert decode_seq(encode_seq(-1)) == -1
    assert decode_seq(encode_seq(2**40)) == 2**40
    with pytest.raises(ValueError, match="8 bytes"):
        decode_seq(b"\x01")


def test_kv_events_config_reads_vllm_s_json() -> None:
    cfg = KVEventsConfig.parse('{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv"}')
    assert cfg.publishes
    assert (cfg.publisher, cfg.endpoint, cfg.replay_endpoint, cfg.buffer_steps, cfg.topic) == (
        "zmq",
        "tcp://*:5557",
        None,
        10_000,
        "kv",
    )
    assert not KVEventsConfig.parse("{}").publishes  # vLLM's default: off, publisher "null"
    assert not KVEventsConfig.parse('{"enable_kv_cache_events": true, "publisher": "null"}').publishes


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("not json", "not JSON"),
        ("[1]", "JSON object"),
        ('{"enable_kv_cache_events": true, "endpont": "tcp://*:1"}', "unknown field"),
        ('{"enable_kv_cache_events": 1}', "wrong type"),
        ('{"buffer_steps": true}', "wrong type"),
        ('{"publisher": "kafka"}', "publisher"),
        ('{"endpoint": "http://x:1"}', "endpoint"),
        ('{"buffer_steps": 0}', "buffer_steps"),
    ],
)
def test_a_bad_kv_events_config_names_the_problem(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        KVEventsConfig.parse(text)


def test_kv_events_settings_name_or_derive_each_replica_s_publisher() -> None:
    name, source = parse_kv_events_endpoint("r0=tcp://10.0.0.5:5557,tcp://10.0.0.5:5558")
    assert (name, source) == ("r0", KvEventSource("tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558"))
    settings = KvEventsSettings(endpoints=((name, source),), port=6000, replay_port=6001)
    assert settings.source("r0", "http://anything:1") == source
    assert settings.source("r1", "http://10.0.0.7:8000") == KvEventSource("tcp://10.0.0.7:6000", "tcp://10.0.0.7:6001")
    assert settings.source("r2", "http://[fd00::1]:8000") == KvEventSource(
        "tcp://[fd00::1]:6000", "tcp://[fd00::1]:6001"
    )
    assert KvEventsSettings(endpoints=((name, source),)).source("r1", "http://10.0.0.7:8000") is None
    assert parse_kv_events_port("5557") == (5557, None)
    assert parse_kv_events_port("5557,5558") == (5557, 5558)


@pytest.mark.parametrize(
    "text", ["r0", "=tcp://h:1", "r0=", "r0=tcp://*:5557", "r0=http://h:1", "r0=tcp://h", "r0=tcp://h:1,tcp://*:2"]
)
def test_a_bad_kv_events_endpoint_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"--kv-events|endpoint"):
        parse_kv_events_endpoint(text)


@pytest.mark.parametrize("text", ["", "x", "0", "70000", "1,2,3", "1,x"])
def test_a_bad_kv_events_port_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--kv-events-port"):
        parse_kv_events_port(text)


def test_kv_events_settings_refuse_contradictions() -> None:
    source = KvEventSource("tcp://h:1")
    with pytest.raises(ValueError, match="named twice"):
        KvEventsSettings(endpoints=(("r0", source), ("r0", source)))
    with pytest.raises(ValueError, match="replay port"):
        KvEventsSettings(replay_port=5)
