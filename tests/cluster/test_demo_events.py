"""The cluster demo prints every event with what happened, never an empty column."""

from __future__ import annotations

from qshare.contracts import envelope
from qshare.demo_cluster import event_detail


def test_a_claim_event_without_a_status_shows_its_type() -> None:
    claim = {"claim_id": "eb184f4f-46dd-4a25-b450-aec8958d4d32"}
    event = envelope.Envelope(source="preemptor", type="io.qshare.claim.suspended", data=claim)
    assert event_detail(event) == "suspended"


def test_a_claim_event_shows_the_claims_status() -> None:
    event = envelope.Envelope(source="a", type="io.qshare.claim.placed", data={"status": "placed"})
    assert event_detail(event) == "placed"
