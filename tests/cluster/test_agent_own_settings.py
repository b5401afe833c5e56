"""The node agent's settings may not take over what the agent decides itself: a label it
sets on its node (placement and the allocator read them as the agent's) is refused in
QSHARE_NODE_LABELS, and every wait is bounded, refused at load naming the variable."""

from __future__ import annotations

import json

import pytest

from qshare.contracts.claims import MAX_LABELS
from qshare.contracts.domain import POLICY_LABEL
from qshare.envsettings import SettingsError
from qshare_node_agent.settings import OWN_LABELS, NodeAgentSettings, load_agent_settings

DURATIONS = sorted(
    name
    for name, field in NodeAgentSettings.model_fields.items()
    if name.endswith("_s") and field.annotation in (float, float | None)
)


def problems(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> list[str]:
    """The problems a simulated agent's settings are refused with, `variable` set to `value`."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as err:
        load_agent_settings({"name": "node-a", "simulate": "1"})
    return err.value.problems


@pytest.mark.parametrize("key", OWN_LABELS)
def test_a_label_the_agent_sets_itself_is_refused_naming_the_variable_and_the_key(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """Before, the operator's value replaced the agent's: `qshare.io/node=node-b` on node-a
    sent claims selecting node-b there, `qshare.io/policy` misstated the cards' policy."""
    labels = json.dumps({key: "node-b", "zone": "a"})
    [problem] = problems(monkeypatch, "QSHARE_NODE_LABELS", labels)
    assert problem.startswith("QSHARE_NODE_LABELS=")
    assert f"label {key} is the node agent's own" in problem


def test_labels_of_the_operators_own_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_NODE_LABELS", json.dumps({"zone": "a", "qshare.io/pool": "x"}))
    settings, _ = load_agent_settings({"name": "node-a", "simulate": "1"})
    assert settings.labels == {"zone": "a", "qshare.io/pool": "x"}


def test_the_register_timeout_is_among_the_durations_checked() -> None:
    assert "register_timeout_s" in DURATIONS and "heartbeat_s" in DURATIONS


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("value", ["inf", "1e300"])
def test_a_wait_too_long_for_the_clock_is_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    """A wait past what the clock holds fails where it is used (a NATS request with an
    infinite timeout never gives up on a lost registration), not at start."""
    variable = f"QSHARE_NODE_{name.upper()}"
    assert [p.split("=")[0] for p in problems(monkeypatch, variable, value)] == [variable]


def test_a_label_the_allocator_would_refuse_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, a value longer than a Kubernetes label's 63 characters passed the settings, and
    every registration failed to build and was retried for good: the node never joined."""
    [problem] = problems(monkeypatch, "QSHARE_NODE_LABELS", json.dumps({"zone": "a" * 64}))
    assert problem.startswith("QSHARE_NODE_LABELS=") and "63" in problem


def test_more_labels_than_a_registration_holds_beside_the_agents_own_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    labels = {f"team-{i}": "x" for i in range(MAX_LABELS - len(OWN_LABELS) + 1)}
    [problem] = problems(monkeypatch, "QSHARE_NODE_LABELS", json.dumps(labels))
    assert problem.startswith("QSHARE_NODE_LABELS=") and f"at most {MAX_LABELS}" in problem


def test_the_policy_label_is_refused_with_where_a_policy_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [problem] = problems(monkeypatch, "QSHARE_NODE_LABELS", json.dumps({POLICY_LABEL: "bs"}))
    assert "QSHARE_NODE_POLICY" in problem


def kubernetes_problems(monkeypatch: pytest.MonkeyPatch, keys: list[str], **env: str) -> list[str]:
    """The problems an agent serving the kubelet is refused with, registering the Node's
    labels `keys` (QSHARE_K8S_NODE_LABELS), with `env` set beside."""
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "node-a")
    for variable, value in env.items():
        monkeypatch.setenv(variable, value)
    return problems(monkeypatch, "QSHARE_K8S_NODE_LABELS", json.dumps(keys))


@pytest.mark.parametrize("key", OWN_LABELS)
def test_a_node_label_to_register_that_the_agent_sets_itself_is_refused(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    [problem] = kubernetes_problems(monkeypatch, ["zone", key])
    assert problem.startswith("QSHARE_K8S_NODE_LABELS=") and "node agent's own" in problem


@pytest.mark.parametrize("key", ["", "Zone/x", "/zone", "zone-", "a" * 64, "x" * 254 + "/y"])
def test_a_node_label_to_register_that_is_no_kubernetes_label_key_is_refused(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    [problem] = kubernetes_problems(monkeypatch, [key])
    assert "not Kubernetes label keys" in problem


def test_a_node_label_to_register_that_qshare_node_labels_sets_too_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    labels = json.dumps({"zone": "a"})
    [problem] = kubernetes_problems(monkeypatch, ["zone"], QSHARE_NODE_LABELS=labels)
    assert problem.startswith("QSHARE_K8S_NODE_LABELS=") and "QSHARE_NODE_LABELS too" in problem


def test_node_labels_to_register_past_what_a_registration_holds_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    room = MAX_LABELS - len(OWN_LABELS)
    own = json.dumps({f"team-{i}": "x" for i in range(room // 2)})
    keys = [f"pool-{i}" for i in range(room - room // 2 + 1)]
    [problem] = kubernetes_problems(monkeypatch, keys, QSHARE_NODE_LABELS=own)
    assert f"over the {MAX_LABELS} labels" in problem


def test_node_labels_to_register_that_fit_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "node-a")
    monkeypatch.setenv("QSHARE_K8S_NODE_LABELS", '["topology.kubernetes.io/zone", "pool"]')
    _, k8s = load_agent_settings({"name": "node-a", "simulate": "1"})
    assert k8s is not None and k8s.node_labels == ["topology.kubernetes.io/zone", "pool"]
