"""What the session ledger decides, as data: arrival decisions and the events its operations emit (pure).

An operation of :class:`~rolloutpool.routing.ledger.Ledger` returns its direct answer (an
:data:`Arrival` for a turn that arrives) and appends what else it changed to the ledger's
event list: queued sessions admitted, sessions released, quarantine entered or lifted, caps
changed. The router turns events into futures resolved, metrics and logs; the simulator into
turns submitted. Nothing here awaits or performs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rolloutpool.routing.policies import Placement
from rolloutpool.routing.table import Session

__all__ = [
    "Admitted",
    "Arrival",
    "Bound",
    "CapChanged",
    "Event",
    "Held",
    "Placed",
    "QuarantineChanged",
    "Queued",
    "Rejected",
    "Released",
    "Resumed",
    "Usage",
    "Waiting",
    "Withdrawn",
]


@dataclass(frozen=True, slots=True)
class Bound:
    """The turn goes to ``session.replica`` now; ``created`` when the session was placed by this arrival."""

    session: Session
    created: bool


@dataclass(frozen=True, slots=True)
class Queued:
    """No replica may take the new session now: it waits in the admission queue under ``ticket``."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """The new session cannot wait: the queue is full or the ledger is closed."""

    reason: Literal["queue_full", "shutting_down"]


@dataclass(frozen=True, slots=True)
class Held:
    """A turn of a live session waits for room on its replica (:mod:`~rolloutpool.routing.workingset`) under
    ``ticket``: it is :class:`Resumed` (or :class:`Withdrawn`) later."""

    ticket: int


Arrival = Bound | Queued | Held | Rejected
"""What :meth:`~rolloutpool.routing.ledger.Ledger.arrive` decided."""


@dataclass(frozen=True, slots=True)
class Placed:
    """A session was placed on a replica (``kind``: ``new``, ``queued`` or ``moved``: by a non-sticky policy, or by a
    peer's scheduler resuming it elsewhere)."""

    session: Session
    kind: str


@dataclass(frozen=True, slots=True)
class Admitted:
    """The queued ``ticket`` got its session (placed for it, or already live under its id)."""

    ticket: int
    session: Session


@dataclass(frozen=True, slots=True)
class Resumed:
    """The held ``ticket``'s turn may go to ``session.replica`` now."""

    ticket: int
    session: Session


@dataclass(frozen=True, slots=True)
class Withdrawn:
    """The queued (or held) ``ticket`` left unplaced: its session was released, or the ledger closed."""

    ticket: int
    session_id: str
    reason: Literal["released", "shutting_down"]


@dataclass(frozen=True, slots=True)
class Released:
    """A session stopped being live (``how``: the release path, ``expired``, ``replica_lost``, ...)."""

    session: Session
    how: str


@dataclass(frozen=True, slots=True)
class QuarantineChanged:
    """A replica's quarantine flag flipped, or its fast (own) quarantine was just entered (``entered``)."""

    replica: str
    quarantined: bool
    """The flag now: the fast quarantine's or the operator's."""
    entered: bool
    """The fast quarantine entered on this observation (counted once per entry)."""
    reason: str | None
    """The fast quarantine's pressure reason (None when only the operator quarantines it)."""


@dataclass(frozen=True, slots=True)
class CapChanged:
    """A replica's effective cap changed."""

    replica: str
    cap: int | None
    capacity_tokens: int | None


Event = Placed | Admitted | Resumed | Withdrawn | Released | QuarantineChanged | CapChanged


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of one response."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None
    """``usage.prompt_tokens_details.cached_tokens``; None when the engine does not report it."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A new session in the admission queue."""

    ticket: int
    placement: Placement
    enqueued: float
    one_turn: bool
