"""A node agent's start says which prepared claims its restore could not keep: their
containers lose their vGPUs, which the log must not count among those kept."""

from __future__ import annotations

import logging

import pytest

from qshare.contracts.domain import Priority
from qshare_driver.node import Node
from qshare_node_agent.converge import Converger
from qshare_node_agent.kubernetes import checkpoint
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.local_vgpus import FIRST_LOCAL_ID, node_checkpoint
from qshare_node_agent.kubernetes_wiring import start_plugins

from .conftest import CARDS

LOST = "dra/0b5e8c1a-1111-4222-8333-444455556666/gpu/gpu-7/whole"


def test_a_claim_the_restore_drops_is_logged_as_lost_not_as_kept(
    plugin_env: KubernetesSettings, node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    gone_card = checkpoint.Entry(
        key=LOST, vgpu_id=FIRST_LOCAL_ID, card_index=7, priority=Priority.LOW,
        core_share=10, memory_mib=1024,
    )  # fmt: skip
    checkpoint.save(node_checkpoint(node), node.name, [checkpoint.entry_json(gone_card)])
    with caplog.at_level(logging.INFO):
        plugins = start_plugins(Converger(node, {c.uuid: c for c in CARDS}), CARDS)
    plugins.stop()
    assert [r.levelno for r in caplog.records if LOST in r.getMessage()] == [logging.ERROR]
    assert "(0 prepared claims kept)" in caplog.text
