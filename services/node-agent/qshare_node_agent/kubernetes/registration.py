"""The kubelet plugin registration service (pluginregistration v1) for one plugin: what the
kubelet's plugin watcher asks when it finds our socket, and its verdict."""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from qshare_node_agent.kubernetes import wire

log = logging.getLogger(__name__)


class Registration:
    def __init__(self, plugin_type: str, name: str, endpoint: str, versions: list[str]) -> None:
        self._info = (plugin_type, name, endpoint, versions)
        self.registered = threading.Event()
        self.error = ""

    def handler(self) -> grpc.GenericRpcHandler:
        impl = {"GetInfo": self._get_info, "NotifyRegistrationStatus": self._notify}
        return wire.service_handler(wire.api(wire.REGISTRATION), "Registration", impl)

    def _get_info(self, request: Any, context: grpc.ServicerContext) -> Any:
        plugin_type, name, endpoint, versions = self._info
        return wire.api(wire.REGISTRATION).message(
            "PluginInfo",
            type=plugin_type,
            name=name,
            endpoint=endpoint,
            supported_versions=versions,
        )

    def _notify(self, status: Any, context: grpc.ServicerContext) -> Any:
        self.error = status.error
        if status.plugin_registered:
            self.registered.set()
        else:
            self.registered.clear()
            log.error("the kubelet refused plugin %s: %s", self._info[1], status.error)
        return wire.api(wire.REGISTRATION).message("RegistrationStatusResponse")
