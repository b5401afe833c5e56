"""Gives back the claims of pods that are gone: every claim bind made (tenant `k8s:<ns>`,
idempotency key `k8s-pod-<uid>`) whose pod no longer exists or has finished is deleted
through the allocator, one list of pods per namespace per sweep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy import select

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import ClaimView, DeleteClaim
from qshare.contracts.domain import ClaimStatus
from qshare.contracts.errors import QshareError
from qshare.contracts.schema import claims
from qshare_api.extender.kube import Kube, KubeError
from qshare_api.resources import Resources

log = logging.getLogger(__name__)
TENANT_PREFIX = "k8s:"
KEY_PREFIX = "k8s-pod-"
FINISHED = ("Succeeded", "Failed")
LIVE = (ClaimStatus.PENDING.value, ClaimStatus.PLACED.value, ClaimStatus.READY.value)
"""Claims still to delete when their pod is gone (a `releasing` one is deleted already)."""


class Reaper:
    def __init__(self, res: Resources) -> None:
        self._res = res

    async def sweep(self) -> list[uuid.UUID]:
        """Delete the claims of gone or finished pods; returns their ids."""
        by_namespace: dict[str, list[tuple[uuid.UUID, str]]] = defaultdict(list)
        for claim_id, tenant, key in await self._pod_claims():
            by_namespace[tenant.removeprefix(TENANT_PREFIX)].append((claim_id, key))
        released: list[uuid.UUID] = []
        async with Kube(self._res.settings.extender) as kube:
            for namespace, held in by_namespace.items():
                live = await _live_pods(kube, namespace)
                for claim_id, key in held:
                    if key.removeprefix(KEY_PREFIX) not in live:
                        await self._delete(claim_id, namespace)
                        released.append(claim_id)
        return released

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                if released := await self.sweep():
                    log.info("released the claims of finished pods: %s", released)
            except (KubeError, QshareError) as exc:
                log.warning("sweeping the claims of finished pods failed: %s", exc)

    async def _pod_claims(self) -> list[Any]:
        query = select(claims.c.id, claims.c.tenant, claims.c.idempotency_key).where(
            claims.c.tenant.startswith(TENANT_PREFIX),
            claims.c.idempotency_key.startswith(KEY_PREFIX),
            claims.c.status.in_(LIVE),
        )
        async with self._res.reader.connect() as conn:
            return list((await conn.execute(query)).all())

    async def _delete(self, claim_id: uuid.UUID, namespace: str) -> None:
        command = DeleteClaim(claim_id=claim_id, tenant=f"{TENANT_PREFIX}{namespace}")
        with contextlib.suppress(QshareError):  # already gone: nothing to give back
            await rpc.call(
                self._res.nc, subjects.CLAIMS_DELETE, self._res.source, command, ClaimView,
                timeout=self._res.settings.allocator_timeout_s,
            )  # fmt: skip


async def _live_pods(kube: Kube, namespace: str) -> set[str]:
    """The uids of the namespace's pods that have not finished."""
    pods = await kube.pods(namespace)
    return {
        str(p.get("metadata", {}).get("uid"))
        for p in pods
        if p.get("status", {}).get("phase") not in FINISHED
    }
