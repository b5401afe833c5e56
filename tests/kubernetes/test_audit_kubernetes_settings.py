"""The Kubernetes settings that name API paths and kubelet socket files (the node's name,
the driver's) are refused at load unless they are DNS names, as Kubernetes names are."""

from __future__ import annotations

import pytest

from qshare.envsettings import SettingsError
from qshare_node_agent.settings import load_agent_settings


def refused_variables(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> list[str]:
    """The variables named by the refusal of a node agent `node-a` serving the kubelet, with
    `variable` set to `value`."""
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "node-a")
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        load_agent_settings({"name": "node-a", "simulate": "1"})
    return [p.split("=")[0] for p in err.value.problems]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("QSHARE_K8S_NODE_NAME", "node a"),
        ("QSHARE_K8S_NODE_NAME", "../namespaces/kube-system"),
        ("QSHARE_K8S_NODE_NAME", "node-a&fieldSelector=x"),
        ("QSHARE_K8S_NODE_NAME", "Node-A"),
        ("QSHARE_K8S_DRIVER", "../../etc/qshare.io"),
    ],
)
def test_a_kubernetes_name_that_is_no_dns_name_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    assert refused_variables(monkeypatch, variable, value) == [variable]


def test_a_dotted_node_name_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "ip-10-0-0-1.ec2.internal")
    _, k8s = load_agent_settings({"name": "ip-10-0-0-1.ec2.internal", "simulate": "1"})
    assert k8s is not None and k8s.node_name == "ip-10-0-0-1.ec2.internal"


def test_an_agent_named_otherwise_than_its_kubernetes_node_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The allocator knows the node by the agent's name, the extender and the device plugin
    by the Kubernetes node's: with two names no device-plugin pod is ever taken (its vGPUs
    name a node the plugin takes for another)."""
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "node-a")
    with pytest.raises(SettingsError) as err:
        load_agent_settings({"name": "node-b", "simulate": "1"})
    assert err.value.problems == [
        "--name='node-b': the node agent serving the kubelet is named as its Kubernetes node "
        "(QSHARE_K8S_NODE_NAME='node-a')"
    ]


@pytest.mark.parametrize("variable", ["QSHARE_K8S_SOCKET_CHECK_S", "QSHARE_K8S_API_TIMEOUT_S"])
@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_a_wait_too_long_for_the_clock_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """A wait past what a thread or socket can wait raises OverflowError where it is used:
    the socket keeper's thread would die at its first check (the kubelet's sockets never
    served again after it restarts), every API request would fail."""
    assert refused_variables(monkeypatch, variable, value) == [variable]
