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
from qshare_allocator.claims.classes import read_class
from qshare_allocator.claims.views import demand_of
from qshare_allocator.placement.demand import Demand, check_granularity
from qshare_allocator.placement.finder import _card_fits, _params


class PreviewService:
    def __init__(self, rules: ClusterSettings) -> None:
        self._rules = rules

    async def preview(self, conn: AsyncConnection, request: PreviewPlacement) -> PlacementPreview:
        demand = await self._demand(conn, request.spec)
        params = _params(demand, self._rules.node_timeout_s) | {"names": request.nodes}
        query = _candidates(demand.priority, demand.whole)
        rows = {r[0]: tuple(r) for r in (await conn.execute(query, params)).all()}
        fits = _Fits(demand)
        out = PlacementPreview()
        for name in request.nodes:  # a thousand nodes: plain tuples, no per-row attributes
            row = rows.get(name)
            if row is not None and fits(row):
                out.scores[name] = fits.score(row)
            else:
                out.failed[name] = _reason(row, demand)
        return out

    async def _demand(self, conn: AsyncConnection, spec: ClaimSpec) -> Demand:
        provisioner = await read_class(conn, spec.class_name)
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


class _Fits:
    """Whether a `_candidates` row (a tuple) can host the demand, and its score there."""

    def __init__(self, demand: Demand) -> None:
        self.need_mib = demand.node_free_needed
        self.count = demand.count
        self.spread = demand.node_policy is PlacementPolicy.SPREAD

    def __call__(self, row: tuple[Any, ...]) -> bool:
        _name, schedulable, ready, free_mib, selected, fitting, _total = row
        return bool(schedulable and ready and selected) and (
            free_mib >= self.need_mib and fitting >= self.count
        )

    def score(self, row: tuple[Any, ...]) -> int:
        """spread: the freer the node, the higher; binpack: the fuller, the higher."""
        free_mib, total_mib = row[3], row[6]
        free = free_mib / total_mib if total_mib else 0.0
        return round(MAX_SCORE * (free if self.spread else 1.0 - free))


def _reason(row: tuple[Any, ...] | None, demand: Demand) -> str:
    """Why the node cannot host the demand."""
    if row is None:
        return "not a qshare node (no node agent registered it)"
    _name, schedulable, ready, _free, selected, _fitting, _total = row
    if not schedulable:
        return "cordoned in qshare"
    if not ready:
        return "the node agent's heartbeats stopped (NotReady)"
    if not selected:
        return f"labels do not match {demand.selector}"
    return demand.describe()
