"""The DRA kubelet plugin of driver `qshare.io`: registers with the kubelet, serves
NodePrepareResources / NodeUnprepareResources (v1 and v1beta1) and, unless turned off, the
resource-health stream (`HealthStreams`), and publishes this node's cards as a ResourceSlice
(an unhealthy card's device tainted), republished when a card's health or policy changes
and when the slice is deleted (a starting kubelet wipes its node's slices; `SliceWatch`).

Prepare reads the claim's allocation from the claims held by LIST + WATCH (`ClaimCache`;
a GET to the API server when the claim is not held yet), asks the backend for one vGPU per
allocated share (idempotent by claim, request, device and share), all in one step, writes
the claim's CDI spec and answers with its CDI device ids once the vGPUs are saved. Every
save of the checkpoint is a group commit on the server's loop (`GroupCommit`), shared by the
prepares and unprepares served together. The order (vGPUs, CDI
spec, one checkpoint write naming every vGPU of the claim) means a crash leaves the claim
in the checkpoint whole or not at all; a restart destroys local vGPUs it does not name, and
the plugin's start removes the CDI specs of claims it does not name.
Each claim gets its own answer or error; a claim that fails gives back what this call made.
Calls naming the same claim (pods sharing it) are served one after another (`ClaimLocks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from qshare_driver.node import Policy
from qshare_node_agent import stopping
from qshare_node_agent.kubernetes import cdi, health, resourceslice, wire
from qshare_node_agent.kubernetes.allocation import (
    UNSHARED,
    ClaimError,
    DeviceShare,
    check_reference,
    check_uid,
    shares,
)
from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi
from qshare_node_agent.kubernetes.backend import (
    BackendError,
    CardInfo,
    LocalVgpu,
    VgpuBackend,
    VgpuWanted,
)
from qshare_node_agent.kubernetes.claim_cache import ClaimCache
from qshare_node_agent.kubernetes.claim_locks import ClaimLocks
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.group_commit import GroupCommit
from qshare_node_agent.kubernetes.health import HealthStreams
from qshare_node_agent.kubernetes.registration import Registration
from qshare_node_agent.kubernetes.slice_watch import SliceWatch
from qshare_node_agent.kubernetes.sockets import LoopSocketServer, SocketServer

log = logging.getLogger(__name__)
SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
RETRY_PUBLISH_S = 2.0


class DraPlugin:
    """Use `start()` / `stop()`; thread-safe; the backend is shared with the node agent."""

    def __init__(self, settings: KubernetesSettings, backend: VgpuBackend, api: KubeApi) -> None:
        self.settings = settings
        self.backend = backend
        self.api = api
        self.claims = ClaimCache(api)
        self.cdi = cdi.CdiWriter(settings.cdi_dir)
        self.commits = GroupCommit(backend.save)
        self._claim_locks = ClaimLocks()
        self.health = HealthStreams(backend.cards, settings.node_name, settings.health_resend_s)
        served = SERVICES + (health.supported_services() if settings.health_service else [])
        self.registration = Registration(
            "DRAPlugin", settings.driver, str(settings.dra_socket), served
        )
        self._unhealthy_since = resourceslice.UnhealthySince()
        self._dates_adopted = False
        self.generation = 0
        self._card_mib = _card_mib(backend.cards())  # kept current by the card watch
        self._publish_wanted = threading.Event()
        self._stopping = threading.Event()
        self._publisher: threading.Thread | None = None
        self._unwatch: Callable[[], None] | None = None
        name = resourceslice.slice_name(settings.node_name, settings.driver)
        self._slice_watch = SliceWatch(api, name, self._publish_wanted.set)
        self._servers = [
            LoopSocketServer(
                settings.dra_socket, self._dra_handlers(), settings.workers, settings.socket_check_s
            ),
            SocketServer(
                settings.registration_socket,
                [self.registration.handler()],
                2,
                settings.socket_check_s,
                on_recreate=self._publish_wanted.set,
            ),
        ]

    def start(self) -> None:
        """Call once the backend is restored: the specs of claims it does not hold go first."""
        self._stopping.clear()
        self._remove_stale_specs()
        self.claims.start()
        for server in self._servers:
            server.start()
        self._unwatch = self.backend.watch_cards(self._cards_changed)
        self._publish_wanted.set()
        self._publisher = threading.Thread(
            target=self._publish_loop, name="resourceslice", daemon=True
        )
        self._publisher.start()  # it starts the slice watch once the slice is published

    def stop(self) -> None:
        """Idempotent: a second call finds nothing left to stop. Every step runs though an
        earlier one raised (each failure logged by name)."""
        unwatch, self._unwatch = self._unwatch, None
        self._stopping.set()
        self._publish_wanted.set()
        publisher = self._publisher
        stopping.each([
            ("the card watch", lambda: unwatch() if unwatch is not None else None),
            ("the ResourceSlice publisher", lambda: publisher.join() if publisher else None),
            ("the ResourceSlice watch", self._slice_watch.stop),
            *((f"serving {server.path}", server.stop) for server in self._servers),
            ("the ResourceClaim watch", self.claims.stop),
        ])  # fmt: skip

    def _remove_stale_specs(self) -> None:
        """A plugin that died after writing a claim's spec and before saving its vGPUs left
        a spec naming vGPUs the restore destroyed (nobody was answered): it goes, and so do
        the temporary files of spec writes it was killed in."""
        removed = self.cdi.remove_claims_except(self.prepared_claims())
        if removed:
            log.warning("removed the CDI specs of claims no checkpoint names: %s", removed)
        left = self.cdi.remove_temporaries()
        if left:
            log.warning("removed temporary CDI files writes killed mid-way left: %s", left)

    def _cards_changed(self, cards: list[CardInfo]) -> None:
        self._card_mib = _card_mib(cards)
        self._publish_wanted.set()
        self.health.changed()

    # -- ResourceSlice -----------------------------------------------------------------
    def publish(self) -> dict[str, Any]:
        """Publish the slice now (a new pool generation) and return what was sent."""
        self._adopt_taint_dates()
        self.generation += 1
        cards = self.backend.cards()
        body = resourceslice.resource_slice(
            self.settings.node_name,
            self.settings.driver,
            cards,
            self.settings.min_vgpu_mib,
            self.generation,
            self._taints(cards),
        )
        self.generation = self.api.apply_resource_slice(body)
        return body

    def _adopt_taint_dates(self) -> None:
        """Once, before the first publish: the taint dates of the slice an earlier run left
        (a failed read raises, and the publish is tried again)."""
        if self._dates_adopted:
            return
        name = resourceslice.slice_name(self.settings.node_name, self.settings.driver)
        published = self.api.resource_slice(name)
        if published is not None:
            self._unhealthy_since.adopt(published)
        self._dates_adopted = True

    def _taints(self, cards: list[CardInfo]) -> dict[int, dict[str, str]]:
        """The unhealthy cards' taints by index, each dated when its card was first seen
        unhealthy (by this agent, or by its run before: `_adopt_taint_dates`)."""
        effect = self.settings.unhealthy_taint_effect
        since = self._unhealthy_since.update(cards)
        return {i: resourceslice.unhealthy_taint(effect, t) for i, t in since.items()}

    def _publish_loop(self) -> None:
        while True:
            self._publish_wanted.wait()
            if self._stopping.is_set():
                return
            self._publish_wanted.clear()
            try:
                self.publish()
            except Exception as exc:  # the API's refusal, or an answer it cannot read
                log.warning("publishing the ResourceSlice failed (%r); retrying", exc)
                self._stopping.wait(RETRY_PUBLISH_S)
                self._publish_wanted.set()
                continue
            self._slice_watch.start()  # once published, an absent slice is a wiped one

    # -- gRPC --------------------------------------------------------------------------
    def _dra_handlers(self) -> list[grpc.GenericRpcHandler]:
        impl = {
            "NodePrepareResources": self._prepare_async,
            "NodeUnprepareResources": self._unprepare_async,
        }
        handlers = [
            wire.service_handler(wire.api(proto), "DRAPlugin", impl)
            for proto in (wire.DRA_V1, wire.DRA_V1BETA1)
        ]
        return handlers + (self.health.handlers() if self.settings.health_service else [])

    async def _prepare_async(self, request: Any, context: Any) -> Any:
        """Once no other call prepares or unprepares one of its claims (`ClaimLocks`): a
        claim a call before it prepared is answered as that call left it."""
        uids = [c.uid for c in request.claims]
        return await self._claim_locks.run_holding(uids, lambda: self._prepare_claims(request))

    async def _prepare_claims(self, request: Any) -> Any:
        """On the server's loop when every claim is held (no I/O but the node's own, well
        under a millisecond), in a thread when a claim must be read from the API server;
        answered once a group commit on the loop saved it either way. The held claims are
        taken once, here: one the watch drops meanwhile is not read again on the loop."""
        held = self._held_claims(request)
        if None in held.values():
            response, staged = await asyncio.to_thread(self._prepare_all, request, held)
        else:
            response, staged = self._prepare_all(request, held)
        if not staged:  # nothing made: nothing to wait for
            return response
        try:
            await self.commits.durable()
        except Exception as exc:
            log.error("saving the prepared claims failed: %s", exc)
            self._fail_unsaved(request, response, staged, exc)
        return response

    async def _unprepare_async(self, request: Any, context: Any) -> Any:
        """Runs once no other call prepares or unprepares one of its claims."""
        uids = [c.uid for c in request.claims]
        return await self._claim_locks.run_holding(uids, lambda: self._unprepare(request))

    async def _unprepare(self, request: Any) -> Any:
        """Release every claim's vGPUs in memory, then await one group commit, shared with
        the prepares and unprepares of the same turn, that saves them all; a claim's spec
        goes once the checkpoint no longer names it. A claim the driver refused one vGPU of
        is saved too, as what stays prepared of it (its error set: the kubelet's retry, or a
        restarted agent's, finds the rest). A save that fails fails every claim of the call
        (the kubelet asks again; the retry, with nothing left to release, saves)."""
        response = _api_of(request).message("NodeUnprepareResourcesResponse")
        touched = [c for c in request.claims if self._release_claim(c, response)]
        if not touched:
            return response
        try:
            await self.commits.durable()
        except Exception as exc:
            log.error("saving the unprepared claims failed: %s", exc)
            failed = OSError(f"its release could not be saved: {exc}")
            for claim in touched:
                if not response.claims[claim.uid].error:  # a refusal says more
                    _refuse(response.claims[claim.uid], claim, failed)
        else:
            halved = [c for c in touched if response.claims[c.uid].error]
            self._remove_specs([c for c in touched if c not in halved], response)
            for claim in halved:
                self._respec(claim.uid)
        return response

    def _respec(self, uid: str) -> None:
        """Rewrite the spec of a claim part released to name only the vGPUs that stay (with
        the policies it recorded): a gone vGPU's id may be another claim's next, and a
        checkpoint rebuilt from the specs would then give that vGPU to both. One that cannot
        be rewritten is logged (the claim's retry removes it)."""
        prefix, owner = f"dra/{uid}/", _owner(uid)
        stays = [v for k, v in self.backend.prepared().items() if k.startswith(prefix)]
        try:
            recorded = cdi.recorded_in(self.cdi.path(owner), "")
            asked = {v.key: r.policy for v in stays if (r := recorded.get(v.vgpu_id)) and r.policy}
            self.cdi.write(owner, stays, asked)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.error("the CDI spec of claim %s, part released, was not rewritten: %r", uid, exc)

    def _remove_specs(self, claims: list[Any], response: Any) -> None:
        """The specs of claims whose release is saved; one that cannot go is the claim's error."""
        for claim in claims:
            try:
                self.cdi.remove(_owner(claim.uid))
            except OSError as exc:
                _refuse(response.claims[claim.uid], claim, exc)

    def _release_claim(self, claim: Any, response: Any) -> bool:
        """Release the claim's vGPUs, not yet saved; True when the checkpoint must be saved
        for it: all released, or some before the driver refused one (the claim's error set;
        the refused one stays prepared, for a retry). False when a reference is refused or
        the driver refused the first: nothing changed."""
        released = 0
        try:
            check_uid(claim.uid)
            self.claims.forget(claim.uid)
            prefix = f"dra/{claim.uid}/"
            for key in [k for k in self.backend.prepared() if k.startswith(prefix)]:
                self.backend.release(key, durable=False)
                released += 1
        except (ClaimError, BackendError, OSError) as exc:
            _refuse(response.claims[claim.uid], claim, exc)
            return released > 0
        return True

    def _held_claims(self, request: Any) -> dict[str, dict[str, Any] | None]:
        """Each claim of the request as the cache holds it now, by uid (None: a miss)."""
        held: dict[str, dict[str, Any] | None] = {}
        for c in request.claims:
            if c.uid not in held:
                held[c.uid] = self.claims.get(c.namespace, c.name, c.uid)
        return held

    def _prepare_all(
        self, request: Any, held: dict[str, dict[str, Any] | None]
    ) -> tuple[Any, dict[str, _Staged]]:
        """The answer to every claim of the request, and what was made for each claim;
        a claim not `held` is read from the API server (blocking: not on the loop)."""
        response = _api_of(request).message("NodePrepareResourcesResponse")
        staged: dict[str, _Staged] = {}
        for claim in request.claims:
            if claim.uid in response.claims:  # named twice: one answer per claim
                continue
            answer = response.claims[claim.uid]
            try:
                check_reference(claim.namespace, claim.name, claim.uid)
                body = held.get(claim.uid) or self._read_claim(claim.namespace, claim.name)
                made = staged[claim.uid] = self._prepare(body, claim.uid)
            except Exception as exc:
                _refuse(answer, claim, exc)
                continue
            for share, vgpu in made.vgpus:
                _answer_device(answer, share, self.settings.node_name, vgpu)
        return response, staged

    def _fail_unsaved(
        self, request: Any, response: Any, staged: dict[str, _Staged], exc: Exception
    ) -> None:
        """Claims whose save failed get an error and give back what this call made."""
        for claim in request.claims:
            made = staged.get(claim.uid)
            if made is not None:
                self._give_back(made)
                answer = response.claims[claim.uid]
                del answer.devices[:]
                _refuse(answer, claim, OSError(f"its vGPUs could not be saved: {exc}"))

    # -- claims ------------------------------------------------------------------------
    def _prepare(self, claim: dict[str, Any], uid: str) -> _Staged:
        """All or nothing, in memory: the caller must `backend.save()` (the group commit),
        and give back what was made if that fails, before answering."""
        wanted = shares(
            claim,
            uid,
            self.settings.driver,
            self.settings.node_name,
            self._card_mib,
            self.settings.min_vgpu_mib,
        )
        vgpus, new = self.backend.prepare_all([_wanted(uid, s) for s in wanted], durable=False)
        made = _Staged(uid, list(zip(wanted, vgpus, strict=True)), new)
        try:
            self.cdi.write(_owner(uid), vgpus, _policies(uid, wanted))
        except Exception:
            self._give_back(made)
            raise
        return made

    def _give_back(self, made: _Staged) -> None:
        """Release what this prepare made; a claim prepared before (nothing new: a claim
        is prepared whole or not at all) keeps its vGPUs and its spec."""
        if not made.new:
            return
        with _logged(f"removing the CDI spec of claim {made.uid}"):
            self.cdi.remove(_owner(made.uid))
        for key in made.new:
            with _logged(f"releasing {key}"):  # a failed save still releases it in memory
                self.backend.release(key)

    def _read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.api.resource_claim(namespace, name)
        except ApiError as exc:
            if exc.status == 404:
                raise ClaimError(f"ResourceClaim {namespace}/{name} does not exist") from None
            raise

    def prepared_claims(self) -> set[str]:
        return {k.split("/")[1] for k in self.backend.prepared() if k.startswith("dra/")}

    def cards(self) -> list[CardInfo]:
        return self.backend.cards()


def _card_mib(cards: list[CardInfo]) -> dict[int, int]:
    return {c.index: c.memory_mib for c in cards}


@dataclass
class _Staged:
    """What one prepare made for a claim: its vGPUs, `new` the keys it created."""

    uid: str
    vgpus: list[tuple[DeviceShare, LocalVgpu]]
    new: list[str]


def _wanted(uid: str, share: DeviceShare) -> VgpuWanted:
    config = share.config
    return VgpuWanted(share.key(uid), share.card_index, config.priority, share.cores,
                      share.memory_mib, config.policy)  # fmt: skip


def _policies(uid: str, wanted: list[DeviceShare]) -> dict[str, str]:
    """The card policy each share's config asks (by vGPU key), as the checkpoint records it."""
    return {
        s.key(uid): Policy.parse(s.config.policy).label
        for s in wanted
        if s.config.policy is not None
    }


def _answer_device(answer: Any, share: DeviceShare, pool: str, vgpu: LocalVgpu) -> None:
    """One prepared device in a claim's answer; v1 also names the share (v1beta1 has no field).
    Its request is named as a container names it: the main request of a subrequest (the
    kubelet hands a container the devices whose `request_names` hold its request as it is)."""
    device = answer.devices.add(
        request_names=[share.request.partition("/")[0]],
        pool_name=pool,
        device_name=share.device,
        cdi_device_ids=[cdi.qualified(cdi.device_name(vgpu.key))],
    )
    if share.share_id != UNSHARED and "share_id" in device.DESCRIPTOR.fields_by_name:
        device.share_id = share.share_id


def _refuse(answer: Any, claim: Any, exc: Exception) -> None:
    """The claim's error: a refusal or a failed write names what is wrong; anything else
    means a claim shaped unlike any ResourceClaim, and is logged."""
    where = f"claim {claim.namespace}/{claim.name} ({claim.uid})"
    if isinstance(exc, ClaimError | BackendError | ApiError | OSError):
        answer.error = f"{where}: {exc}"
        return
    log.error("preparing claim %s failed", claim.uid, exc_info=exc)
    answer.error = f"{where} cannot be read: {type(exc).__name__}: {exc}"


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    try:
        yield
    except (BackendError, OSError) as exc:
        log.error("%s failed: %s", what, exc)


def _owner(uid: str) -> str:
    return f"{cdi.CLAIM_OWNER}{uid}"


def _api_of(request: Any) -> wire.Api:
    v1 = request.DESCRIPTOR.file.package == wire.api(wire.DRA_V1).package
    return wire.api(wire.DRA_V1 if v1 else wire.DRA_V1BETA1)
