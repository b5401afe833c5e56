"""Finding the node's cards: NVML on a GPU node, or N simulated cards of the driver's
timeline device (tests, `make demo`, the dev stack). Everything above is the same code."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qshare.contracts.quantities import parse_mib
from qshare_node_agent.settings import DEFAULT_SIM_MEMORY, SIMULATE_FORMAT, NodeAgentSettings

log = logging.getLogger(__name__)

SIMULATED_UUIDS = uuid.UUID("5eb1a7ed-0000-4000-8000-000000000000")
"""Namespace of simulated cards' UUIDs: stable per node name and index, in NVIDIA's form
(`GPU-` and a UUID), so the CUDA interposer can match them to the fake driver's devices."""


class DiscoveryError(RuntimeError):
    """No card could be found (no NVML, no GPU, and no --simulate)."""


@dataclass(frozen=True)
class Card:
    """What discovery knows about a card that the driver does not keep."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int | None = None


def discover(settings: NodeAgentSettings) -> list[Card]:
    if settings.simulate is not None:
        return simulated_cards(settings.name, settings.simulate)
    return nvml_cards()


def simulated_cards(node: str, spec: str) -> list[Card]:
    match = SIMULATE_FORMAT.match(spec)
    if match is None:
        raise DiscoveryError(f"bad --simulate {spec!r}: expected N[:MEM]")
    memory = parse_mib(match["memory"] or DEFAULT_SIM_MEMORY)
    return [
        Card(
            index=i,
            uuid=simulated_uuid(node, i),
            model="qshare-simulated",
            memory_mib=memory,
        )
        for i in range(int(match["cards"]))
    ]


def simulated_uuid(node: str, index: int) -> str:
    """The UUID of simulated card `index` of `node` (its model says it is simulated)."""
    return f"GPU-{uuid.uuid5(SIMULATED_UUIDS, f'{node}/{index}')}"


def nvml_cards() -> list[Card]:
    nvml = _nvml()
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise DiscoveryError("NVML found no GPU on this node")
    return [_nvml_card(nvml, i) for i in range(count)]


def _nvml() -> Any:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        raise DiscoveryError(
            "pynvml is not installed: pip install nvidia-ml-py (qshare's gpu extra) on a GPU node, "
            "or use --simulate N on a node without GPUs"
        ) from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml raises NVMLError subclasses without a common import
        raise DiscoveryError(f"NVML could not start ({exc}); use --simulate N") from exc
    return pynvml


def _nvml_card(nvml: Any, index: int) -> Card:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid = nvml.nvmlDeviceGetUUID(handle)
    name = nvml.nvmlDeviceGetName(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
    return Card(index=index, uuid=_text(uuid), model=_text(name)[:128], memory_mib=int(memory))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def unhealthy(settings: NodeAgentSettings, cards: list[Card]) -> list[str]:
    """UUIDs of cards that are unhealthy now."""
    if settings.simulate is not None:
        return _listed_unhealthy(settings.sim_unhealthy_file, cards)
    return _nvml_unhealthy(cards)


def _listed_unhealthy(path: Path | None, cards: list[Card]) -> list[str]:
    if path is None or not path.is_file():
        return []
    listed = set(path.read_text().split())
    return [c.uuid for c in cards if c.uuid in listed]


def _nvml_unhealthy(cards: list[Card]) -> list[str]:
    """A card NVML can no longer query is unhealthy (XID events show up this way too)."""
    nvml = _nvml()
    bad = []
    for card in cards:
        try:
            nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByUUID(card.uuid))
        except Exception:
            bad.append(card.uuid)
    return bad
