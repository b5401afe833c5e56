"""The environment of a container holding several vGPUs: each vGPU names itself and its card
in a variable of its own, and its card's index in another, from which the interposer lists
every card in CUDA_VISIBLE_DEVICES (docs/kubernetes.md, "Several vGPUs in one container")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qshare_node_agent.kubernetes.backend import LocalVgpu

VGPU_PREFIX = "QSHARE_VGPU_"
"""`QSHARE_VGPU_<id>=<card uuid>`: one per vGPU the container holds (the interposer's set)."""
VISIBLE = "CUDA_VISIBLE_DEVICES"
VISIBLE_PREFIX = "QSHARE_VISIBLE_"
"""`QSHARE_VISIBLE_<card index>=<card uuid>`: one per card of the container's vGPUs, the same
for every vGPU on that card; the interposer sets CUDA_VISIBLE_DEVICES from them when nothing
else set it (native/cuda/visible.c)."""


def vgpu_variable(vgpu_id: int) -> str:
    return f"{VGPU_PREFIX}{vgpu_id}"


def visible_variable(card_index: int) -> str:
    return f"{VISIBLE_PREFIX}{card_index}"


def vgpu_of(name: str) -> int | None:
    """The vGPU id a `QSHARE_VGPU_<id>` variable names; None for any other name."""
    digits = name.removeprefix(VGPU_PREFIX)
    return int(digits) if name.startswith(VGPU_PREFIX) and digits.isdigit() else None


def visible_devices(vgpus: Iterable[LocalVgpu]) -> str:
    """Each card of `vgpus` once, in card-index order, as CUDA_VISIBLE_DEVICES lists them."""
    ordered = sorted(vgpus, key=lambda v: v.card_index)
    return ",".join(dict.fromkeys(v.card_uuid for v in ordered))


def container_env(vgpus: Sequence[LocalVgpu]) -> dict[str, str]:
    """One container's environment for `vgpus` (all it holds, in one answer, as the device
    plugin's Allocate gives them): every vGPU's own variables (its `QSHARE_VGPU_<id>` and
    its card's `QSHARE_VISIBLE_<index>` among them), `QSHARE_VGPU` of the first (what an
    interposer that serves one vGPU attaches to) and CUDA_VISIBLE_DEVICES naming every card,
    the list the interposer would make of them, there for a process it does not serve."""
    env: dict[str, str] = {}
    for vgpu in reversed(vgpus):
        env.update(vgpu.env)
    env[VISIBLE] = visible_devices(vgpus)
    return env
