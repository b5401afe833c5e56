"""The node agent's side of the Kubernetes plugins: one backend over the agent's segment, so
the DRA plugin and the device plugin drive the same vGPUs the agent applies, never a second
set. A device-plugin pod runs in the allocator's vGPU (placed by the scheduler extender,
applied by this agent); a DRA claim gets a vGPU prepared on the node (ids at or above 2^31).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from qshare.contracts.claims import LabelValue
from qshare.contracts.domain import POLICY_LABEL, CardPolicy, Priority
from qshare.envsettings import load
from qshare_driver.node import Policy
from qshare_node_agent.asked_sharing import SharingKeeper
from qshare_node_agent.converge import Converger
from qshare_node_agent.discovery import Card
from qshare_node_agent.kubernetes import cdi
from qshare_node_agent.kubernetes.backend import (
    BackendError,
    CardInfo,
    CardWatcher,
    LocalVgpu,
    Prepared,
    VgpuWanted,
)
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from qshare_node_agent.kubernetes.plugins import KubernetesPlugins
from qshare_node_agent.segment import UNKNOWN

log = logging.getLogger(__name__)
LABEL_VALUE: TypeAdapter[str] = TypeAdapter(LabelValue)
ALLOCATOR_KEY = "allocator/"
APPLY_WAIT_S = 5.0
"""How long Allocate waits for the allocator's vGPU to be applied here: the extender binds a
pod once its claim is placed, so the kubelet can ask before the apply arrives, and a failed
Allocate fails the pod's admission for good (the kubelet does not ask again)."""


class AgentBackend:
    """`VgpuBackend` for the plugins: allocator vGPUs come from what the agent applied."""

    def __init__(
        self, local: LocalVgpus, converger: Converger, apply_wait_s: float = APPLY_WAIT_S
    ) -> None:
        self._local = local
        self._converger = converger
        self._apply_wait_s = apply_wait_s

    def cards(self) -> list[CardInfo]:
        return self._local.cards()

    def watch_cards(self, watcher: CardWatcher) -> Callable[[], None]:
        return self._local.watch_cards(watcher)

    def prepared(self) -> dict[str, LocalVgpu]:
        return self._local.prepared()

    def prepare(
        self,
        key: str,
        card_index: int,
        priority: Priority,
        core_share: int,
        memory_mib: int,
        policy: str | None = None,
        *,
        durable: bool = True,
    ) -> LocalVgpu:
        if not key.startswith(ALLOCATOR_KEY):
            return self._local.prepare(
                key, card_index, priority, core_share, memory_mib, policy, durable=durable
            )
        wanted = key.removeprefix(ALLOCATOR_KEY)
        found = self._converger.wait_for(lambda: self._applied(key, wanted), self._apply_wait_s)
        if found is None:
            raise BackendError(
                f"vGPU {wanted} is not applied on this node yet "
                f"(waited {self._apply_wait_s:g} s for the allocator's apply)"
            )
        return found

    def prepare_all(self, wanted: list[VgpuWanted], *, durable: bool = True) -> Prepared:
        """Local vGPUs only (a DRA claim's): an allocator's vGPU is applied, not prepared."""
        allocators = [w.key for w in wanted if w.key.startswith(ALLOCATOR_KEY)]
        if allocators:
            raise BackendError(f"allocator vGPUs {allocators} are not prepared together")
        return self._local.prepare_all(wanted, durable=durable)

    def _applied(self, key: str, wanted: str) -> LocalVgpu | None:
        """The allocator's vGPU `wanted` as the agent applied it, if it has; an adopted one
        that no apply has named yet (its id the nil UUID) is nobody's."""
        for local_id, vgpu in list(self._converger.held.items()):
            if str(vgpu.id) == wanted and vgpu.id != UNKNOWN:
                index = self._converger.cards[vgpu.gpu].index
                return self._local.describe(key, local_id, index, vgpu.priority, vgpu.vcore,
                                            vgpu.vmemory_mib)  # fmt: skip
        return None

    def save(self) -> None:
        self._local.save()

    def release(self, key: str, *, durable: bool = True) -> None:
        """An allocator vGPU leaves with its claim (the extender's reaper deletes it)."""
        if not key.startswith(ALLOCATOR_KEY):
            self._local.release(key, durable=durable)


@dataclass(frozen=True)
class AgentPlugins:
    """The plugins as the agent runs them, over the backend whose cards they publish."""

    plugins: KubernetesPlugins
    local: LocalVgpus
    sharing: SharingKeeper | None = None
    registered: tuple[str, ...] = ()
    """The keys of the Node's labels the agent registers (QSHARE_K8S_NODE_LABELS)."""

    def read_node(self) -> tuple[Policy | None, dict[str, str]]:
        """The policy the Node's label `qshare.io/policy` names, and those of the Node's
        labels the agent registers that it has (one GET, blocking: the API server). A value
        no registration holds (only a broken API server sends one) is left out, logged."""
        labels = self.plugins.node_labels()
        kept = {k: labels[k] for k in self.registered if k in labels}
        for key, value in list(kept.items()):
            try:
                LABEL_VALUE.validate_python(value)
            except ValidationError as exc:
                log.warning("node label %s=%r not registered: %s", key, value,
                            exc.errors()[0]["msg"])  # fmt: skip
                del kept[key]
        return self.plugins.node_policy(labels), kept

    def take_node_policy(self, policy: Policy | None) -> None:
        """Make `policy` (the node label's) the cards' own, in place of the agent's setting:
        a card it changes takes it now unless a prepared claim asks one of it (the sharing
        asked over REST still wins where it names a policy)."""
        if self.sharing is None:
            return
        own = None if policy is None else CardPolicy(policy.label)
        changed = self.sharing.take_node_policy(own)
        if changed:
            log.info("node label %s: cards %s now have policy %s of their own", POLICY_LABEL,
                     changed, "the agent's" if policy is None else policy.label)  # fmt: skip
            self.local.own_policies_changed(changed)

    def cards_seen(self, unhealthy: Collection[str]) -> None:
        """The agent's periodic reading of the cards (its own loop, not the heartbeats, which
        wait for the allocator): a card whose health or policy changed is published again
        (the ResourceSlice, the device plugin's device lists)."""
        self.local.observe(unhealthy)

    def stop(self) -> None:
        self.plugins.stop()


def start_plugins(converger: Converger, cards: list[Card]) -> AgentPlugins:
    """Restore the prepared claims, start the DRA and device plugins (settings QSHARE_K8S_*;
    prepares hold to the smallest vGPU the ResourceSlice offers, QSHARE_K8S_MIN_VGPU_MIB)."""
    settings = load(KubernetesSettings)
    own = converger.sharing.own_policy if converger.sharing is not None else None
    local = LocalVgpus(converger.node, cards, min_vgpu_mib=settings.min_vgpu_mib, own_policy=own)
    lost = local.restore(lambda: cdi.recorded_vgpus(settings.cdi_dir))
    if lost:
        log.error("prepared vGPUs the restart could not keep, dropped (their claims' "
                  "containers have lost them): %s", lost)  # fmt: skip
    plugins = KubernetesPlugins(settings, AgentBackend(local, converger))
    plugins.start()
    log.info("kubernetes plugins serving for node %s (%d prepared claims kept)",
             settings.node_name, len(plugins.dra.prepared_claims()))  # fmt: skip
    return AgentPlugins(plugins, local, converger.sharing, tuple(settings.node_labels))
