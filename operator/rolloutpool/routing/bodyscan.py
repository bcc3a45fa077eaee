"""Find a few top-level fields of a JSON object without decoding the rest of it (pure).

The router needs two or three small fields of a request body that may hold
megabytes of prompt text or tens of thousands of token ids (``stream``,
``stream_options``, the session key fields, ``model``), and the ``usage`` object of
a response that may carry every token id. Decoding the whole document for them
costs more than everything else the router does (orjson turns 24k token ids into
24k Python ints in ~0.7 ms). :func:`scan_object` walks the top level only and skips
each value with ``bytes.find`` (memchr, a few microseconds per 200 KB): a string by
its closing quote, a container by bracket counting outside strings. The byte span
of each wanted value is returned and only those spans are decoded (by the caller).

Each skipped string, bracket and escaped quote spends one step of a budget
(:data:`DEFAULT_BUDGET`); past it the scan gives up with :class:`ScanBudgetError`
and the caller decodes the document instead (orjson is faster than a Python walk
over thousands of small strings, slower than the walk over a few large ones).

The scan checks the structure it walks (braces, quotes, colons, commas at the top
level) but not the skipped values; a document it cannot walk yields ``None`` and the
caller decodes it in full to get a precise error (or a result, should the scan be
stricter than the JSON grammar somewhere). For a duplicated key the last occurrence
wins, as in every JSON decoder the engines use.
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["DEFAULT_BUDGET", "ScanBudgetError", "ScanError", "scan_object", "splice"]

_WS = frozenset(b" \t\r\n")
_SCALAR_END = frozenset(b" \t\r\n,}]")
_OPEN_BRACE, _CLOSE_BRACE, _OPEN_BRACKET, _CLOSE_BRACKET = ord("{"), ord("}"), ord("["), ord("]")
_QUOTE, _BACKSLASH, _COLON, _COMMA = ord('"'), ord("\\"), ord(":"), ord(",")
_STRUCTURAL = (b'"', b"[", b"{", b"]", b"}")

DEFAULT_BUDGET = 256
"""Steps (skipped strings, brackets, escaped quotes) one scan may take before it gives up."""


class ScanError(ValueError):
    """The document is not a JSON object the scan can walk."""


class ScanBudgetError(ScanError):
    """The document has more strings or brackets than the scan's budget; decode it instead."""


def _skip_ws(raw: bytes, i: int, n: int) -> int:
    while i < n and raw[i] in _WS:
        i += 1
    return i


def _string_end(raw: bytes, i: int, budget: list[int]) -> int:
    """Index of the closing quote of the string whose opening quote is at ``i``."""
    j = raw.find(b'"', i + 1)
    while j >= 0:
        k = j - 1
        while raw[k] == _BACKSLASH:
            k -= 1
        if (j - 1 - k) % 2 == 0:  # an even number of backslashes: the quote is not escaped
            return j
        budget[0] -= 1
        if budget[0] < 0:
            raise ScanBudgetError("too many escaped quotes to skip")
        j = raw.find(b'"', j + 1)
    raise ScanError("unterminated string")


def _find(raw: bytes, char: bytes, start: int, n: int) -> int:
    found = raw.find(char, start)
    return n if found < 0 else found


def _container_end(raw: bytes, v: int, n: int, budget: list[int]) -> int:
    """Index just past the container (object or array) opening at ``v``.

    Walks from structural byte to structural byte, each found with ``bytes.find`` and
    kept until passed (a bracket inside a string is found again after the string).
    Every step spends one unit of ``budget``; an exhausted budget raises
    :class:`ScanBudgetError` (a document with many strings decodes faster in C).
    """
    depth = 0
    pos = v
    marks = [_find(raw, c, pos, n) for c in _STRUCTURAL]  # next '"', '[', '{', ']', '}'
    while True:
        budget[0] -= 1
        if budget[0] < 0:
            raise ScanBudgetError("too many strings to skip")
        at = min(marks)
        if at >= n:
            raise ScanError("unterminated container")
        kind = marks.index(at)
        if kind == 0:  # a string: brackets inside it do not count
            pos = _string_end(raw, at, budget) + 1
            for k in range(5):
                if marks[k] < pos:
                    marks[k] = _find(raw, _STRUCTURAL[k], pos, n)
            continue
        pos = at + 1
        marks[kind] = _find(raw, _STRUCTURAL[kind], pos, n)
        if kind <= 2:
            depth += 1
            continue
        depth -= 1
        if depth == 0:
            return pos


def _value_end(raw: bytes, v: int, n: int, budget: list[int]) -> int:
    if v >= n:
        raise ScanError("missing value")
    c = raw[v]
    if c == _QUOTE:
        return _string_end(raw, v, budget) + 1
    if c in (_OPEN_BRACE, _OPEN_BRACKET):
        return _container_end(raw, v, n, budget)
    i = v
    while i < n and raw[i] not in _SCALAR_END:
        i += 1
    if i == v:
        raise ScanError("missing value")
    return i


def scan_object(raw: bytes, wanted: Collection[bytes], *, budget: int = DEFAULT_BUDGET) -> dict[bytes, tuple[int, int]]:
    """Byte spans ``(start, end)`` of the top-level values of the ``wanted`` keys (raw key bytes).

    Keys written with escapes are compared by their raw bytes, i.e. not found (none of
    the fields the router reads needs an escape). Raises :class:`ScanError` when ``raw``
    is not a JSON object the scan can walk, :class:`ScanBudgetError` (a subclass) when
    walking it would take more than ``budget`` steps.
    """
    left = [budget]
    n = len(raw)
    i = _skip_ws(raw, 0, n)
    if i >= n or raw[i] != _OPEN_BRACE:
        raise ScanError("not a JSON object")
    found: dict[bytes, tuple[int, int]] = {}
    i = _skip_ws(raw, i + 1, n)
    if i < n and raw[i] == _CLOSE_BRACE:
        return _tail(raw, i, n, found)
    while True:
        left[0] -= 1
        if left[0] < 0:
            raise ScanBudgetError("too many keys")
        if i >= n or raw[i] != _QUOTE:
            raise ScanError("expected a key")
        key_end = _string_end(raw, i, left)
        key = raw[i + 1 : key_end]
        i = _skip_ws(raw, key_end + 1, n)
        if i >= n or raw[i] != _COLON:
            raise ScanError("expected a colon")
        v = _skip_ws(raw, i + 1, n)
        end = _value_end(raw, v, n, left)
        if key in wanted:
            found[key] = (v, end)
        i = _skip_ws(raw, end, n)
        if i < n and raw[i] == _COMMA:
            i = _skip_ws(raw, i + 1, n)
            continue
        if i < n and raw[i] == _CLOSE_BRACE:
            return _tail(raw, i, n, found)
        raise ScanError("expected a comma or a closing brace")


def _tail(raw: bytes, i: int, n: int, found: dict[bytes, tuple[int, int]]) -> dict[bytes, tuple[int, int]]:
    if _skip_ws(raw, i + 1, n) != n:
        raise ScanError("data after the object")
    return found


def splice(raw: bytes, span: tuple[int, int] | None, key: bytes, value: bytes) -> bytes:
    """``raw`` with the value at ``span`` replaced by ``value``, or ``key: value`` added first when ``span`` is None.

    Every other byte of ``raw`` is kept. ``raw`` must be a non-empty object when adding.
    """
    if span is not None:
        start, end = span
        return raw[:start] + value + raw[end:]
    brace = raw.index(b"{")
    return raw[: brace + 1] + b'"' + key + b'":' + value + b"," + raw[brace + 1 :]
