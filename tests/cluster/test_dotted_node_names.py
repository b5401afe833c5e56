"""A node may be named as Kubernetes names nodes (a DNS subdomain such as EKS's
`ip-10-0-0-1.ec2.internal`): it registers, serves claims and takes part in preemption, and
its subjects carry the name as one token (dots written `~`)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import TypeAdapter, ValidationError

from qshare.contracts import subjects
from qshare.contracts.nodes import NodeName

from .conftest import StartAgent, ready_claim
from .test_preemption import gang_follows_high_priority

EKS_NAME = "ip-10-0-0-1.ec2.internal"


def test_a_dotted_node_name_is_one_subject_token() -> None:
    subject = subjects.heartbeat(EKS_NAME)
    assert subject == "qshare.node.ip-10-0-0-1~ec2~internal.heartbeat"
    assert subjects.node_of(subject) == EKS_NAME


def test_a_gpu_event_subject_gives_back_the_dotted_node() -> None:
    subject = subjects.gpu_event(EKS_NAME, "GPU-1", "busy")
    assert subjects.parse_gpu_event(subject) == (EKS_NAME, "GPU-1", "busy")


@pytest.mark.parametrize("name", ["a..b", ".a", "a.", "a~b", "a b", "x" * 254])
def test_a_node_name_that_is_not_a_dns_subdomain_like_name_is_refused(name: str) -> None:
    with pytest.raises(ValidationError):
        TypeAdapter(NodeName).validate_python(name)


async def test_a_node_named_like_an_eks_host_registers_and_serves_a_claim(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    await start_agent(cards=1, name=EKS_NAME, segment="qs-eks")  # pytest paths are long
    claim = await ready_claim(api)
    assert claim["node"] == EKS_NAME
    node = await api.get(f"/v1/nodes/{EKS_NAME}")
    assert node.status_code == 200, node.text
    assert node.json()["status"] == "Ready"


async def test_high_priority_on_a_dotted_node_suspends_its_low_priority_gang(
    api: httpx.AsyncClient, start_agent: StartAgent
) -> None:
    agent = await start_agent(cards=2, name="gpu-7.rack-2.example", segment="qs-rack")
    await gang_follows_high_priority(api, agent)
