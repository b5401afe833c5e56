"""The kubelet device plugin (v1beta1) for clusters without DRA: resources `qshare.io/vcore`
(100 devices per card, one per percent) and `qshare.io/vmemory` (one device per
`vmemory_unit_mib` MiB). Each resource has its own socket and registers with the kubelet,
again whenever the kubelet restarts and empties the directory. `Allocate` of vcore finds
the pod the scheduler extender bound (see `pod_match`) and prepares its vGPUs through the
backend under the allocator's vGPU ids; vmemory's `Allocate` only accounts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from qshare.contracts.domain import MAX_CORE_SHARE
from qshare_node_agent import stopping
from qshare_node_agent.kubernetes import pod_match, wire
from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi
from qshare_node_agent.kubernetes.backend import BackendError, CardInfo, LocalVgpu, VgpuBackend
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.kubernetes.container_env import container_env
from qshare_node_agent.kubernetes.sockets import SocketServer

log = logging.getLogger(__name__)
VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
RETRY_REGISTER_S = 1.0
VCORE = "qshare.io/vcore"
VMEMORY = "qshare.io/vmemory"
KUBELET_MAX_MESSAGE = 4 * 1024 * 1024  # the kubelet's gRPC receive limit (grpc's default)


def allocator_key(vgpu_id: object) -> str:
    """The backend key of an allocator vGPU: the node agent applies it under the same key."""
    return f"allocator/{vgpu_id}"


class ResourcePlugin:
    """One resource's device plugin socket, its registration and its ListAndWatch streams."""

    def __init__(
        self,
        settings: KubernetesSettings,
        resource: str,
        devices: Callable[[list[CardInfo]], list[Any]],
        allocate: Callable[[Any, grpc.ServicerContext], Any],
        backend: VgpuBackend,
    ) -> None:
        self.settings = settings
        self.resource = resource
        self.endpoint = f"qshare-{resource.split('/')[1]}.sock"
        self._devices = devices
        self._backend = backend
        self._changed = threading.Condition()
        self._version = 0
        self._stopping = threading.Event()
        self._register_wanted = threading.Event()
        self.registrations = 0
        self._registrar: threading.Thread | None = None
        impl = {
            "GetDevicePluginOptions": self._options,
            "ListAndWatch": self._list_and_watch,
            "GetPreferredAllocation": self._preferred,
            "Allocate": allocate,
            "PreStartContainer": self._pre_start,
        }
        handler = wire.service_handler(wire.api(wire.DEVICE_PLUGIN), "DevicePlugin", impl)
        self.server = SocketServer(
            settings.device_plugin_dir / self.endpoint,
            [handler],
            settings.workers,
            settings.socket_check_s,
            on_recreate=self._register_wanted.set,
        )

    def start(self) -> None:
        self._stopping.clear()
        self.server.start()
        self._register_wanted.set()
        self._registrar = threading.Thread(target=self._register_loop, daemon=True)
        self._registrar.start()

    def stop(self) -> None:
        self._stopping.set()
        self._register_wanted.set()
        self.cards_changed()
        if self._registrar is not None:
            self._registrar.join()
        self.server.stop()

    def cards_changed(self) -> None:
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    # -- registration with the kubelet ---------------------------------------------------
    def register(self) -> None:
        api = wire.api(wire.DEVICE_PLUGIN)
        target = wire.unix_target(self.settings.device_plugin_dir / KUBELET_SOCKET)
        with grpc.insecure_channel(target) as channel:
            call = wire.stub(api, "Registration", channel)["Register"]
            request = api.message(
                "RegisterRequest",
                version=VERSION,
                endpoint=self.endpoint,
                resource_name=self.resource,
                options=api.message("DevicePluginOptions"),
            )
            call(request, timeout=5)
        self.registrations += 1

    def _register_loop(self) -> None:
        while True:
            self._register_wanted.wait()
            if self._stopping.is_set():
                return
            self._register_wanted.clear()
            try:
                self.register()
            except grpc.RpcError as exc:
                log.warning("registering %s with the kubelet failed: %s", self.resource, exc.code())
                self._stopping.wait(RETRY_REGISTER_S)
                self._register_wanted.set()

    # -- the DevicePlugin service ------------------------------------------------------------
    def _options(self, request: Any, context: grpc.ServicerContext) -> Any:
        return wire.api(wire.DEVICE_PLUGIN).message("DevicePluginOptions")

    def _list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        api = wire.api(wire.DEVICE_PLUGIN)
        seen = -1
        while context.is_active() and not self._stopping.is_set():
            version = self._next_version(seen)
            if version == seen or self._stopping.is_set():  # stopping bumps the version too
                continue
            seen = version
            devices = self._devices(self._backend.cards())
            response = api.message("ListAndWatchResponse", devices=devices)
            self._check_size(response.ByteSize())
            yield response

    def _check_size(self, size: int) -> None:
        """A list over the kubelet's message limit is refused by it: say what to change."""
        if size <= KUBELET_MAX_MESSAGE:
            return
        log.error(
            "the %s device list is %d bytes, over the kubelet's %d-byte message limit, so the "
            "kubelet cannot take it; raise QSHARE_K8S_VMEMORY_UNIT_MIB (and the extender's "
            "QSHARE_EXTENDER_VMEMORY_UNIT_MIB, to the same value) to at least %d",
            self.resource, size, KUBELET_MAX_MESSAGE,
            -(-self.settings.vmemory_unit_mib * size // KUBELET_MAX_MESSAGE),
        )  # fmt: skip

    def _next_version(self, seen: int) -> int:
        """The device list's version once it differs from `seen` (or after a second)."""
        with self._changed:
            self._changed.wait_for(lambda: self._version != seen, timeout=1.0)
            return self._version

    def _preferred(self, request: Any, context: grpc.ServicerContext) -> Any:
        return wire.api(wire.DEVICE_PLUGIN).message("PreferredAllocationResponse")

    def _pre_start(self, request: Any, context: grpc.ServicerContext) -> Any:
        return wire.api(wire.DEVICE_PLUGIN).message("PreStartContainerResponse")


class DevicePlugin:
    """Both resources. Use `start()` / `stop()`; the backend is shared with the node agent."""

    def __init__(self, settings: KubernetesSettings, backend: VgpuBackend, api: KubeApi) -> None:
        self.settings = settings
        self.backend = backend
        self.api = api
        self.vcore = ResourcePlugin(
            settings, VCORE, self._core_devices, self._allocate_vcore, backend
        )
        self.vmemory = ResourcePlugin(
            settings, VMEMORY, self._memory_devices, self._allocate_vmemory, backend
        )
        self._unwatch: Callable[[], None] | None = None

    def start(self) -> None:
        for plugin in (self.vcore, self.vmemory):
            plugin.start()
        self._unwatch = self.backend.watch_cards(lambda _cards: self._changed())

    def stop(self) -> None:
        """Idempotent: a second call finds nothing left to stop. Every step runs though an
        earlier one raised (each failure logged by name)."""
        unwatch, self._unwatch = self._unwatch, None
        stopping.each([
            ("the device plugin's card watch", lambda: unwatch() if unwatch else None),
            *((f"the {p.resource} device plugin", p.stop) for p in (self.vcore, self.vmemory)),
        ])  # fmt: skip

    def _changed(self) -> None:
        for plugin in (self.vcore, self.vmemory):
            plugin.cards_changed()

    def _core_devices(self, cards: list[CardInfo]) -> list[Any]:
        return [_device(c, f"{c.uuid}-c{n}") for c in cards for n in range(MAX_CORE_SHARE)]

    def _memory_devices(self, cards: list[CardInfo]) -> list[Any]:
        unit = self.settings.vmemory_unit_mib
        return [_device(c, f"{c.uuid}-m{n}") for c in cards for n in range(c.memory_mib // unit)]

    # -- Allocate ----------------------------------------------------------------------------
    def _allocate_vcore(self, request: Any, context: grpc.ServicerContext) -> Any:
        api = wire.api(wire.DEVICE_PLUGIN)
        response = api.message("AllocateResponse")
        for container in request.container_requests:
            try:
                vgpus = self.allocate(len(container.devices_ids))
            except (pod_match.NoPodError, BackendError, ApiError) as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            except Exception as exc:  # never let one odd pod take the plugin's answer down
                log.exception("Allocate failed")
                context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
            response.container_responses.append(_container_response(api, vgpus))
        return response

    def _allocate_vmemory(self, request: Any, context: grpc.ServicerContext) -> Any:
        api = wire.api(wire.DEVICE_PLUGIN)
        response = api.message("AllocateResponse")
        for _ in request.container_requests:
            response.container_responses.add()
        return response

    def allocate(self, vcores: int) -> list[LocalVgpu]:
        """Take the bound pod asking `vcores` and prepare its vGPUs, all for its one qshare
        container (the extender places a pod with one)."""
        pod = pod_match.take(self.api, self.settings.node_name, vcores, self.settings.node_name)
        if not pod.vgpus:
            raise BackendError(f"pod {pod.namespace}/{pod.name} names no vGPU")
        return [
            self.backend.prepare(allocator_key(v.id), v.index, v.priority, v.vcore, v.vmemory_mib)
            for v in pod.vgpus
        ]

    def sweep(self) -> list[str]:
        """Release allocator vGPUs of pods that are gone or finished; returns their keys.
        What is prepared is read before the pods are listed: a vGPU prepared meanwhile (an
        `Allocate` for a pod the list may predate) is not a candidate."""
        prepared = [k for k in self.backend.prepared() if k.startswith("allocator/")]
        pods = self.api.pods_on_node(self.settings.node_name)
        live = {
            allocator_key(v.id)
            for pod in pods
            if pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
            for v in _annotated(pod)
        }
        gone = [k for k in prepared if k not in live]
        for key in gone:
            self.backend.release(key)
        return gone


def _annotated(pod: dict[str, Any]) -> list[Any]:
    try:
        return pod_match._parse(pod)
    except (pod_match.NoPodError, KeyError):
        return []


def _device(card: CardInfo, device_id: str) -> Any:
    api = wire.api(wire.DEVICE_PLUGIN)
    device = api.message("Device", ID=device_id, health="Healthy" if card.healthy else "Unhealthy")
    if card.numa_node is not None:
        device.topology.nodes.add(ID=card.numa_node)
    return device


def _container_response(api: wire.Api, vgpus: list[LocalVgpu]) -> Any:
    """One container's answer for all its vGPUs: their environment (container_env), and
    each mount and device node once (the interposer and the control nodes are every vGPU's)."""
    out = api.message("ContainerAllocateResponse")
    out.envs.update(container_env(vgpus))
    for m in dict.fromkeys(m for v in vgpus for m in v.mounts):
        out.mounts.add(container_path=m.container_path, host_path=m.host_path,
                       read_only=m.read_only)  # fmt: skip
    for path in dict.fromkeys(p for v in vgpus for p in v.device_nodes):
        out.devices.add(container_path=path, host_path=path, permissions="rw")
    out.annotations["qshare.io/vgpu"] = ",".join(str(v.vgpu_id) for v in vgpus)
    return out
