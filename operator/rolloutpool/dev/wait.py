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
from typing import TypeVar, cast

__all__ = ["wait_until", "wait_until_async"]

T = TypeVar("T")


def _timed_out(what: str, timeout: float, errors: list[Exception]) -> TimeoutError:
    detail = f" (last error: {errors[-1]})" if errors else ""
    return TimeoutError(f"timed out after {timeout:g}s waiting for {what}{detail}")


def _attempt(check: Callable[[], T | None], ignore: tuple[type[Exception], ...], errors: list[Exception]) -> T | None:
    try:
        return check()
    except ignore as exc:
        errors[:] = [exc]
        return None


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
    errors: list[Exception] = []
    while not (value := _attempt(check, ignore, errors)):
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, errors)
        time.sleep(interval)
    return value


async def wait_until_async(
    check: Callable[[], T | Awaitable[T | None] | None],
    *,
    what: str = "the condition",
    timeout: float = 10.0,
    interval: float = 0.05,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """:func:`wait_until` on the running loop; ``check`` may return an awaitable (awaited each time)."""

    async def attempt() -> T | None:
        value = _attempt(check, ignore, errors)
        if not inspect.isawaitable(value):
            return cast("T | None", value)
        try:
            return cast("T | None", await value)
        except ignore as exc:
            errors[:] = [exc]
            return None

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    errors: list[Exception] = []
    while not (value := await attempt()):
        if loop.time() > deadline:
            raise _timed_out(what, timeout, errors)
        await asyncio.sleep(interval)
    return value
