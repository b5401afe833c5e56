"""Both plugins behind one start/stop, as the node agent runs them."""

from __future__ import annotations

import time

from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from qshare_node_agent.kubernetes.plugins import KubernetesPlugins

from .doubles import ApiServerDouble, KubeletDouble

SLICE = "/apis/resource.k8s.io/v1/resourceslices/node-a-qshare-io"


def test_the_agent_starts_and_stops_both_plugins_together(
    settings: KubernetesSettings,
    backend: LocalVgpus,
    kubelet: KubeletDouble,
    apiserver: ApiServerDouble,
) -> None:
    settings.device_plugin_dir.mkdir(parents=True)
    kubelet.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    plugins = KubernetesPlugins(settings, backend, sweep_s=0.05)
    plugins.start()
    deadline = time.monotonic() + 5
    while (len(kubelet.device_plugins) < 2 or SLICE not in apiserver.objects) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert kubelet.register_plugin(settings.registration_socket).name == "qshare.io"
    assert {r.resource_name for r in kubelet.device_plugins} == {
        "qshare.io/vcore",
        "qshare.io/vmemory",
    }
    assert SLICE in apiserver.objects
    plugins.stop()
    assert not settings.dra_socket.exists()
    assert not (settings.device_plugin_dir / "qshare-vcore.sock").exists()
