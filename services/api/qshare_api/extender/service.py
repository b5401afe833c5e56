"""Filter, prioritize and bind, through the allocator: filter and prioritize ask it for a
read-only placement preview; bind creates the pod's claim on the chosen node, annotates the
pod with its vGPUs and binds it (undoing the claim if a later step fails and the pod is
known not to be bound; a Binding whose outcome stays unknown keeps the claim for the
reaper to settle)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from nats.aio.client import Client
from pydantic import ValidationError

from qshare.contracts import rpc, subjects
from qshare.contracts.claims import (
    ClaimSpec,
    ClaimView,
    CreateClaim,
    CreateClaimReply,
    DeleteClaim,
)
from qshare.contracts.domain import ClaimStatus
from qshare.contracts.errors import QshareError
from qshare.contracts.placement import PlacementPreview, PreviewPlacement
from qshare_api.extender import pods
from qshare_api.extender.cache import PreviewCache
from qshare_api.extender.kube import Kube, KubeError, PodReplaced
from qshare_api.extender.reaper import CLAIM, KEY_PREFIX
from qshare_api.extender.schemas import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    host_priorities,
)
from qshare_api.extender.settings import ExtenderSettings

VGPUS = "qshare.io/vgpus"
BIND_TIME = "qshare.io/bind-time"
REREADS = 3
REREAD_WAIT_S = 0.5
"""Reads of the pod, this far apart, that settle a Binding whose answer was lost."""


class BindUnsettled(KubeError):
    """The Binding may have been applied and the pod could not be read to tell: its claim
    and annotations are kept (the reaper settles them: `Reaper.sweep`)."""


class Extender:
    def __init__(
        self,
        settings: ExtenderSettings,
        nc: Client,
        source: str,
        timeout_s: float,
        cache: PreviewCache,
    ) -> None:
        self.settings = settings
        self._nc = nc
        self._source = source
        self._timeout = timeout_s
        self._cache = cache

    async def preview(self, args: ExtenderArgs) -> PlacementPreview | None:
        """None for a pod that asks nothing of qshare (every node passes)."""
        if not pods.wants_qshare(args.pod):
            return None
        names = args.candidate_names()
        uid = pods.uid(args.pod)
        if uid and (cached := self._cache.get(uid, names)) is not None:
            return cached
        spec = pods.claim_spec(args.pod, self.settings.vmemory_unit_mib)
        request = _preview_request(spec, names)
        preview = await rpc.call(
            self._nc, subjects.PLACEMENT_PREVIEW, self._source, request, PlacementPreview,
            timeout=self._timeout,
        )  # fmt: skip
        if uid:
            self._cache.put(uid, preview)
        return preview

    async def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        try:
            preview = await self.preview(args)
        except (pods.PodError, QshareError) as exc:
            return ExtenderFilterResult(error=str(exc))
        names = args.candidate_names()
        fits = names if preview is None else [n for n in names if n in preview.scores]
        failed = {} if preview is None else preview.failed
        if args.node_names is not None:
            return ExtenderFilterResult(node_names=fits, failed_nodes=failed)
        return ExtenderFilterResult(nodes=args.node_objects(set(fits)), failed_nodes=failed)

    async def prioritize(self, args: ExtenderArgs) -> bytes:
        """The `HostPriority` list as JSON, written directly: a thousand hosts built as
        models first cost more than the preview itself."""
        try:
            preview = await self.preview(args)
        except (pods.PodError, QshareError):
            preview = None
        scores = {} if preview is None else preview.scores
        return host_priorities([(n, scores.get(n, 0)) for n in args.candidate_names()])

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        try:
            async with Kube(self.settings) as kube:
                await self._bind(kube, args)
        except (pods.PodError, QshareError, KubeError) as exc:
            return ExtenderBindingResult(error=f"pod {args.pod_namespace}/{args.pod_name}: {exc}")
        return ExtenderBindingResult()

    async def _bind(self, kube: Kube, args: ExtenderBindingArgs) -> None:
        """Claim, annotate and bind the pod instance the scheduler means (`PodUID`). A pod
        already bound to the node by an earlier bind is left as it is; a pod deleted or
        re-created under its name since the scheduler chose the node is not written, and its
        claim is given back (the new instance is scheduled on its own, under its own uid)."""
        pod = await kube.pod(args.pod_namespace, args.pod_name)
        uid = _instance(pod, args)
        if _bound_by_us(pod, args.node):
            return
        claim = await self._create(pod, args, uid)
        started = time.monotonic()
        try:
            await kube.annotate(args.pod_namespace, args.pod_name, uid, _notes(claim))
            self._in_time(started, claim)
            await _bind_pod(kube, args, uid)
        except BindUnsettled as exc:
            raise BindUnsettled(f"{exc}; its claim {claim.id} is kept until settled") from None
        except KubeError as exc:
            await self._delete(claim, args.pod_namespace)
            if not isinstance(exc, PodReplaced):
                await _forget(kube, args, uid)
            raise

    def _in_time(self, started: float, claim: ClaimView) -> None:
        """Refuse to send a Binding so late that the reaper may already take the claim for
        a leftover (`settle_after_s`; an API server applies a Binding within its own request
        timeout, a minute by default, so half the grace is left for that)."""
        if time.monotonic() - started > self.settings.settle_after_s / 2:
            raise KubeError(f"took too long to bind with claim {claim.id}; giving it back")

    async def _create(self, pod: dict[str, Any], args: ExtenderBindingArgs, uid: str) -> ClaimView:
        """A new claim for this attempt (its key names the pod, and the attempt, so that a
        pod whose earlier bind gave its claim back can still get one)."""
        key = f"{KEY_PREFIX}{uid}.{time.time_ns()}"
        spec = pods.claim_spec(pod, self.settings.vmemory_unit_mib, key=key)
        spec = spec.model_copy(update={"node_selector": {self.settings.node_label: args.node}})
        command = CreateClaim(tenant=_tenant(args.pod_namespace), spec=spec)
        reply = await rpc.call(
            self._nc, subjects.CLAIMS_CREATE, self._source, command, CreateClaimReply,
            timeout=self._timeout,
        )  # fmt: skip
        claim = reply.claim
        if claim.status not in (ClaimStatus.PLACED, ClaimStatus.READY):
            await self._delete(claim, args.pod_namespace)
            raise KubeError(f"no longer fits on node {args.node}: {claim.reason}")
        return claim

    async def _delete(self, claim: ClaimView, namespace: str) -> None:
        command = DeleteClaim(claim_id=claim.id, tenant=_tenant(namespace))
        await rpc.call(
            self._nc, subjects.CLAIMS_DELETE, self._source, command, ClaimView,
            timeout=self._timeout,
        )  # fmt: skip


def _instance(pod: dict[str, Any], args: ExtenderBindingArgs) -> str:
    """The uid of the pod instance to bind: the scheduler's, which the pod read must carry."""
    found = pods.uid(pod)
    uid = args.pod_uid or found
    if not uid:
        raise pods.PodError("the pod has no metadata.uid")
    if found != uid:
        raise PodReplaced(f"was re-created (uid {found}) since it was scheduled (uid {uid})")
    return uid


def _bound_by_us(pod: dict[str, Any], node: str) -> bool:
    """True when an earlier bind already bound the pod to `node` with its claim; a pod bound
    anywhere else, or without a claim, is an error (it is not ours to bind)."""
    bound = pods.node_name(pod)
    if not bound:
        return False
    if bound == node and CLAIM in pods.notes_of(pod):
        return True
    raise KubeError(f"is already assigned to node {bound}")


async def _bind_pod(kube: Kube, args: ExtenderBindingArgs, uid: str) -> None:
    """Bind; a 409 Conflict, or an answer that never came or came from a failing server
    (the Binding may have been applied), is settled by reading the pod again: bound to the
    node already (by this try or an earlier one whose answer was lost) is success, another
    instance is `PodReplaced`, anything else the error itself."""
    try:
        await kube.bind(args.pod_namespace, args.pod_name, uid, args.node)
    except KubeError as exc:
        if exc.status != 409 and 0 < exc.status < 500:
            raise
        now = await _read_again(kube, args, exc)
        if now is None or pods.uid(now) != uid:
            why = f"was deleted or re-created under its name before binding ({exc})"
            raise PodReplaced(why) from None
        if pods.node_name(now) != args.node:
            raise


async def _read_again(
    kube: Kube, args: ExtenderBindingArgs, lost: KubeError
) -> dict[str, Any] | None:
    """The pod as it is now (None: none of the name), read up to REREADS times; when every
    read fails, `BindUnsettled`: the Binding may have been applied."""
    for attempt in range(REREADS):
        try:
            return await kube.pod_or_none(args.pod_namespace, args.pod_name)
        except KubeError as exc:
            failed = exc
            if attempt + 1 < REREADS:
                await asyncio.sleep(REREAD_WAIT_S)
    raise BindUnsettled(
        f"the Binding's answer was lost ({lost}) and reading the pod again failed ({failed})"
    )


async def _forget(kube: Kube, args: ExtenderBindingArgs, uid: str) -> None:
    """Take the given-back claim's annotations off the pod (when they got there), so no
    device plugin takes the pod by a claim that is gone; a failure is the bind's own error's
    to report, not this clean-up's."""
    cleared: dict[str, str | None] = dict.fromkeys((VGPUS, CLAIM, BIND_TIME))
    with contextlib.suppress(KubeError):
        await kube.annotate(args.pod_namespace, args.pod_name, uid, cleared)


def _preview_request(spec: ClaimSpec, names: list[str]) -> PreviewPlacement:
    """The allocator's preview request; candidates it does not take (too many, a name
    with a NUL) are the scheduler's request at fault, answered in `Error`, not with a 500."""
    try:
        return PreviewPlacement(spec=spec, nodes=names)
    except ValidationError as exc:
        err = exc.errors()[0]
        if err["type"] == "too_long":
            most = (err.get("ctx") or {}).get("max_length")
            raise pods.PodError(f"at most {most} candidate nodes, got {len(names)}") from None
        where = ".".join(str(p) for p in err["loc"])
        raise pods.PodError(f"candidate {where}: {err['msg']}") from None


def _tenant(namespace: str) -> str:
    return f"k8s:{namespace}"


def _notes(claim: ClaimView) -> dict[str, str]:
    vgpus = [v.model_dump(mode="json") for v in claim.vgpus]
    return {VGPUS: json.dumps(vgpus), CLAIM: str(claim.id), BIND_TIME: f"{time.time_ns():020d}"}
