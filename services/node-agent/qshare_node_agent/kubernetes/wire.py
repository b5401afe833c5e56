"""The kubelet's gRPC wire types, compiled from our .proto files with grpcio-tools on first use.

Each proto file is loaded into its own descriptor pool, so the APIs' like-named messages
(`Device`, `Claim`) never meet.
Servers and stubs are built generically from the descriptors, so nothing generated is kept.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from grpc_tools import protoc

PROTO_DIR = Path(__file__).parent / "protos"

REGISTRATION = "pluginregistration_v1.proto"
DRA_V1 = "dra_v1.proto"
DRA_V1BETA1 = "dra_v1beta1.proto"
DEVICE_PLUGIN = "deviceplugin_v1beta1.proto"
DRA_HEALTH_V1 = "dra_health_v1.proto"
DRA_HEALTH_V1ALPHA1 = "dra_health_v1alpha1.proto"


class ProtoCompileError(RuntimeError):
    """protoc rejected one of our proto files."""


@dataclass(frozen=True)
class Method:
    name: str
    path: str  # /package.Service/Method
    request: type[Any]
    response: type[Any]
    server_streaming: bool


@dataclass(frozen=True)
class Api:
    """One proto file: its message classes by short name and its services' methods."""

    package: str
    messages: Mapping[str, type[Any]]
    services: Mapping[str, Mapping[str, Method]]

    def message(self, message_name: str, /, **fields: Any) -> Any:
        return self.messages[message_name](**fields)

    def service_name(self, service: str) -> str:
        return f"{self.package}.{service}"


def _compile(proto: str, out_dir: Path) -> descriptor_pb2.FileDescriptorSet:
    out = out_dir / (proto + ".pb")
    argv = ["protoc", f"-I{PROTO_DIR}", f"--descriptor_set_out={out}", str(PROTO_DIR / proto)]
    if protoc.main(argv) != 0:
        raise ProtoCompileError(f"protoc could not compile {PROTO_DIR / proto}")
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@functools.cache
def api(proto: str) -> Api:
    """The compiled API of `proto` (one of the module's file constants), built once."""
    with tempfile.TemporaryDirectory(prefix="qshare-protos-") as tmp:
        files = _compile(proto, Path(tmp))
    pool = descriptor_pool.DescriptorPool()
    for file_proto in files.file:
        pool.Add(file_proto)
    file = pool.FindFileByName(proto)
    messages = {
        name: message_factory.GetMessageClass(desc)
        for name, desc in file.message_types_by_name.items()
    }
    services = {
        name: {m.name: _method(file.package, name, m, messages) for m in svc.methods}
        for name, svc in file.services_by_name.items()
    }
    return Api(file.package, messages, services)


def _method(package: str, service: str, m: Any, messages: Mapping[str, type[Any]]) -> Method:
    return Method(
        name=m.name,
        path=f"/{package}.{service}/{m.name}",
        request=messages[m.input_type.name],
        response=messages[m.output_type.name],
        server_streaming=bool(m.server_streaming),
    )


def service_handler(
    a: Api, service: str, implementations: Mapping[str, Callable[..., Any]]
) -> grpc.GenericRpcHandler:
    """A gRPC handler serving `service` of `a` with `implementations[method](request, context)`."""
    handlers = {}
    for name, method in a.services[service].items():
        impl = implementations.get(name)
        if impl is None:
            continue
        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[name] = make(
            impl,
            request_deserializer=method.request.FromString,
            response_serializer=method.response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(a.service_name(service), handlers)


def stub(a: Api, service: str, channel: grpc.Channel) -> dict[str, Any]:
    """Client callables for every method of `service`, by method name."""
    calls: dict[str, Any] = {}
    for name, method in a.services[service].items():
        make = channel.unary_stream if method.server_streaming else channel.unary_unary
        calls[name] = make(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
    return calls


def unix_target(path: Path) -> str:
    return f"unix://{path.resolve()}"
