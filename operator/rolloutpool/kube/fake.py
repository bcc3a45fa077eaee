"""An in-memory :class:`~rolloutpool.kube.port.KubePort` for unit tests, with fault injection.

It keeps what an API server keeps and the operator relies on: uids, resource versions, a
``generation`` bumped by spec changes, merge patches, uid preconditions on delete (409), 404 for
a missing object, 409 on creating an existing one, pods that stay terminating while they hold
a finalizer (or are marked :meth:`FakeKube.stick`), and a watch log from which streams replay.

Faults: :meth:`FakeKube.fail` makes the next matching calls raise (a status -> ``KubeError``,
or any exception such as ``TimeoutError``); :meth:`FakeKube.before` runs a callback just before a
matching call (to race the caller: delete or recreate an object under it); :meth:`FakeKube.drop_watches`
breaks running streams; :meth:`FakeKube.expire` makes watches from older versions answer 410.
Thread-safe (the operator calls it from worker threads).
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rolloutpool.kube.port import CONFLICT, GONE, NOT_FOUND, KubeError, Listing, WatchEvent

__all__ = ["Call", "FakeKube", "merge_patch"]

_Key = tuple[str, str, str]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, None removes a key, anything else replaces (pure)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _matches(obj: dict[str, Any], label_selector: str, field_selector: str) -> bool:
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    for term in filter(None, label_selector.split(",")):
        key, _, value = term.partition("=")
        if key not in labels or ("=" in term and labels[key] != value):
            return False
    for term in filter(None, field_selector.split(",")):
        key, _, value = term.partition("=")
        if key != "metadata.name":
            raise ValueError(f"the fake knows no field selector {key!r}")
        if meta.get("name") != value:
            return False
    return True


@dataclass(frozen=True)
class Call:
    """One call the fake answered (or failed): verb, kind, namespace, name."""

    verb: str
    kind: str
    namespace: str
    name: str


@dataclass
class _Fault:
    verb: str
    kind: str | None
    name: str | None
    action: Callable[[], None]
    times: int

    def matches(self, call: Call) -> bool:
        return (
            self.verb in (call.verb, "*")
            and self.kind in (None, call.kind)
            and self.name in (None, call.name)
            and self.times > 0
        )


@dataclass
class FakeKube:
    """The fake API server; ``now`` gives the timestamps it writes (an ISO string)."""

    now: Callable[[], str] = lambda: "2027-01-15T08:00:00Z"
    objects: dict[_Key, dict[str, Any]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    _log: list[tuple[int, str, WatchEvent]] = field(default_factory=list)
    _faults: list[_Fault] = field(default_factory=list)
    _stuck: set[_Key] = field(default_factory=set)
    _version: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _rv: int = 0
    _expired_below: int = 0
    _drops: int = 0
    _lock: threading.Condition = field(default_factory=threading.Condition)

    # -- fault injection ------------------------------------------------------------

    def fail(
        self, verb: str, kind: str | None = None, name: str | None = None, *, error: int | BaseException, times: int = 1
    ) -> None:
        """The next ``times`` matching calls raise: ``KubeError(error)`` for a status, else ``error`` itself.

        ``verb`` is a method name (``get``, ``list``, ``create``, ``patch``, ``patch_status``,
        ``delete``, ``watch``) or ``*``.
        """

        def action() -> None:
            raise KubeError(error, "Injected") if isinstance(error, int) else error

        self._faults.append(_Fault(verb, kind, name, action, times))

    def before(
        self, verb: str, kind: str | None, name: str | None, callback: Callable[[], None], *, times: int = 1
    ) -> None:
        """Run ``callback`` just before the next ``times`` matching calls (it may call the fake)."""
        self._faults.append(_Fault(verb, kind, name, callback, times))

    def stick(self, kind: str, namespace: str, name: str) -> None:
        """Deleting this object leaves it terminating (``deletionTimestamp`` set) until :meth:`release`."""
        self._stuck.add((kind, namespace, name))

    def release(self, kind: str, namespace: str, name: str) -> None:
        """Finish the deletion of a stuck object (its kubelet or finalizer let go)."""
        with self._lock:
            self._stuck.discard((kind, namespace, name))
            obj = self.objects.get((kind, namespace, name))
            if obj is not None and (obj.get("metadata") or {}).get("deletionTimestamp"):
                self._remove((kind, namespace, name))

    def drop_watches(self) -> None:
        """Break every running watch stream (the connection dropped); they raise ``ConnectionResetError``."""
        with self._lock:
            self._drops += 1
            self._lock.notify_all()

    def expire(self) -> None:
        """Forget the history: watches from any version up to now answer 410 (etcd compaction)."""
        with self._lock:
            self._expired_below = self._rv + 1
            self._lock.notify_all()

    # -- seeding and reading back -----------------------------------------------------

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as given (status included), filling uid and versions; replaces any old one."""
        with self._lock:
            key = self._key_of(obj)
            stored = copy.deepcopy(obj)
            meta = stored.setdefault("metadata", {})
            meta.setdefault("uid", f"uid-{next(self._version)}")
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp", self.now())
            event = "MODIFIED" if key in self.objects else "ADDED"
            self.objects[key] = stored
            self._record(event, stored)
            return copy.deepcopy(stored)

    def peek(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The stored object (a copy), not counted as a call."""
        with self._lock:
            obj = self.objects.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def verbs(self, verb: str, kind: str | None = None) -> list[str]:
        """Names the fake answered ``verb`` for (of ``kind``), in order."""
        return [c.name for c in self.calls if c.verb == verb and kind in (None, c.kind)]

    # -- the port -----------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        self._enter("get", kind, namespace, name)
        with self._lock:
            return copy.deepcopy(self._existing((kind, namespace, name)))

    def list(self, kind: str, namespace: str, *, label_selector: str = "", field_selector: str = "") -> Listing:
        self._enter("list", kind, namespace, "")
        with self._lock:
            items = [
                copy.deepcopy(obj)
                for (k, ns, _), obj in sorted(self.objects.items())
                if k == kind and ns == namespace and _matches(obj, label_selector, field_selector)
            ]
            return Listing(items, str(self._rv))

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        key = self._key_of(obj)
        self._enter("create", *key)
        with self._lock:
            if key in self.objects:
                raise KubeError(CONFLICT, "AlreadyExists")
            stored = copy.deepcopy(obj)
            meta = stored["metadata"]
            meta.update(uid=f"uid-{next(self._version)}", generation=1, creationTimestamp=self.now())
            if key[0] == "Pod":
                stored.setdefault("status", {"phase": "Pending"})
            self.objects[key] = stored
            self._record("ADDED", stored)
            return copy.deepcopy(stored)

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        self._enter("patch", kind, namespace, name)
        with self._lock:
            old = self._existing((kind, namespace, name))
            new = merge_patch(old, {k: v for k, v in patch.items() if k != "status"})
            if new.get("spec") != old.get("spec"):
                new["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
            self.objects[(kind, namespace, name)] = new
            self._record("MODIFIED", new)
            return copy.deepcopy(new)

    def patch_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self._enter("patch_status", kind, namespace, name)
        with self._lock:
            old = self._existing((kind, namespace, name))
            new = merge_patch(old, {"status": status})
            self.objects[(kind, namespace, name)] = new
            self._record("MODIFIED", new)
            return copy.deepcopy(new)

    def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> None:
        key = (kind, namespace, name)
        self._enter("delete", *key)
        with self._lock:
            obj = self._existing(key)
            if uid is not None and obj["metadata"].get("uid") != uid:
                raise KubeError(CONFLICT, "Precondition failed: UID in precondition does not match")
            if key in self._stuck or obj["metadata"].get("finalizers"):
                if not obj["metadata"].get("deletionTimestamp"):
                    obj["metadata"]["deletionTimestamp"] = self.now()
                    self._record("MODIFIED", obj)
                return
            self._remove(key)

    def watch(
        self,
        kind: str,
        namespace: str,
        *,
        resource_version: str | None,
        timeout_seconds: int,
        label_selector: str = "",
        field_selector: str = "",
    ) -> _FakeStream:
        self._enter("watch", kind, namespace, "")
        since = int(resource_version or 0)
        with self._lock:
            if since < self._expired_below - 1:
                raise KubeError(GONE, "Expired")
        return _FakeStream(self, kind, namespace, label_selector, field_selector, since, timeout_seconds)

    def close(self) -> None:
        self._enter("close", "", "", "")

    # -- internals ----------------------------------------------------------------------

    def _enter(self, verb: str, kind: str, namespace: str, name: str) -> None:
        call = Call(verb, kind, namespace, name)
        self.calls.append(call)
        for fault in self._faults:
            if fault.matches(call):
                fault.times -= 1
                fault.action()

    def _key_of(self, obj: dict[str, Any]) -> _Key:
        meta = obj["metadata"]
        return (str(obj["kind"]), str(meta["namespace"]), str(meta["name"]))

    def _existing(self, key: _Key) -> dict[str, Any]:
        obj = self.objects.get(key)
        if obj is None:
            raise KubeError(NOT_FOUND, "NotFound")
        return obj

    def _record(self, event: str, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._log.append((self._rv, str(obj["kind"]), WatchEvent(event, copy.deepcopy(obj))))
        self._lock.notify_all()

    def _remove(self, key: _Key) -> None:
        obj = self.objects.pop(key)
        self._record("DELETED", obj)


class _FakeStream:
    """A watch stream over the fake's log: replays from a version, then waits for new events."""

    def __init__(  # noqa: PLR0917 - private, one caller
        self, fake: FakeKube, kind: str, namespace: str, labels: str, fields: str, since: int, timeout: float
    ) -> None:
        self._fake, self._kind, self._namespace = fake, kind, namespace
        self._labels, self._fields, self._since, self._timeout = labels, fields, since, timeout
        self._stopped = threading.Event()

    def __iter__(self) -> Iterator[WatchEvent]:
        fake, lock = self._fake, self._fake._lock
        with lock:
            drops = fake._drops
        waited = 0.0
        while not self._stopped.is_set():
            with lock:
                if fake._drops != drops:
                    raise ConnectionResetError("injected: the watch connection dropped")
                if self._since < fake._expired_below - 1:
                    raise KubeError(GONE, "Expired")
                fresh = [(rv, e) for rv, kind, e in fake._log if rv > self._since and kind == self._kind]
                if not fresh:
                    if waited >= self._timeout:
                        return  # the server ended the stream
                    lock.wait(0.05)
                    waited += 0.05
                    continue
            for rv, event in fresh:
                self._since = rv
                meta = event.object.get("metadata") or {}
                if meta.get("namespace") == self._namespace and _matches(event.object, self._labels, self._fields):
                    yield WatchEvent(event.type, copy.deepcopy(event.object))
                if self._stopped.is_set():
                    return

    def stop(self) -> None:
        self._stopped.set()
        with self._fake._lock:
            self._fake._lock.notify_all()
