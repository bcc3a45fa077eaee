"""One name per pressure reason: the law, the conditions and a stored status with another spelling agree."""

from __future__ import annotations

import json

from rolloutpool.api.status import ReplicaStatus, RolloutPoolStatus
from rolloutpool.autoscale import ReplicaSignals
from rolloutpool.autoscale.law import LawParams, pressure_reason
from rolloutpool.reconcile.caps import controls_from_status
from rolloutpool.reconcile.conditions import quarantine_word
from rolloutpool.routing.pressure import PressureReason, pressure_reason_named


def test_every_reason_is_named_by_its_value_and_the_legacy_spelling_by_evicting() -> None:
    assert [r.value for r in PressureReason] == ["Evicting", "Preempting", "Queueing"]
    for reason in PressureReason:
        assert pressure_reason_named(reason.value) is reason
    assert pressure_reason_named("LivePrefixEviction") is PressureReason.EVICTING
    assert pressure_reason_named("Raised") is None
    assert pressure_reason_named(None) is None


def test_the_law_names_eviction_as_the_router_does_and_the_status_writes_plain_text() -> None:
    params = LawParams()
    reason = pressure_reason(ReplicaSignals(reprefill_tokens_per_s=1e6, sampled_at=0.0), params)
    assert reason == "Evicting"
    entry = ReplicaStatus(name="e0", index=0, target=0.8, quarantined=True, reason=reason)
    assert json.loads(entry.model_dump_json(by_alias=True))["reason"] == "Evicting"
    assert quarantine_word(reason) == quarantine_word("LivePrefixEviction") == "evicting"


def test_a_status_written_with_the_legacy_spelling_reads_back_as_a_cut() -> None:
    status = RolloutPoolStatus(
        replica_status=[ReplicaStatus(name="e0", index=0, target=0.8, quarantined=True, reason="LivePrefixEviction")]
    )
    assert controls_from_status(status)["e0"].reason == "Evicting"
