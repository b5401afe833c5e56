"""Both plugins behind one start/stop, as the node agent runs them."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from qshare_driver.node import Policy
from qshare_node_agent.kubernetes import plugins as plugins_module
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.local_vgpus import LocalVgpus
from qshare_node_agent.kubernetes.plugins import KubernetesPlugins
from qshare_node_agent.kubernetes_wiring import AgentPlugins

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


def test_stopping_both_plugins_twice_is_harmless(
    settings: KubernetesSettings, backend: LocalVgpus, kubelet: KubeletDouble
) -> None:
    settings.device_plugin_dir.mkdir(parents=True)
    kubelet.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    plugins = KubernetesPlugins(settings, backend, sweep_s=0.05)
    plugins.start()
    plugins.stop()
    plugins.stop()
    assert not settings.dra_socket.exists()


def broken() -> None:
    raise RuntimeError("broken (injected)")


def test_a_plugin_whose_stop_raises_leaves_the_others_to_stop(
    settings: KubernetesSettings,
    backend: LocalVgpus,
    kubelet: KubeletDouble,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The device plugin's stop raising used to skip the DRA plugin's: its sockets stayed,
    its threads ran on. In the DRA plugin, a watch whose stop raises leaves its servers."""
    settings.device_plugin_dir.mkdir(parents=True)
    kubelet.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    plugins = KubernetesPlugins(settings, backend, sweep_s=0.05)
    plugins.start()
    assert plugins.device_plugin is not None
    real_stops = [plugins.device_plugin.stop, plugins.dra._slice_watch.stop]
    plugins.device_plugin.stop = broken  # type: ignore[method-assign]
    plugins.dra._slice_watch.stop = broken  # type: ignore[method-assign]
    plugins.stop()
    assert not settings.dra_socket.exists()
    assert not settings.registration_socket.exists()
    assert "the device plugin failed (RuntimeError('broken (injected)'))" in caplog.text
    assert "the ResourceSlice watch failed" in caplog.text
    for stop in real_stops:  # what the test left running
        stop()


def test_a_device_plugin_whose_stop_raises_leaves_the_other_to_stop(
    settings: KubernetesSettings,
    backend: LocalVgpus,
    kubelet: KubeletDouble,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """qshare.io/vcore's stop raising used to skip qshare.io/vmemory's: its socket stayed."""
    settings.device_plugin_dir.mkdir(parents=True)
    kubelet.serve_device_registration(settings.device_plugin_dir / "kubelet.sock")
    plugins = KubernetesPlugins(settings, backend, sweep_s=0.05)
    plugins.start()
    assert plugins.device_plugin is not None
    vcore = plugins.device_plugin.vcore
    real_stop = vcore.stop
    vcore.stop = broken  # type: ignore[method-assign]
    vmemory = settings.device_plugin_dir / "qshare-vmemory.sock"
    assert vmemory.exists()
    plugins.stop()
    assert not vmemory.exists()
    assert "the qshare.io/vcore device plugin failed" in caplog.text
    real_stop()


def test_the_node_label_names_the_card_policy(
    settings: KubernetesSettings, backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}}}
    apiserver.put_object("/api/v1/nodes/node-a", node)
    plugins = KubernetesPlugins(settings, backend)
    assert plugins.node_policy() is None
    node["metadata"]["labels"]["qshare.io/policy"] = "bs"
    assert plugins.node_policy() is Policy.BURST_SHARE
    plugins.api.close()


def test_a_node_label_naming_no_policy_is_logged_once_and_read_as_none(
    settings: KubernetesSettings,
    backend: LocalVgpus,
    apiserver: ApiServerDouble,
    caplog: pytest.LogCaptureFixture,
) -> None:
    labels = {"qshare.io/policy": "fastest"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": labels}}
    apiserver.put_object("/api/v1/nodes/node-a", node)
    plugins = KubernetesPlugins(settings, backend)
    assert [plugins.node_policy(), plugins.node_policy()] == [None, None]
    logged = [r.getMessage() for r in caplog.records if "'fastest'" in r.getMessage()]
    assert len(logged) == 1 and "qshare.io/policy" in logged[0]
    plugins.api.close()


def test_a_node_the_api_server_does_not_know_has_no_policy_label(
    settings: KubernetesSettings, backend: LocalVgpus, apiserver: ApiServerDouble
) -> None:
    plugins = KubernetesPlugins(settings, backend)
    assert plugins.node_policy() is None
    plugins.api.close()


def test_a_node_label_naming_no_policy_read_by_two_threads_at_once_is_logged_once(
    settings: KubernetesSettings,
    backend: LocalVgpus,
    apiserver: ApiServerDouble,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent reads the label at start and in its card loop, which may overlap: each saw
    the value not yet logged and both logged it (a flaky `make test`). A log call waits for
    the other thread's (at most 1 s), so both would log if both got that far."""
    labels = {"qshare.io/policy": "fastest"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": labels}}
    apiserver.put_object("/api/v1/nodes/node-a", node)
    plugins = KubernetesPlugins(settings, backend)
    both, logged = threading.Barrier(2), []

    def warning(message: str, *args: object) -> None:
        logged.append(message % args)
        with contextlib.suppress(threading.BrokenBarrierError):
            both.wait(1.0)

    monkeypatch.setattr(plugins_module.log, "warning", warning)
    readers = [threading.Thread(target=plugins.node_policy) for _ in range(2)]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join(10)
    assert len(logged) == 1
    plugins.api.close()


def test_the_node_labels_to_register_are_read_with_the_policy_and_a_broken_value_is_left_out(
    settings: KubernetesSettings,
    backend: LocalVgpus,
    apiserver: ApiServerDouble,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Only the keys named are taken; a value no registration holds (over 63 characters:
    only a broken API server sends one) is left out and logged, not sent to be refused."""
    labels = {"pool": "training", "zone": "z" * 64, "team": "ml", "qshare.io/policy": "fs"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": labels}}
    apiserver.put_object("/api/v1/nodes/node-a", node)
    agent = AgentPlugins(KubernetesPlugins(settings, backend), backend, None, ("pool", "zone"))
    try:
        assert agent.read_node() == (Policy.FIXED_SHARE, {"pool": "training"})
    finally:
        agent.plugins.api.close()
    assert "node label zone=" in caplog.text and "not registered" in caplog.text
