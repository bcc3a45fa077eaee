"""Polling until a condition holds, for the dev tools and the tests: one signature, sync and async.

``check`` is called every ``interval`` seconds until it returns something truthy, which is
returned (typed without the ``None`` a check may return for "not yet"). Exceptions of the
types in ``ignore`` also count as "not yet" (the last one is named in the error); any other
exception propagates at once. After ``timeout`` seconds a :class:`TimeoutError` names ``what``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["wait_until", "wait_until_async"]

T = TypeVar("T")


def _timed_out(what: str, timeout: float, last_error: BaseException | None) -> TimeoutError:
    detail = f" (last error: {last_error})" if last_error is not None else ""
    return TimeoutError(f"timed out after {timeout:g}s waiting for {what}{detail}")


def wait_until(
    check: Callable[[], T | None],
    *,
    what: str = "the condition",
    timeout: float = 10.0,
    interval: float = 0.05,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Call ``check`` until it returns something truthy and return that; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
        except ignore as exc:
            last_error = exc
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, last_error)
        time.sleep(interval)


async def wait_until_async(
    check: Callable[[], T | Awaitable[T | None] | None],
    *,
    what: str = "the condition",
    timeout: float = 10.0,
    interval: float = 0.05,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """:func:`wait_until` on the running loop; ``check`` may return an awaitable (awaited each time)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
        except ignore as exc:
            last_error = exc
        else:
            if value:
                return value
        if loop.time() > deadline:
            raise _timed_out(what, timeout, last_error)
        await asyncio.sleep(interval)
