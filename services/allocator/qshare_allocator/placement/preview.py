"""Read-only placement preview: for each candidate node, whether a claim would fit there now
and how well, by the same node and card rules the finder locks with (nothing is locked)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

from qshare.contracts.claims import ClaimSpec
from qshare.contracts.domain import PlacementPolicy, Priority
from qshare.contracts.placement import MAX_SCORE, PlacementPreview, PreviewPlacement
from qshare.contracts.rows import node_is_ready
from qshare.contracts.schema import gpus, nodes
from qshare.settings import ClusterSettings
from qshare_allocator.claims.classes import ClassCatalog
from qshare_allocator.claims.views import demand_of
from qshare_allocator.placement.demand import Demand, check_granularity
from qshare_allocator.placement.finder import _card_fits, _params


class PreviewService:
    def __init__(self, rules: ClusterSettings) -> None:
        self._rules = rules
        self._classes = ClassCatalog()

    async def preview(self, conn: AsyncConnection, request: PreviewPlacement) -> PlacementPreview:
        demand = await self._demand(conn, request.spec)
        params = _params(demand, self._rules.node_timeout_s) | {"names": request.nodes}
        query = _candidates(demand.priority, demand.whole)
        rows = {r.name: r for r in (await conn.execute(query, params)).all()}
        out = PlacementPreview()
        for name in request.nodes:
            reason = _reason(rows.get(name), demand)
            if reason is None:
                out.scores[name] = _score(rows[name], demand.node_policy)
            else:
                out.failed[name] = reason
        return out

    async def _demand(self, conn: AsyncConnection, spec: ClaimSpec) -> Demand:
        provisioner = await self._classes.provisioner(conn, spec.class_name)
        check_granularity(spec.vmemory, provisioner, self._rules)
        return demand_of(spec, provisioner, self._rules)


@functools.cache
def _candidates(priority: Priority, whole: bool) -> Select[Any]:
    """Each named node with what decides whether it fits, and its fitting cards: one hash
    join of the names, their nodes and their cards, grouped by node (a correlated count
    per node costs twice as much over a thousand nodes)."""
    wanted = select(func.unnest(bindparam("names", type_=ARRAY(Text))))
    return (
        select(
            nodes.c.name,
            nodes.c.schedulable,
            node_is_ready().label("ready"),
            nodes.c.free_mib,
            nodes.c.labels.contains(bindparam("selector", type_=JSONB)).label("selected"),
            func.count().filter(_card_fits(priority, whole)).label("fitting"),
            func.coalesce(func.sum(gpus.c.memory_mib), 0).label("total_mib"),
        )
        .select_from(nodes.outerjoin(gpus, gpus.c.node_name == nodes.c.name))
        .where(nodes.c.name.in_(wanted))  # a semi-join: a name given twice counts once
        .group_by(nodes.c.name)
    )


def _reason(row: Any, demand: Demand) -> str | None:
    """Why the node cannot host the demand, or None when it can."""
    if row is None:
        return "not a qshare node (no node agent registered it)"
    if not row.schedulable:
        return "cordoned in qshare"
    if not row.ready:
        return "the node agent's heartbeats stopped (NotReady)"
    if not row.selected:
        return f"labels do not match {demand.selector}"
    if row.free_mib < demand.node_free_needed or row.fitting < demand.count:
        return demand.describe()
    return None


def _score(row: Any, policy: PlacementPolicy) -> int:
    """spread: the freer the node, the higher; binpack: the fuller, the higher."""
    free = row.free_mib / row.total_mib if row.total_mib else 0.0
    share = free if policy is PlacementPolicy.SPREAD else 1.0 - free
    return round(MAX_SCORE * share)
