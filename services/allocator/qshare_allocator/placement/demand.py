"""What one claim needs from one node, after the cluster's defaults and the claim's overrides."""

from __future__ import annotations

from dataclasses import dataclass, field

from qshare.contracts.domain import MAX_CORE_SHARE, PlacementPolicy, Priority, Provisioner
from qshare.contracts.errors import InvalidInput
from qshare.contracts.quantities import format_mib
from qshare.settings import ClusterSettings


@dataclass(frozen=True)
class Demand:
    """`count` distinct cards on one node, each giving `vmemory_mib` and `vcore` at `priority`.

    A `whole` demand takes empty cards entirely (all memory, core share 100).
    """

    priority: Priority
    vcore: int
    vmemory_mib: int
    count: int
    whole: bool = False
    selector: dict[str, str] = field(default_factory=dict)
    node_policy: PlacementPolicy = PlacementPolicy.SPREAD
    card_policy: PlacementPolicy = PlacementPolicy.SPREAD

    @property
    def node_free_needed(self) -> int:
        """A node with less free memory than this cannot host the claim."""
        return 1 if self.whole else self.vmemory_mib * self.count

    @property
    def card_vcore(self) -> int:
        return MAX_CORE_SHARE if self.whole else self.vcore

    def describe(self) -> str:
        """Why nothing fits, in words (the Pending claim's reason)."""
        cards = "1 healthy card" if self.count == 1 else f"{self.count} healthy cards on one node"
        shape = "empty" if self.whole else f"with {format_mib(self.vmemory_mib)} free"
        core = "" if self.whole else f", {self.vcore}% {self.priority.value} core share free"
        where = (
            f"a Ready node matching {quoted_selector(self.selector)}"
            if self.selector
            else "a Ready node"
        )
        return f"no capacity: needs {cards} {shape}{core} and a free vGPU slot, on {where}"


MAX_REASON_SELECTOR = 200
"""The selector is quoted in a reason only up to this many characters."""


def quoted_selector(selector: dict[str, str]) -> str:
    text = ",".join(f"{k}={v}" for k, v in selector.items())
    return text if len(text) <= MAX_REASON_SELECTOR else text[:MAX_REASON_SELECTOR] + "…"


def check_granularity(vmemory_mib: int, provisioner: Provisioner, rules: ClusterSettings) -> None:
    """Refuse slices smaller than the cluster's minimum (whole cards ignore vmemory)."""
    if provisioner is Provisioner.QSHARE and vmemory_mib < rules.min_vgpu_mib:
        raise InvalidInput.on(
            "vmemory", f"must be at least {format_mib(rules.min_vgpu_mib)} per vGPU"
        )
