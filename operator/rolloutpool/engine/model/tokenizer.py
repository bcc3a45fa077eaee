"""A deterministic word-level tokenizer, detokenizer and chat template (pure, no I/O).

The engine simulator needs token ids for two things only: prompt lengths and the
chain hashes of the prefix cache. So text is split by a regular expression into
special tokens, words and single punctuation characters (whitespace produces no
token), and each piece gets a stable id, ``zlib.crc32(piece) % VOCAB_SIZE``
(never Python's ``hash`` of a string, which is randomised per process).

Generated tokens are drawn from a fixed vocabulary of made-up words and two
punctuation marks whose ids are distinct, and every generated piece detokenizes to
``" word"`` or ``","``; re-tokenizing generated text therefore yields exactly the
generated ids. The chat template renders message by message, so the prompt of turn
``t + 1`` (turn ``t``'s messages, the assistant reply, a new user message) starts
with turn ``t``'s prompt followed by turn ``t``'s output, token for token, and hits
the prefix cache the way a real multi-turn rollout does.

Generated ids depend only on ``(seed, prompt ids)``: the same prompt gives the same
text on every run, and a shorter ``max_tokens`` gives a prefix of a longer one.
"""

from __future__ import annotations

import hashlib
import re
import sys
import zlib
from array import array
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

__all__ = [
    "GENERATION_VOCAB",
    "IM_END",
    "IM_START",
    "VOCAB_SIZE",
    "ChatMessage",
    "detokenize",
    "generate_ids",
    "piece_id",
    "render_chat",
    "token_text",
    "tokenize",
]

VOCAB_SIZE: Final = 151_936
"""Size of the id space (Qwen's); every id is in ``range(VOCAB_SIZE)``."""

IM_START: Final = "<|im_start|>"
IM_END: Final = "<|im_end|>"
_SPECIAL_IDS: Final = {IM_START: 151_644, IM_END: 151_645, "<|endoftext|>": 151_643}

_PIECE = re.compile(r"<\|[a-z_]+\|>|\w+|[^\w\s]")

ChatMessage = Mapping[str, str]
"""One chat message after validation: ``role`` and ``content`` strings."""


def piece_id(piece: str) -> int:
    """The stable id of one piece (special token, word or punctuation character)."""
    special = _SPECIAL_IDS.get(piece)
    if special is not None:
        return special
    return zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE


def tokenize(text: str) -> list[int]:
    """Token ids of ``text``; whitespace separates pieces and produces no token."""
    return [piece_id(m.group()) for m in _PIECE.finditer(text)]


def _vocab_words() -> Iterator[str]:
    consonants = "bdfgklmnprstvz"
    vowels = "aeiou"
    syllables = [c + v for c in consonants for v in vowels]
    for first in syllables:
        for second in syllables:
            yield first + second


def _build_generation_vocab(size: int = 2048) -> dict[int, str]:
    """id -> rendered piece; ids distinct from each other and from the special tokens."""
    taken = set(_SPECIAL_IDS.values())
    vocab: dict[int, str] = {}
    for piece, text in ((",", ","), (".", ".")):
        vocab[piece_id(piece)] = text
        taken.add(piece_id(piece))
    for word in sorted(_vocab_words(), key=piece_id):  # spread over the whole syllable table
        token = piece_id(word)
        if token in taken:
            continue
        taken.add(token)
        vocab[token] = " " + word
        if len(vocab) == size:
            break
    return vocab


GENERATION_VOCAB: Final = _build_generation_vocab()
"""Every id the simulator generates, with the text it detokenizes to."""

_WORD_IDS: Final = tuple(i for i, text in GENERATION_VOCAB.items() if text.startswith(" "))
_COMMA: Final = piece_id(",")
_PERIOD: Final = piece_id(".")
_MASK64: Final = (1 << 64) - 1


def detokenize(ids: Sequence[int]) -> str:
    """Text of generated ids; ``KeyError`` for an id the simulator never generates."""
    return "".join(GENERATION_VOCAB[i] for i in ids)


_SPECIAL_TEXT: Final = {token: text for text, token in _SPECIAL_IDS.items()}


def token_text(token: int) -> str:
    """One id's text: a generated id's or a special token's, else ``<tokN>`` (a prompt word's id is a one-way hash)."""
    text = GENERATION_VOCAB.get(token)
    if text is not None:
        return text
    return _SPECIAL_TEXT.get(token, f"<tok{token}>")


def _seed_of(seed: int, prompt_ids: Sequence[int]) -> int:
    data = array("q", prompt_ids)
    if sys.byteorder == "big":  # pragma: no cover - the digest must not depend on the host
        data.byteswap()
    digest = hashlib.blake2b(data.tobytes(), digest_size=8, key=(seed & _MASK64).to_bytes(8, "little"))
    return int.from_bytes(digest.digest(), "little")


def generate_ids(prompt_ids: Sequence[int], count: int, *, seed: int = 0) -> list[int]:
    """``count`` output ids, a pure function of ``(seed, prompt_ids)`` (splitmix64 stream).

    Mostly words, with a comma or a period now and then, never two marks in a row.
    """
    state = _seed_of(seed, prompt_ids)
    words = _WORD_IDS
    out: list[int] = []
    previous_mark = True
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        roll = z % 100
        if not previous_mark and roll < 4:
            out.append(_PERIOD)
            previous_mark = True
        elif not previous_mark and roll < 10:
            out.append(_COMMA)
            previous_mark = True
        else:
            out.append(words[(z >> 8) % len(words)])
            previous_mark = False
    return out


def render_chat(messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True) -> str:
    """ChatML text of ``messages``: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` each.

    With ``add_generation_prompt`` the text ends with ``<|im_start|>assistant\\n``, so
    a later prompt that appends the reply and more messages extends this one.
    """
    parts = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)
