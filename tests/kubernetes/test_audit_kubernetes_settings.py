"""The Kubernetes settings that name API paths and kubelet socket files (the node's name,
the driver's) are refused at load unless they are DNS names, as Kubernetes names are."""

from __future__ import annotations

import pytest

from qshare.envsettings import SettingsError
from qshare_node_agent.settings import load_agent_settings


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
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "node-a")
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        load_agent_settings({"name": "node-a", "simulate": "1"})
    assert [p.split("=")[0] for p in err.value.problems] == [variable]


def test_a_dotted_node_name_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "ip-10-0-0-1.ec2.internal")
    _, k8s = load_agent_settings({"name": "ip-10-0-0-1.ec2.internal", "simulate": "1"})
    assert k8s is not None and k8s.node_name == "ip-10-0-0-1.ec2.internal"
