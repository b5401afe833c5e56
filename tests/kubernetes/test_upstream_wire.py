"""Our .proto files against the kubelet's: every package, service, method and field (name,
number, type) as upstream k8s.io/kubelet defines them, written down by hand from the upstream
files named in docs/kubernetes.md, so a divergence in our protos fails here and not in a
cluster."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from qshare_node_agent.kubernetes import wire

S = "string"
CLAIMS = {"claims": (1, "repeated Claim")}
CLAIM = {"namespace": (1, S), "uid": (2, S), "name": (3, S)}
DRA_METHODS = {
    "NodePrepareResources": ("NodePrepareResourcesRequest", "NodePrepareResourcesResponse"),
    "NodeUnprepareResources": ("NodeUnprepareResourcesRequest", "NodeUnprepareResourcesResponse"),
}
DRA_DEVICE = {
    "request_names": (1, "repeated string"),
    "pool_name": (2, S),
    "device_name": (3, S),
    "cdi_device_ids": (4, "repeated string"),
}


def _dra(package: str, device: dict[str, tuple[int, str]]) -> dict[str, Any]:
    return {
        "package": package,
        "services": {"DRAPlugin": DRA_METHODS},
        "messages": {
            "NodePrepareResourcesRequest": CLAIMS,
            "NodePrepareResourcesResponse": {
                "claims": (1, "map<string, NodePrepareResourceResponse>")
            },
            "NodePrepareResourceResponse": {"devices": (1, "repeated Device"), "error": (2, S)},
            "Device": device,
            "NodeUnprepareResourcesRequest": CLAIMS,
            "NodeUnprepareResourcesResponse": {
                "claims": (1, "map<string, NodeUnprepareResourceResponse>")
            },
            "NodeUnprepareResourceResponse": {"error": (1, S)},
            "Claim": CLAIM,
        },
    }


def _dra_health(package: str) -> dict[str, Any]:
    return {
        "package": package,
        "services": {
            "DRAResourceHealth": {
                "NodeWatchResources": (
                    "NodeWatchResourcesRequest",
                    "stream NodeWatchResourcesResponse",
                )
            }
        },
        "messages": {
            "NodeWatchResourcesRequest": {},
            "DeviceIdentifier": {"pool_name": (1, S), "device_name": (2, S)},
            "DeviceHealth": {
                "device": (1, "DeviceIdentifier"),
                "health": (2, "HealthStatus"),
                "last_updated_time": (3, "int64"),
                "health_check_timeout_seconds": (4, "int64"),
                "message": (5, S),
            },
            "NodeWatchResourcesResponse": {"devices": (1, "repeated DeviceHealth")},
        },
        "enums": {"HealthStatus": {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}},
    }


UPSTREAM: dict[str, dict[str, Any]] = {
    wire.REGISTRATION: {
        "package": "pluginregistration",
        "services": {
            "Registration": {
                "GetInfo": ("InfoRequest", "PluginInfo"),
                "NotifyRegistrationStatus": ("RegistrationStatus", "RegistrationStatusResponse"),
            }
        },
        "messages": {
            "PluginInfo": {
                "type": (1, S),
                "name": (2, S),
                "endpoint": (3, S),
                "supported_versions": (4, "repeated string"),
            },
            "RegistrationStatus": {"plugin_registered": (1, "bool"), "error": (2, S)},
            "RegistrationStatusResponse": {},
            "InfoRequest": {},
        },
    },
    wire.DRA_V1: _dra(
        "k8s.io.kubelet.pkg.apis.dra.v1", DRA_DEVICE | {"share_id": (5, "optional string")}
    ),
    wire.DRA_V1BETA1: _dra("k8s.io.kubelet.pkg.apis.dra.v1beta1", DRA_DEVICE),
    wire.DRA_HEALTH_V1: _dra_health("v1"),
    wire.DRA_HEALTH_V1ALPHA1: _dra_health("v1alpha1"),
    wire.DEVICE_PLUGIN: {
        "package": "v1beta1",
        "services": {
            "Registration": {"Register": ("RegisterRequest", "Empty")},
            "DevicePlugin": {
                "GetDevicePluginOptions": ("Empty", "DevicePluginOptions"),
                "ListAndWatch": ("Empty", "stream ListAndWatchResponse"),
                "GetPreferredAllocation": (
                    "PreferredAllocationRequest",
                    "PreferredAllocationResponse",
                ),
                "Allocate": ("AllocateRequest", "AllocateResponse"),
                "PreStartContainer": ("PreStartContainerRequest", "PreStartContainerResponse"),
            },
        },
        "messages": {
            "DevicePluginOptions": {
                "pre_start_required": (1, "bool"),
                "get_preferred_allocation_available": (2, "bool"),
            },
            "RegisterRequest": {
                "version": (1, S),
                "endpoint": (2, S),
                "resource_name": (3, S),
                "options": (4, "DevicePluginOptions"),
            },
            "Empty": {},
            "ListAndWatchResponse": {"devices": (1, "repeated Device")},
            "TopologyInfo": {"nodes": (1, "repeated NUMANode")},
            "NUMANode": {"ID": (1, "int64")},
            "Device": {"ID": (1, S), "health": (2, S), "topology": (3, "TopologyInfo")},
            "PreStartContainerRequest": {"devices_ids": (1, "repeated string")},
            "PreStartContainerResponse": {},
            "PreferredAllocationRequest": {
                "container_requests": (1, "repeated ContainerPreferredAllocationRequest")
            },
            "ContainerPreferredAllocationRequest": {
                "available_deviceIDs": (1, "repeated string"),
                "must_include_deviceIDs": (2, "repeated string"),
                "allocation_size": (3, "int32"),
            },
            "PreferredAllocationResponse": {
                "container_responses": (1, "repeated ContainerPreferredAllocationResponse")
            },
            "ContainerPreferredAllocationResponse": {"deviceIDs": (1, "repeated string")},
            "AllocateRequest": {"container_requests": (1, "repeated ContainerAllocateRequest")},
            "ContainerAllocateRequest": {"devices_ids": (1, "repeated string")},
            "CDIDevice": {"name": (1, S)},
            "AllocateResponse": {"container_responses": (1, "repeated ContainerAllocateResponse")},
            "ContainerAllocateResponse": {
                "envs": (1, "map<string, string>"),
                "mounts": (2, "repeated Mount"),
                "devices": (3, "repeated DeviceSpec"),
                "annotations": (4, "map<string, string>"),
                "cdi_devices": (5, "repeated CDIDevice"),
            },
            "Mount": {"container_path": (1, S), "host_path": (2, S), "read_only": (3, "bool")},
            "DeviceSpec": {"container_path": (1, S), "host_path": (2, S), "permissions": (3, S)},
        },
    },
}

_SCALARS = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_INT32: "int32",
}


def _type(field: FieldDescriptor) -> str:
    """The field's type as a .proto file writes it."""
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = (_type(message.fields_by_name[n]) for n in ("key", "value"))
        return f"map<{key}, {value}>"
    if field.enum_type is not None:
        base = field.enum_type.name
    else:
        base = message.name if message is not None else _SCALARS[field.type]
    if field.is_repeated:
        return f"repeated {base}"
    if field.has_presence and message is None:
        return f"optional {base}"
    return base


def _signature(m: wire.Method) -> tuple[str, str]:
    streaming = "stream " if m.server_streaming else ""
    return m.request.__name__, streaming + m.response.__name__


def _ours(proto: str) -> dict[str, Any]:
    api = wire.api(proto)
    messages = {
        name: {f.name: (f.number, _type(f)) for f in cls.DESCRIPTOR.fields}
        for name, cls in api.messages.items()
    }
    services = {
        service: {m.name: _signature(m) for m in methods.values()}
        for service, methods in api.services.items()
    }
    file = next(iter(api.messages.values())).DESCRIPTOR.file
    enums = {
        name: {v.name: v.number for v in enum.values}
        for name, enum in file.enum_types_by_name.items()
    }
    return {"package": api.package, "services": services, "messages": messages, "enums": enums}


@pytest.mark.parametrize("proto", sorted(UPSTREAM))
def test_our_proto_package_matches_the_kubelets(proto: str) -> None:
    assert _ours(proto)["package"] == UPSTREAM[proto]["package"]


@pytest.mark.parametrize("proto", sorted(UPSTREAM))
def test_our_proto_services_and_methods_match_the_kubelets(proto: str) -> None:
    assert _ours(proto)["services"] == UPSTREAM[proto]["services"]


@pytest.mark.parametrize("proto", sorted(UPSTREAM))
def test_our_proto_messages_and_field_numbers_match_the_kubelets(proto: str) -> None:
    assert _ours(proto)["messages"] == UPSTREAM[proto]["messages"]


@pytest.mark.parametrize("proto", sorted(UPSTREAM))
def test_our_proto_enums_and_values_match_the_kubelets(proto: str) -> None:
    assert _ours(proto)["enums"] == UPSTREAM[proto].get("enums", {})
