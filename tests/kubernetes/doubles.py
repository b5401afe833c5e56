"""The kubelet's side as a test double speaking the real wire protocol: `KubeletDouble` calls
our plugins over their unix sockets with the kubelet's gRPC messages and serves kubelet.sock
for device plugin registration. The API server double is `qshare.testing.kube_apiserver`.

The double calls the gRPC services by the names the upstream kubelet uses (`SERVICES`,
written down from k8s.io/kubelet's .proto packages, see docs/kubernetes.md), not by the names
in our .proto files: a plugin serving a wrongly named package answers UNIMPLEMENTED here,
as it would to a real kubelet."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from qshare.testing.kube_apiserver import ApiServerDouble
from qshare_node_agent.kubernetes import wire

__all__ = ["SERVICES", "ApiServerDouble", "KubeletDouble"]

# Full gRPC service names (proto package + service) that the kubelet calls or serves.
SERVICES = {
    (wire.REGISTRATION, "Registration"): "pluginregistration.Registration",
    (wire.DRA_V1, "DRAPlugin"): "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
    (wire.DRA_V1BETA1, "DRAPlugin"): "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
    (wire.DRA_HEALTH_V1, "DRAResourceHealth"): "v1.DRAResourceHealth",
    (wire.DRA_HEALTH_V1ALPHA1, "DRAResourceHealth"): "v1alpha1.DRAResourceHealth",
    (wire.DEVICE_PLUGIN, "Registration"): "v1beta1.Registration",
    (wire.DEVICE_PLUGIN, "DevicePlugin"): "v1beta1.DevicePlugin",
}


def kubelet_stub(proto: str, service: str, channel: grpc.Channel) -> dict[str, Any]:
    """Client callables for `service` of `proto`, at the kubelet's method paths."""
    api = wire.api(proto)
    calls: dict[str, Any] = {}
    for name, method in api.services[service].items():
        make = channel.unary_stream if method.server_streaming else channel.unary_unary
        calls[name] = make(
            f"/{SERVICES[proto, service]}/{name}",
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
    return calls


class KubeletDouble:
    """The kubelet's side of plugin registration, DRA and the device plugin API."""

    def __init__(self) -> None:
        self._channels: list[grpc.Channel] = []
        self.device_plugins: list[Any] = []  # RegisterRequests received on kubelet.sock
        self._server: grpc.Server | None = None

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        if self._server is not None:
            self._server.stop(0).wait()

    def _channel(self, socket: Path) -> grpc.Channel:
        channel = grpc.insecure_channel(wire.unix_target(socket))
        grpc.channel_ready_future(channel).result(timeout=10)
        self._channels.append(channel)
        return channel

    # -- plugin registration (what the plugin watcher does on finding a socket) ----------
    def register_plugin(self, registration_socket: Path, accept: bool = True) -> Any:
        api = wire.api(wire.REGISTRATION)
        calls = kubelet_stub(wire.REGISTRATION, "Registration", self._channel(registration_socket))
        info = calls["GetInfo"](api.message("InfoRequest"), timeout=5)
        status = api.message("RegistrationStatus", plugin_registered=accept)
        if not accept:
            status.error = "refused by the test kubelet"
        calls["NotifyRegistrationStatus"](status, timeout=5)
        return info

    # -- DRA ------------------------------------------------------------------------------
    def dra(self, socket: Path, version: str = wire.DRA_V1) -> tuple[wire.Api, dict[str, Any]]:
        api = wire.api(version)
        return api, kubelet_stub(version, "DRAPlugin", self._channel(socket))

    def prepare(
        self, socket: Path, claims: list[tuple[str, str, str]], version: str = wire.DRA_V1
    ) -> Any:
        api, calls = self.dra(socket, version)
        request = api.message("NodePrepareResourcesRequest")
        for namespace, name, uid in claims:
            request.claims.add(namespace=namespace, name=name, uid=uid)
        return calls["NodePrepareResources"](request, timeout=10)

    def unprepare(
        self, socket: Path, claims: list[tuple[str, str, str]], version: str = wire.DRA_V1
    ) -> Any:
        api, calls = self.dra(socket, version)
        request = api.message("NodeUnprepareResourcesRequest")
        for namespace, name, uid in claims:
            request.claims.add(namespace=namespace, name=name, uid=uid)
        return calls["NodeUnprepareResources"](request, timeout=10)

    def watch_health(
        self, socket: Path, version: str = wire.DRA_HEALTH_V1, timeout: float = 30
    ) -> Iterator[Any]:
        """The kubelet's NodeWatchResources stream of the plugin at `socket`."""
        api = wire.api(version)
        calls = kubelet_stub(version, "DRAResourceHealth", self._channel(socket))
        stream: Iterator[Any] = calls["NodeWatchResources"](
            api.message("NodeWatchResourcesRequest"), timeout=timeout
        )
        return stream

    @staticmethod
    def container_cdi_devices(answer: Any, request: str) -> list[str]:
        """The CDI devices the kubelet gives a container naming `request` of a claim, from
        the claim's prepare answer: a device counts when its `request_names` is empty or
        holds `request` as it is (the kubelet's `cdiDevicesAsList`; a container names a
        request, never a subrequest)."""
        return [
            cdi_id
            for device in answer.devices
            if not device.request_names or request in device.request_names
            for cdi_id in device.cdi_device_ids
        ]

    # -- device plugin ----------------------------------------------------------------------
    def serve_device_registration(self, kubelet_socket: Path) -> None:
        """Serve kubelet.sock: record every RegisterRequest."""
        api = wire.api(wire.DEVICE_PLUGIN)

        def register(request: Any, context: grpc.ServicerContext) -> Any:
            self.device_plugins.append(request)
            return api.message("Empty")

        method = api.services["Registration"]["Register"]
        handler = grpc.method_handlers_generic_handler(
            SERVICES[wire.DEVICE_PLUGIN, "Registration"],
            {
                "Register": grpc.unary_unary_rpc_method_handler(
                    register,
                    request_deserializer=method.request.FromString,
                    response_serializer=method.response.SerializeToString,
                )
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{kubelet_socket}")
        self._server.start()

    def device_plugin(self, socket: Path) -> tuple[wire.Api, dict[str, Any]]:
        api = wire.api(wire.DEVICE_PLUGIN)
        return api, kubelet_stub(wire.DEVICE_PLUGIN, "DevicePlugin", self._channel(socket))

    def list_and_watch(self, socket: Path) -> Iterator[Any]:
        api, calls = self.device_plugin(socket)
        stream: Iterator[Any] = calls["ListAndWatch"](api.message("Empty"), timeout=30)
        return stream
