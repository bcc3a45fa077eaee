"""The demo's live table says who quarantines a replica: the operator's law, a router, or both."""

from __future__ import annotations

from rich.console import Console

from rolloutpool.dev.demo import pool_table


def _render(replicas: list[dict[str, object]]) -> str:
    console = Console(record=True, width=200)
    console.print(pool_table({"metadata": {"name": "demo"}, "status": {"replicaStatus": replicas}}))
    return console.export_text()


def test_each_source_of_a_quarantine_is_named_with_its_reason() -> None:
    text = _render(
        [
            {"name": "e0", "cap": 4, "quarantined": True, "reason": "Evicting"},
            {"name": "e1", "cap": 4, "routerQuarantined": True, "routerReason": "Evicting"},
            {"name": "e2", "cap": 4, "quarantined": True, "reason": "Preempting", "routerQuarantined": True},
            {"name": "e3", "cap": 4},
        ]
    )
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith("e")}
    assert "yes (operator)" in rows["e0"]
    assert "Evicting" in rows["e0"]
    assert "yes (router)" in rows["e1"]
    assert "Evicting" in rows["e1"]
    assert "yes (operator and router)" in rows["e2"]
    assert "yes" not in rows["e3"]
