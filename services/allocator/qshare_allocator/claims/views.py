"""Turning stored claims and requests into demands for placement."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from qshare.contracts.claims import ClaimSpec, PlacementOverride
from qshare.contracts.domain import Priority, Provisioner
from qshare.settings import ClusterSettings
from qshare_allocator.placement.demand import Demand


def demand_of(spec: ClaimSpec, provisioner: Provisioner, rules: ClusterSettings) -> Demand:
    """The claim's needs, with the cluster's default policies where it sets none."""
    override = spec.placement or PlacementOverride()
    return Demand(
        priority=spec.priority,
        vcore=spec.vcore,
        vmemory_mib=spec.vmemory,
        count=spec.count,
        whole=provisioner is Provisioner.WHOLE,
        selector=spec.node_selector,
        node_policy=override.node or rules.node_policy,
        card_policy=override.card or rules.card_policy,
    )


def spec_of(row: Row[Any]) -> ClaimSpec:
    """The request a stored claim was created from (used to retry pending claims)."""
    return ClaimSpec(
        priority=Priority(row.priority),
        vcore=row.vcore,
        vmemory=row.vmemory_mib,
        count=row.count,
        class_name=row.class_name,
        node_selector=row.node_selector,
        placement=PlacementOverride.model_validate(row.placement) if row.placement else None,
        idempotency_key=row.idempotency_key,
        gang=row.gang,
    )
