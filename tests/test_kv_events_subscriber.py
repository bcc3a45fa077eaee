"""The router's KV-event subscriber decides from sequence numbers what was missed (no sockets), and its flags.

Batches are encoded with the wire structs and handed to ``ReplicaKvEvents.receive`` as the
socket loop would; sources have no replay socket, so anything missed marks the index unreliable.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

from rolloutpool.api.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from rolloutpool.cli import main
from rolloutpool.router.kv_events import ReplicaKvEvents
from rolloutpool.router.kv_sources import KvEventSource, KvEventsSettings
from routerkit import captured_router_config

BS = 32


def _stored(hashes: list[int], parent: int | None, session: str | None = "s", **kw: Any) -> BlockStored:
    fields: dict[str, Any] = {
        "block_hashes": hashes,
        "parent_block_hash": parent,
        "token_ids": [1] * (BS * len(hashes)),
        "block_size": BS,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
        "session_id": session,
    }
    fields.update(kw)
    return BlockStored(**fields)


def _batch(*events: BlockStored | BlockRemoved | AllBlocksCleared) -> bytes:
    return msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=list(events), data_parallel_rank=0))


def _sub() -> ReplicaKvEvents:
    return ReplicaKvEvents("e0", KvEventSource("tcp://127.0.0.1:1"), block_size=16)


async def test_consecutive_batches_are_applied_and_the_block_size_comes_from_the_engine() -> None:
    sub = _sub()
    await sub.receive(0, _batch(_stored([1, 2], None)))
    await sub.receive(1, _batch(_stored([3], 2), BlockRemoved(block_hashes=[3], medium="GPU", group_idx=0)))
    assert sub.index.block_size == BS  # the router's default (16) was a guess; the events say 32
    assert sub.index.resident_tokens("s") == 2 * BS
    assert (sub.batches, sub.events, sub.gaps, sub.expected) == (2, 3, 0, 2)


async def test_a_gap_without_replay_marks_the_index_unreliable_until_a_reset() -> None:
    sub = _sub()
    await sub.receive(0, _batch(_stored([1], None)))
    await sub.receive(2, _batch(_stored([2], 1)))  # batch 1 was lost
    assert sub.gaps == 1
    assert sub.index.resident_tokens("s") is None
    await sub.receive(3, _batch(AllBlocksCleared(), _stored([1], None)))
    assert sub.index.resident_tokens("s") == BS


async def test_a_first_batch_other_than_0_means_the_subscriber_joined_late() -> None:
    sub = _sub()
    await sub.receive(7, _batch(_stored([1], None)))
    assert sub.gaps == 1
    assert not sub.index.reliable


async def test_a_publisher_that_starts_over_clears_the_index() -> None:
    sub = _sub()
    for seq in range(3):
        await sub.receive(seq, _batch(_stored([10 + seq], 10 + seq - 1 if seq else None)))
    assert sub.index.resident_tokens("s") == 3 * BS
    await sub.receive(0, _batch(_stored([50], None, session="t")))  # a new engine: its cache started empty
    assert (sub.restarts, sub.gaps) == (1, 0)
    assert sub.index.resident_tokens("s") == 0
    assert sub.index.resident_tokens("t") == BS
    await sub.receive(1, _batch(_stored([51], 50, session="t")))
    await sub.receive(0, _batch(_stored([60], None, session="u")))  # started over again
    assert sub.restarts == 2
    sub2 = _sub()
    for seq in range(5):
        await sub2.receive(seq, _batch(_stored([seq + 1], seq or None)))
    await sub2.receive(2, _batch(_stored([9], None)))  # started over, and its batches 0 and 1 were missed
    assert (sub2.restarts, sub2.gaps) == (1, 1)
    assert not sub2.index.reliable


async def test_other_cache_groups_and_tiers_are_not_indexed() -> None:
    sub = _sub()
    await sub.receive(0, _batch(_stored([1], None, group_idx=1), _stored([2], None, medium="CPU")))
    assert sub.ignored == 1
    assert sub.index.stats.ignored == 1
    assert sub.index.resident_tokens("s") is None


async def test_an_event_the_index_refuses_marks_it_unreliable() -> None:
    sub = _sub()
    await sub.receive(0, _batch(_stored([1], None)))
    await sub.receive(1, _batch(_stored([2], 1, block_size=16)))  # a partial-block entry: not exact
    assert sub.malformed == 1
    assert not sub.index.reliable
    await sub.receive(2, b"\x93\x00")  # a batch that does not decode
    assert sub.malformed == 2
    assert sub.expected == 3


def test_router_flags_configure_the_subscriptions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert captured_router_config(monkeypatch).kv_events is None  # off by default
    config = captured_router_config(
        monkeypatch, "--kv-events-port", "5557,5558", "--kv-events", "e9=tcp://10.0.0.9:6000"
    )
    settings = config.kv_events
    assert isinstance(settings, KvEventsSettings)
    assert settings.source("e0", "http://10.0.0.7:8000") == KvEventSource("tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558")
    assert settings.source("e9", "http://x:1") == KvEventSource("tcp://10.0.0.9:6000")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--kv-events", "e0"], "NAME=tcp://HOST:PORT"),
        (["--kv-events", "e0=tcp://*:5557"], "to connect to"),
        (["--kv-events-port", "x"], "PORT or PORT,REPLAY_PORT"),
    ],
)
def test_router_refuses_bad_kv_event_flags(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["router", "--replica", "e0=http://127.0.0.1:1", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_engine_sim_takes_vllm_s_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    from rolloutpool.engine.server import app  # noqa: PLC0415

    seen: dict[str, Any] = {}
    monkeypatch.setattr(app, "run_server", lambda config: seen.setdefault("config", config))
    flag = '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv"}'
    result = CliRunner().invoke(main, ["engine-sim", "--kv-events-config", flag])
    assert result.exit_code == 0, result.output
    assert seen["config"].kv_events.endpoint == "tcp://*:5557"
    assert seen["config"].kv_events.topic == "kv"
    bad = CliRunner().invoke(main, ["engine-sim", "--kv-events-config", '{"enable_kv_cache_events": "yes"}'])
    assert bad.exit_code == 2
    assert "wrong type" in bad.output
