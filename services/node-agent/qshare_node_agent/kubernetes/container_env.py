"""The environment of a container holding several vGPUs: each vGPU names itself and its card
in a variable of its own, and CUDA_VISIBLE_DEVICES lists every card (docs/kubernetes.md,
"Several vGPUs in one container")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from qshare_node_agent.kubernetes.backend import LocalVgpu

VGPU_PREFIX = "QSHARE_VGPU_"
"""`QSHARE_VGPU_<id>=<card uuid>`: one per vGPU the container holds (the interposer's set)."""
VISIBLE = "CUDA_VISIBLE_DEVICES"


def vgpu_variable(vgpu_id: int) -> str:
    return f"{VGPU_PREFIX}{vgpu_id}"


def vgpu_of(name: str) -> int | None:
    """The vGPU id a `QSHARE_VGPU_<id>` variable names; None for any other name."""
    digits = name.removeprefix(VGPU_PREFIX)
    return int(digits) if name.startswith(VGPU_PREFIX) and digits.isdigit() else None


def visible_devices(vgpus: Iterable[LocalVgpu]) -> str:
    """Each card of `vgpus` once, in card-index order, as CUDA_VISIBLE_DEVICES lists them."""
    ordered = sorted(vgpus, key=lambda v: v.card_index)
    return ",".join(dict.fromkeys(v.card_uuid for v in ordered))


def container_env(vgpus: Sequence[LocalVgpu]) -> dict[str, str]:
    """One container's environment for `vgpus`: every vGPU's own variables (its
    `QSHARE_VGPU_<id>` among them), `QSHARE_VGPU` of the first (what an interposer that
    serves one vGPU attaches to) and CUDA_VISIBLE_DEVICES naming every card."""
    env: dict[str, str] = {}
    for vgpu in reversed(vgpus):
        env.update(vgpu.env)
    env[VISIBLE] = visible_devices(vgpus)
    return env
