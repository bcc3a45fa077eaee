"""The residency index from KV events (routing/residency.py): cases by hand, then random event streams.

The random streams come from a small model of an engine: each turn a session's context is its
previous one cut somewhere and grown by new blocks; the engine hits the leading cached blocks
and stores the rest (in chunks, sometimes from earlier than the hit: a second physical copy),
with or without the session's id; evictions remove one copy of any cached block; resets clear
all. After every step each session's resident tokens must equal the leading blocks of its
latest stored context that the model holds cached.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rolloutpool.routing.residency import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ResidencyIndex,
)

BS = 16


def _index(*, max_blocks: int = 1 << 21, forget_horizon: int = 1024) -> ResidencyIndex:
    return ResidencyIndex(block_size=BS, max_blocks=max_blocks, forget_horizon=forget_horizon)


def _reliable(idx: ResidencyIndex) -> bool:
    return idx.reliable  # a call, so mypy does not narrow it across the events in between


def test_a_session_s_stored_blocks_are_resident_until_one_is_removed() -> None:
    idx = _index()
    assert idx.resident_tokens("a") is None  # no event named it yet
    idx.stored(block_hashes=[1, 2, 3], parent_hash=None, session_id="a")
    assert idx.resident_tokens("a") == 3 * BS
    idx.stored(block_hashes=[4], parent_hash=3, session_id="a")  # the next step of the same request
    assert idx.resident_tokens("a") == 4 * BS
    idx.removed(block_hashes=[4])
    assert idx.resident_tokens("a") == 3 * BS
    idx.removed(block_hashes=[1])  # the first block gone: nothing after it is a hit
    assert idx.resident_tokens("a") == 0
    assert idx.context_blocks("a") == 4


def test_removal_in_the_middle_stops_the_resident_prefix_there() -> None:
    idx = _index()
    idx.stored(block_hashes=[1, 2, 3, 4, 5], parent_hash=None, session_id="a")
    idx.removed(block_hashes=[3])
    assert idx.resident_tokens("a") == 2 * BS
    idx.removed(block_hashes=[5])
    assert idx.resident_tokens("a") == 2 * BS
    assert idx.is_resident(4)
    assert not idx.is_resident(3)


def test_re_store_after_removal_restores_the_prefix_as_far_as_it_reaches() -> None:
    idx = _index()
    idx.stored(block_hashes=[1, 2, 3, 4], parent_hash=None, session_id="a")
    idx.removed(block_hashes=[4])
    idx.removed(block_hashes=[3])
    assert idx.resident_tokens("a") == 2 * BS
    # the next turn hits blocks 1-2 and re-prefills 3, then its new tokens fill 4' (a new branch)
    idx.stored(block_hashes=[3, 40], parent_hash=2, session_id="a")
    assert idx.resident_tokens("a") == 4 * BS
    assert idx.context_blocks("a") == 4
    assert not idx.owners(4)  # the old tail is no longer the session's context
    # a re-store deeper in the chain while an earlier block is missing counts from the gap only
    idx.removed(block_hashes=[2])
    assert idx.resident_tokens("a") == 1 * BS
    idx.stored(block_hashes=[2], parent_hash=1, session_id=None)  # someone else re-computed block 2
    assert idx.resident_tokens("a") == 4 * BS


def test_a_group_shares_its_prompt_blocks_and_each_member_continues_them() -> None:
    idx = _index()
    idx.stored(block_hashes=[1, 2, 3], parent_hash=None, session_id="a")  # the group's prompt, by its first
    idx.stored(block_hashes=[10, 11], parent_hash=3, session_id="a")
    # b hit the prompt (no event) and stored only its own continuation: traced through the parents
    idx.stored(block_hashes=[20], parent_hash=3, session_id="b")
    idx.stored(block_hashes=[30, 31, 32], parent_hash=2, session_id="c")  # c diverged inside the prompt
    assert (idx.resident_tokens("a"), idx.resident_tokens("b"), idx.resident_tokens("c")) == (5 * BS, 4 * BS, 5 * BS)
    assert idx.owners(2) == {"a", "b", "c"}
    assert idx.owners(3) == {"a", "b"}
    idx.removed(block_hashes=[3])
    assert (idx.resident_tokens("a"), idx.resident_tokens("b"), idx.resident_tokens("c")) == (2 * BS, 2 * BS, 5 * BS)
    idx.forget("a")  # released: the shared blocks stay cached, and the others keep them
    assert idx.resident_tokens("a") is None
    idx.stored(block_hashes=[3], parent_hash=2, session_id="b")  # b's next turn re-prefills from block 3
    assert idx.resident_tokens("b") == 3 * BS  # its context is now the one its latest request stored
    idx.stored(block_hashes=[20, 21], parent_hash=3, session_id="b")
    assert idx.resident_tokens("b") == 5 * BS
    assert idx.owners(1) == {"b", "c"}


def test_a_member_whose_group_prompt_was_stored_by_a_released_session_is_still_traced() -> None:
    idx = _index()
    idx.stored(block_hashes=[1, 2], parent_hash=None, session_id="a")
    idx.forget("a")
    idx.stored(block_hashes=[5], parent_hash=2, session_id="b")
    assert idx.resident_tokens("b") == 3 * BS


def test_duplicate_copies_keep_a_block_resident_until_each_is_removed() -> None:
    idx = _index()
    idx.stored(block_hashes=[1, 2], parent_hash=None, session_id="a")
    idx.stored(block_hashes=[1, 2], parent_hash=None, session_id="b")  # computed at the same time: a second copy
    idx.removed(block_hashes=[2])
    assert idx.resident_tokens("a") == 2 * BS == idx.resident_tokens("b")
    idx.removed(block_hashes=[2])
    assert idx.resident_tokens("a") == BS
    idx.removed(block_hashes=[2])  # one removal too many: counted, nothing else changes
    assert idx.stats.unknown_removals == 1
    assert idx.resident_tokens("a") == BS


def test_cleared_empties_the_cache_and_makes_an_invalidated_index_exact_again() -> None:
    idx = _index()
    idx.stored(block_hashes=[1, 2], parent_hash=None, session_id="a")
    idx.invalidate()
    assert idx.resident_tokens("a") is None
    assert not _reliable(idx)
    idx.stored(block_hashes=[3], parent_hash=2, session_id="a")  # continues its own chain: still known
    assert idx.resident_tokens("a") is None
    idx.apply([AllBlocksCleared()])
    assert _reliable(idx)
    assert idx.resident_tokens("a") == 0  # exact again: nothing is cached
    assert idx.context_blocks("a") == 3
    idx.stored(block_hashes=[1, 2, 3], parent_hash=None, session_id="a")
    assert idx.resident_tokens("a") == 3 * BS
    idx.cleared()
    assert idx.resident_tokens("a") == 0
    assert idx.stats.blocks == 0
    idx.stored(block_hashes=[1], parent_hash=None, session_id=None)
    assert idx.resident_tokens("a") == BS


def test_an_untraceable_parent_leaves_the_session_unknown_not_wrong() -> None:
    idx = _index()
    idx.stored(block_hashes=[7, 8], parent_hash=6, session_id="a")  # subscribed late: 6 was never seen
    assert idx.resident_tokens("a") is None
    assert idx.context_blocks("a") is None
    idx.stored(block_hashes=[9], parent_hash=8, session_id="a")
    assert idx.resident_tokens("a") is None  # still unknown: 8's ancestors are not known
    assert idx.is_resident(8)


def test_another_tier_is_not_resident_and_block_size_must_match() -> None:
    idx = _index()
    idx.stored(block_hashes=[1], parent_hash=None, session_id="a", medium="CPU")
    assert idx.resident_tokens("a") is None
    assert idx.stats.ignored == 1
    idx.apply([BlockStored(block_hashes=[1], parent_hash=None, session_id="a", medium=None)])
    assert idx.resident_tokens("a") == BS
    idx.apply([BlockRemoved(block_hashes=[1], medium="CPU")])  # the offloaded copy left the CPU tier
    assert idx.resident_tokens("a") == BS
    with pytest.raises(ValueError, match="block_size 32"):
        idx.stored(block_hashes=[2], parent_hash=1, session_id="a", block_size=32)
    assert idx.context_blocks("a") == 1
    assert not idx.is_resident(2)
    every_tier = ResidencyIndex(block_size=BS, medium=None)
    every_tier.stored(block_hashes=[1], parent_hash=None, session_id="a", medium="CPU")
    assert every_tier.resident_tokens("a") == BS


@pytest.mark.parametrize(
    ("hashes", "parent"),
    [([], None), ("abc", None), ([1.5], None), ([True], None), ([None], None), ([1], 2.5)],
)
def test_bad_events_are_refused_and_change_nothing(hashes: object, parent: object) -> None:
    idx = _index()
    idx.stored(block_hashes=[1], parent_hash=None, session_id="a")
    before = idx.stats
    with pytest.raises(ValueError, match="hash"):
        idx.stored(block_hashes=hashes, parent_hash=parent, session_id="a")  # type: ignore[arg-type]
    if parent is None:
        with pytest.raises(ValueError, match="hash"):
            idx.removed(block_hashes=hashes)  # type: ignore[arg-type]
    assert idx.stats == before
    assert idx.resident_tokens("a") == BS
    with pytest.raises(ValueError, match="block_size"):
        ResidencyIndex(block_size=0)


def test_bytes_hashes_work_like_ints() -> None:
    idx = _index()
    idx.stored(block_hashes=[b"\x01" * 32, b"\x02" * 32], parent_hash=None, session_id="a")
    idx.removed(block_hashes=[b"\x02" * 32])
    assert idx.resident_tokens("a") == BS


def test_late_events_of_a_released_session_are_not_attributed_until_the_horizon() -> None:
    idx = _index(forget_horizon=3)
    idx.stored(block_hashes=[1], parent_hash=None, session_id="a")
    idx.forget("a")
    idx.stored(block_hashes=[2], parent_hash=1, session_id="a")  # the last step's event, after the release
    assert idx.resident_tokens("a") is None
    assert idx.stats.sessions == 0
    assert idx.is_resident(2)  # the block itself is cached all the same
    idx.stored(block_hashes=[100], parent_hash=None, session_id=None)
    idx.stored(block_hashes=[101], parent_hash=None, session_id=None)
    idx.stored(block_hashes=[3], parent_hash=2, session_id="a")  # 3 stores later: the id is a new session
    assert idx.resident_tokens("a") == 3 * BS


def test_releases_without_stores_keep_the_tombstones_bounded() -> None:
    idx = _index(forget_horizon=2)
    for i in range(100):
        idx.forget(f"s{i}")
    assert len(idx._forgotten) <= 8
    assert len(idx._forgotten_order) <= 8


def test_more_blocks_than_the_bound_means_lost_removals() -> None:
    idx = _index(max_blocks=3)
    idx.stored(block_hashes=[1, 2, 3], parent_hash=None, session_id="a")
    assert _reliable(idx)
    idx.stored(block_hashes=[4], parent_hash=3, session_id="a")
    assert not _reliable(idx)
    assert idx.stats.blocks == 0
    assert idx.resident_tokens("a") is None


def test_forgetting_every_session_leaves_only_cached_blocks() -> None:
    idx = _index()
    for s in range(5):
        idx.stored(block_hashes=[1, 2], parent_hash=None, session_id=None)
        idx.stored(block_hashes=[100 + s], parent_hash=2, session_id=f"s{s}")
    for s in range(5):
        idx.forget(f"s{s}")
    assert idx.stats.sessions == 0
    assert not idx._owners
    for h in (*range(100, 105), *[1, 2] * 4):
        idx.removed(block_hashes=[h])
    assert idx.stats.blocks == 2  # five copies of the shared blocks were stored
    idx.removed(block_hashes=[1, 2])
    assert idx.stats.blocks == 0
    assert not idx._parent


# -- random event streams against a model ---------------------------------------------------

_SESSIONS = [f"s{i}" for i in range(5)]


class ResidencyMachine(RuleBasedStateMachine):
    """Random turns, copies, evictions and resets of a model engine, checked against the index."""

    def __init__(self) -> None:
        super().__init__()
        self.idx = ResidencyIndex(block_size=BS, forget_horizon=0)
        self.copies: Counter[int] = Counter()
        self.context: dict[str, list[int]] = {}
        """Each session's latest stored context (the model's truth)."""
        self.fresh = itertools.count(1)

    def _hits(self, blocks: list[int]) -> int:
        n = 0
        while n < len(blocks) and self.copies[blocks[n]] > 0:
            n += 1
        return n

    @rule(
        session=st.sampled_from(_SESSIONS),
        source=st.sampled_from(_SESSIONS),
        cut=st.integers(0, 12),
        grow=st.integers(0, 6),
        early=st.integers(0, 3),
        chunk=st.integers(1, 4),
        named=st.booleans(),
    )
    def turn(self, session: str, source: str, cut: int, grow: int, early: int, chunk: int, named: bool) -> None:
        """A request: part of ``source``'s context (itself, or a group member's) grown by new blocks."""
        base = self.context.get(source, [])
        blocks = base[: min(cut, len(base))] + [next(self.fresh) for _ in range(grow)]
        start = max(0, self._hits(blocks) - early)  # from before the hit: duplicate copies
        for lo in range(start, len(blocks), chunk):  # one event per step, as the engine stores them
            part = blocks[lo : lo + chunk]
            self.idx.stored(
                block_hashes=part,
                parent_hash=blocks[lo - 1] if lo else None,
                session_id=session if named else None,
            )
            self.copies.update(part)
            if named:
                self.context[session] = blocks[: lo + len(part)]

    @precondition(lambda self: +self.copies)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        h = data.draw(st.sampled_from(sorted(+self.copies)))
        self.idx.removed(block_hashes=[h])
        self.copies[h] -= 1

    @rule()
    def reset(self) -> None:
        self.idx.apply([AllBlocksCleared()])
        self.copies.clear()

    @rule(session=st.sampled_from(_SESSIONS))
    def release(self, session: str) -> None:
        self.idx.forget(session)
        self.context.pop(session, None)

    @invariant()
    def resident_prefixes_match_the_model(self) -> None:
        for s in _SESSIONS:
            blocks = self.context.get(s)
            expected = None if blocks is None else self._hits(blocks) * BS
            assert self.idx.resident_tokens(s) == expected, s
        assert self.idx.stats.blocks == len(+self.copies)
        assert self.idx.stats.unknown_removals == 0

    @invariant()
    def owners_are_exactly_the_live_contexts(self) -> None:
        owned: dict[int, set[str]] = {}
        for s, blocks in self.context.items():
            for h in blocks:
                owned.setdefault(h, set()).add(s)
        assert {h: set(v) for h, v in self.idx._owners.items()} == owned


ResidencyMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestResidencyMachine = ResidencyMachine.TestCase
