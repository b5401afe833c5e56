"""The cluster's default placements come from QSHARE_PLACEMENT_NODE and _CARD; the older
QSHARE_NODE_POLICY, which the node agent also reads as its card sharing policy, no longer
breaks one side or the other in a shared environment."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from qshare.contracts.domain import PlacementPolicy
from qshare.envsettings import SettingsError, load
from qshare.settings import ClusterSettings
from qshare_node_agent.settings import NodeAgentSettings


def test_placement_node_and_card_set_the_default_placements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_PLACEMENT_NODE", "binpack")
    monkeypatch.setenv("QSHARE_PLACEMENT_CARD", "binpack")
    rules = ClusterSettings()
    assert (rules.node_policy, rules.card_policy) == (PlacementPolicy.BINPACK,) * 2


def test_the_older_node_policy_name_still_sets_node_placement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_NODE_POLICY", "binpack")
    assert ClusterSettings().node_policy is PlacementPolicy.BINPACK


def test_the_agents_card_policy_in_a_shared_environment_leaves_placement_at_spread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_NODE_POLICY", "burst-share")
    assert ClusterSettings().node_policy is PlacementPolicy.SPREAD
    assert NodeAgentSettings(name="n1", simulate="1").policy.value == "burst-share"


def test_an_unknown_placement_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QSHARE_PLACEMENT_NODE", "tightly")
    with pytest.raises(ValidationError, match="'spread' or 'binpack'"):
        ClusterSettings()


def test_variables_outside_the_qshare_prefix_set_no_placement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODE_POLICY", "binpack")
    monkeypatch.setenv("CARD_POLICY", "binpack")
    rules = ClusterSettings()
    assert (rules.node_policy, rules.card_policy) == (PlacementPolicy.SPREAD,) * 2


def test_placements_given_by_field_name_are_taken() -> None:
    rules = ClusterSettings(node_policy="binpack", card_policy="binpack")
    assert (rules.node_policy, rules.card_policy) == (PlacementPolicy.BINPACK,) * 2


def test_a_bad_placement_is_reported_by_the_variable_read_and_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_PLACEMENT_NODE", "sideways")
    with pytest.raises(SettingsError) as err:
        load(ClusterSettings)
    assert err.value.problems == [
        "QSHARE_PLACEMENT_NODE='sideways': Input should be 'spread' or 'binpack'"
    ]


def test_a_bad_placement_under_the_older_name_is_reported_by_that_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_NODE_POLICY", "sideways")
    with pytest.raises(SettingsError) as err:
        load(ClusterSettings)
    assert err.value.problems == [
        "QSHARE_NODE_POLICY='sideways': Input should be 'spread' or 'binpack'"
    ]
