"""Both kubelet plugins of one node agent behind one start/stop: the DRA plugin, the device
plugin (optional) and the device plugin's periodic sweep of finished pods."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from qshare.contracts.domain import POLICY_LABEL
from qshare_driver.node import Policy
from qshare_node_agent import stopping
from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi
from qshare_node_agent.kubernetes.backend import VgpuBackend
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.device_plugin import DevicePlugin
from qshare_node_agent.kubernetes.dra import DraPlugin

log = logging.getLogger(__name__)
SWEEP_S = 30.0


class KubernetesPlugins:
    """`start()` after the backend is restored (`LocalVgpus.restore()`); `stop()` before the
    node segment closes. Thread-based: safe to call from an asyncio agent."""

    def __init__(
        self,
        settings: KubernetesSettings,
        backend: VgpuBackend,
        device_plugin: bool = True,
        sweep_s: float = SWEEP_S,
    ) -> None:
        self.api = KubeApi(
            settings.api_server, settings.token_file, settings.ca_file, settings.api_timeout_s
        )
        self.dra = DraPlugin(settings, backend, self.api)
        self.device_plugin = DevicePlugin(settings, backend, self.api) if device_plugin else None
        self.node_name = settings.node_name
        self._sweep_s = sweep_s
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._bad_label: str | None = None  # the invalid label value logged last
        self._label_lock = threading.Lock()  # the start and the card loop may read at once

    def start(self) -> None:
        self._stop.clear()
        self.dra.start()
        if self.device_plugin is not None:
            self.device_plugin.start()
            self._sweeper = threading.Thread(target=self._sweep, name="pod sweep", daemon=True)
            self._sweeper.start()

    def stop(self) -> None:
        """Every step runs though an earlier one raised (each failure logged by name)."""
        self._stop.set()
        sweeper, self._sweeper = self._sweeper, None
        device_plugin = self.device_plugin
        stopping.each([
            ("the pod sweep", lambda: sweeper.join() if sweeper is not None else None),
            ("the device plugin", lambda: device_plugin.stop() if device_plugin else None),
            ("the DRA plugin", self.dra.stop),
            ("the API server's connections", self.api.close),
        ])  # fmt: skip

    def node_labels(self) -> dict[str, str]:
        """This node's labels in Kubernetes (none without a Node object). Blocking: a GET to
        the API server, whose other failures are raised."""
        try:
            node = self.api.node(self.node_name)
        except ApiError as exc:
            if exc.status == 404:
                return {}
            raise
        labels = node.get("metadata", {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}

    def node_policy(self, labels: Mapping[str, str] | None = None) -> Policy | None:
        """The card policy the node's label `qshare.io/policy` asks for, in `labels` (None:
        read now, `node_labels()`); None for no label, or a value that names no policy,
        logged once per value."""
        value = (self.node_labels() if labels is None else labels).get(POLICY_LABEL)
        with self._label_lock:
            if value is None:
                self._bad_label = None
                return None
            return self._parsed(str(value))

    def _parsed(self, value: str) -> Policy | None:
        """The policy `value` names; None for one naming none, logged once while it stays
        (under the label lock)."""
        try:
            policy = Policy.parse(value)
        except ValueError as exc:
            if value != self._bad_label:
                log.warning("node %s: label %s=%r ignored: %s", self.node_name, POLICY_LABEL,
                            value, exc)  # fmt: skip
            self._bad_label = value
            return None
        self._bad_label = None
        return policy

    def _sweep(self) -> None:
        assert self.device_plugin is not None
        while not self._stop.wait(self._sweep_s):
            try:
                released = self.device_plugin.sweep()
            except Exception as exc:  # the API's refusal, or pods it cannot read: next round
                log.warning("sweeping finished pods failed: %r", exc)
                continue
            if released:
                log.info("released the vGPUs of finished pods: %s", released)
