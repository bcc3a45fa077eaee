"""Why a new session could not be placed; the proxy answers each with 429 or 503 and ``Retry-After``."""

from __future__ import annotations

__all__ = ["AdmissionError", "QueueFullError", "QueueTimeoutError", "ReleasedWhileQueuedError", "ShuttingDownError"]


class AdmissionError(Exception):
    """A new session could not be placed."""


class QueueFullError(AdmissionError):
    """The admission queue is full (answered 429)."""


class QueueTimeoutError(AdmissionError):
    """The session waited ``queue_timeout_s`` without a slot (answered 503)."""


class ShuttingDownError(AdmissionError):
    """The router is stopping (answered 503)."""


class ReleasedWhileQueuedError(AdmissionError):
    """The session was released while it waited in the queue (answered 503; it holds no slot)."""
