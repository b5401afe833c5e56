"""Invariants of the inventory checked by SQL over its state: no card oversubscribed, no claim
placed twice or partly. The benchmark reports them; the concurrency tests assert them."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

OVERCOMMITTED_CARDS = text("""
SELECT count(*) FROM (
  SELECT g.uuid FROM gpus g LEFT JOIN vgpus v ON v.gpu_uuid = g.uuid
  GROUP BY g.uuid, g.memory_mib, g.max_vgpus
  HAVING coalesce(sum(v.vmemory_mib), 0) > g.memory_mib
      OR coalesce(sum(v.vcore) FILTER (WHERE v.priority = 'high'), 0) > 100
      OR coalesce(sum(v.vcore) FILTER (WHERE v.priority = 'low'), 0) > 100
      OR count(v.id) > g.max_vgpus
) AS over
""")

# A placed claim holds exactly `count` vGPUs on one node; any other claim holds none.
DOUBLE_PLACEMENTS = text("""
SELECT count(*) FROM (
  SELECT c.id FROM claims c LEFT JOIN vgpus v ON v.claim_id = c.id
  WHERE c.status IN ('placed', 'ready')
  GROUP BY c.id, c.count HAVING count(v.id) <> c.count OR count(DISTINCT v.node_name) > 1
  UNION ALL
  SELECT v.claim_id FROM vgpus v JOIN claims c ON c.id = v.claim_id
  WHERE c.status NOT IN ('placed', 'ready')
) AS wrong
""")


async def overcommitted_cards(conn: AsyncConnection) -> int:
    return int((await conn.execute(OVERCOMMITTED_CARDS)).scalar_one())


async def double_placements(conn: AsyncConnection) -> int:
    return int((await conn.execute(DOUBLE_PLACEMENTS)).scalar_one())
