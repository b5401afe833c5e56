"""The scheduler extender's JSON types (k8s.io/kube-scheduler/extender/v1). The scheduler
writes Go field names (`Pod`, `NodeNames`, ...) and reads them case-insensitively; we accept
any case and answer with the Go names."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import to_json


class _GoOut(BaseModel):
    """An answer: built by our code with Python names, written with the Go names."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class _GoJson(_GoOut):
    """A request: any case of the Go names is accepted (the check runs per object, so
    answers, which can hold a thousand hosts, do not inherit it)."""

    @model_validator(mode="before")
    @classmethod
    def _any_case(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        names = {(f.alias or n).lower(): f.alias or n for n, f in cls.model_fields.items()}
        return {names.get(k.lower(), k): v for k, v in data.items()}


class _NodeMeta(BaseModel):
    name: str = Field(min_length=1, max_length=253)


class _Node(BaseModel):
    model_config = ConfigDict(extra="allow")

    metadata: _NodeMeta


class _NodeList(BaseModel):
    model_config = ConfigDict(extra="allow")

    items: list[_Node] = []


class ExtenderArgs(_GoJson):
    pod: dict[str, Any] = Field(alias="Pod")
    nodes: _NodeList | None = Field(None, alias="Nodes")
    node_names: list[Annotated[str, Field(max_length=253)]] | None = Field(None, alias="NodeNames")

    def candidate_names(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        return [n.metadata.name for n in (self.nodes.items if self.nodes else [])]

    def node_objects(self, names: set[str]) -> dict[str, Any]:
        """The given Node objects named in `names`, as a NodeList."""
        items = self.nodes.items if self.nodes else []
        return {"items": [n.model_dump() for n in items if n.metadata.name in names]}


class ExtenderFilterResult(_GoOut):
    nodes: dict[str, Any] | None = Field(None, alias="Nodes")
    node_names: list[str] | None = Field(None, alias="NodeNames")
    failed_nodes: dict[str, str] = Field(default_factory=dict, alias="FailedNodes")
    failed_and_unresolvable: dict[str, str] = Field(
        default_factory=dict, alias="FailedAndUnresolvableNodes"
    )
    error: str = Field("", alias="Error")


class HostPriority(_GoOut):
    host: str = Field(alias="Host")
    score: int = Field(alias="Score")


def host_priorities(scores: list[tuple[str, int]]) -> bytes:
    """`[{"Host": ..., "Score": ...}, ...]`, the JSON of a list of `HostPriority`."""
    return to_json([{"Host": host, "Score": score} for host, score in scores])


class ExtenderBindingArgs(_GoJson):
    pod_name: str = Field(alias="PodName", min_length=1, max_length=253)
    pod_namespace: str = Field(alias="PodNamespace", min_length=1, max_length=63)
    pod_uid: str = Field(alias="PodUID", max_length=64)
    node: str = Field(alias="Node", min_length=1, max_length=253)


class ExtenderBindingResult(_GoOut):
    error: str = Field("", alias="Error")
