"""Gives back the claims of pods that are gone, and the leftovers of binds: every claim bind
made (tenant `k8s:<ns>`, idempotency key `k8s-pod-<uid>[.<attempt>]`) whose pod no longer
exists or has finished is deleted through the allocator, and so is one older than
`settle_after_s` that its live pod does not hold (the pod is unbound, or bound naming another
claim in `qshare.io/claim`): the claim of a bind that failed, or whose Binding's outcome
stayed unknown and was not applied. One list of pods per namespace per sweep."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from typing import Any

from sqlalchemy import func, select

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
CLAIM = "qshare.io/claim"
"""The pod annotation naming the claim its bind made."""
FINISHED = ("Succeeded", "Failed")
LIVE = (ClaimStatus.PENDING.value, ClaimStatus.PLACED.value, ClaimStatus.READY.value)
"""Claims still to delete when their pod is gone (a `releasing` one is deleted already)."""


class Reaper:
    def __init__(self, res: Resources) -> None:
        self._res = res

    async def sweep(self) -> list[uuid.UUID]:
        """Delete the claims of gone or finished pods and settled leftovers; returns their
        ids."""
        by_namespace: dict[str, list[Any]] = defaultdict(list)
        for row in await self._pod_claims():
            by_namespace[row.tenant.removeprefix(TENANT_PREFIX)].append(row)
        grace = self._res.settings.extender.settle_after_s
        released: list[uuid.UUID] = []
        async with Kube(self._res.settings.extender) as kube:
            for namespace, held in by_namespace.items():
                live = await _live_pods(kube, namespace)
                for row in held:
                    if not _held(live.get(_pod_uid(row.idempotency_key)), row, grace):
                        await self._delete(row.id, namespace)
                        released.append(row.id)
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
        age = func.extract("epoch", func.now() - claims.c.created_at).label("age_s")
        query = select(claims.c.id, claims.c.tenant, claims.c.idempotency_key, age).where(
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


async def _live_pods(kube: Kube, namespace: str) -> dict[str, dict[str, Any]]:
    """The namespace's pods that have not finished, by uid."""
    pods = await kube.pods(namespace)
    return {
        str(p.get("metadata", {}).get("uid")): p
        for p in pods
        if p.get("status", {}).get("phase") not in FINISHED
    }


def _pod_uid(key: str) -> str:
    """The pod uid in a bind's key (`k8s-pod-<uid>` or `k8s-pod-<uid>.<attempt>`)."""
    return key.removeprefix(KEY_PREFIX).split(".", 1)[0]


def _held(pod: dict[str, Any] | None, row: Any, grace_s: float) -> bool:
    """Whether claim `row` may still be `pod`'s: the pod is live and either the claim is
    younger than the grace (a bind may be under way with it) or the pod is bound naming it."""
    if pod is None:
        return False
    if float(row.age_s) < grace_s:
        return True
    meta = pod.get("metadata") or {}
    named = (meta.get("annotations") or {}).get(CLAIM)
    return bool((pod.get("spec") or {}).get("nodeName")) and named == str(row.id)
