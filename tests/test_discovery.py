"""Pure discovery decisions on pod objects."""

from __future__ import annotations

from rolloutpool.routing.discovery import replica_event


def _pod(**status: object) -> dict[str, object]:
    return {
        "metadata": {"name": "p-engine-0"},
        "spec": {
            "containers": [
                {"ports": [{"name": "metrics", "containerPort": 9}, {"name": "http", "containerPort": 8100}]}
            ]
        },
        "status": status,
    }


def test_ready_pod_with_ip_is_routable_on_its_named_port() -> None:
    event = replica_event("MODIFIED", _pod(podIP="127.0.0.5", conditions=[{"type": "Ready", "status": "True"}]))
    assert (event.name, event.url, event.routable, event.reason) == (
        "p-engine-0",
        "http://127.0.0.5:8100",
        True,
        "Ready",
    )


def test_everything_else_is_not_routable() -> None:
    assert replica_event("ADDED", _pod()).reason == "NoIP"
    not_ready = replica_event("MODIFIED", _pod(podIP="127.0.0.5", conditions=[{"type": "Ready", "status": "False"}]))
    assert (not_ready.routable, not_ready.reason) == (False, "NotReady")
    assert replica_event("DELETED", _pod(podIP="127.0.0.5")).reason == "Deleted"
    terminating = _pod(podIP="127.0.0.5", conditions=[{"type": "Ready", "status": "True"}])
    terminating["metadata"] = {"name": "p-engine-0", "deletionTimestamp": "2026-01-01T00:00:00Z"}
    assert replica_event("MODIFIED", terminating).reason == "Terminating"


def test_default_port_when_no_named_port() -> None:
    pod = {
        "metadata": {"name": "x"},
        "spec": {"containers": [{}]},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert replica_event("ADDED", pod, default_port=8000).url == "http://10.0.0.1:8000"


def test_operator_limits_from_status() -> None:
    from rolloutpool.routing.discovery import OperatorLimit, operator_limits  # noqa: PLC0415

    pool = {
        "status": {
            "replicaStatus": [{"name": "a", "index": 0, "target": 0.8, "quarantined": True, "reason": "Evicting"}]
        }
    }
    assert operator_limits(pool) == {"a": OperatorLimit(0.8, True, "Evicting")}
    assert operator_limits({"status": {"replicaStatus": [{"name": "a"}]}}) == {}  # unparsable: no limits
    assert operator_limits({}) == {}


def test_ipv6_pod_ip_is_bracketed() -> None:
    pod = {
        "metadata": {"name": "x"},
        "spec": {},
        "status": {"podIP": "fd00:10:244::5", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert replica_event("ADDED", pod, default_port=8000).url == "http://[fd00:10:244::5]:8000"
