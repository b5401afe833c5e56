"""Settings a user got wrong stop a service with one line per problem, naming the
environment variable that was read (or the flag that was given) and its bad value: never
a settings field's name, never a traceback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from qshare.envsettings import SettingsError, load
from qshare_allocator.__main__ import main as allocator_main
from qshare_api.__main__ import main as api_main
from qshare_api.settings import ApiSettings
from qshare_node_agent.__main__ import main as agent_main
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_preemptor.__main__ import main as preemptor_main


def test_every_problem_of_a_service_and_its_nested_settings_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("QSHARE_PLACEMENT_CARD", "sideways")
    monkeypatch.setenv("QSHARE_EXTENDER_TIMEOUT_S", "-1")
    monkeypatch.setenv("QSHARE_API_PORT", "0")
    with pytest.raises(SettingsError) as err:
        load(ApiSettings)
    assert sorted(err.value.problems) == [
        "QSHARE_API_PORT='0': Input should be greater than or equal to 1",
        "QSHARE_EXTENDER_TIMEOUT_S='-1': Input should be greater than 0",
        "QSHARE_PLACEMENT_CARD='sideways': Input should be 'spread' or 'binpack'",
    ]


def test_a_variable_matched_ignoring_case_is_named_as_it_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("qshare_api_port", "http")
    with pytest.raises(SettingsError) as err:
        load(ApiSettings)
    assert err.value.problems[0].startswith("qshare_api_port='http': ")


def test_a_required_variable_that_is_not_set_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("QSHARE_K8S_NODE_NAME", raising=False)
    with pytest.raises(SettingsError) as err:
        load(KubernetesSettings)
    assert err.value.problems == ["QSHARE_K8S_NODE_NAME is not set: a value is required"]


@pytest.mark.parametrize(
    ("main", "variable", "value", "line"),
    [
        (allocator_main, "QSHARE_ALLOCATOR_POOL_SIZE", "1",
         "qshare allocator: QSHARE_ALLOCATOR_POOL_SIZE='1': Input should be greater than or "
         "equal to 2"),
        (api_main, "QSHARE_PLACEMENT_NODE", "sideways",
         "qshare api: QSHARE_PLACEMENT_NODE='sideways': Input should be 'spread' or 'binpack'"),
        (preemptor_main, "QSHARE_PREEMPTOR_NATS_RECONNECT_WAIT_S", "0",
         "qshare preemptor: QSHARE_PREEMPTOR_NATS_RECONNECT_WAIT_S='0': Input should be "
         "greater than 0"),
        (allocator_main, "OTEL_TRACES_EXPORTER", "zipkin",
         "qshare allocator: OTEL_TRACES_EXPORTER='zipkin': Input should be 'otlp', 'console' "
         "or 'none'"),
        *[(main, variable, "70000",
           f"{program}: {variable}='70000': Input should be less than or equal to 65535")
          for main, variable, program in [
              (allocator_main, "QSHARE_ALLOCATOR_HEALTH_PORT", "qshare allocator"),
              (preemptor_main, "QSHARE_PREEMPTOR_HEALTH_PORT", "qshare preemptor"),
              (agent_main, "QSHARE_NODE_HEALTH_PORT", "qshare node agent")]],
    ],
)  # fmt: skip
def test_a_service_with_a_bad_variable_exits_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    main: Callable[[list[str]], int],
    variable: str,
    value: str,
    line: str,
) -> None:
    monkeypatch.setenv(variable, value)
    assert main([]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_the_node_agent_names_its_flags_and_its_kubernetes_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("QSHARE_NODE_KUBERNETES", "true")
    monkeypatch.setenv("QSHARE_K8S_NODE_NAME", "n1")
    monkeypatch.setenv("QSHARE_K8S_WORKERS", "0")
    assert agent_main(["--name", "n1", "--simulate", "1", "--policy", "sideways"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "qshare node agent: --policy='sideways': Input should be 'best-effort', 'fixed-share' "
        "or 'burst-share'"
    ]
    assert agent_main(["--name", "n1", "--simulate", "1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "qshare node agent: QSHARE_K8S_WORKERS='0': Input should be greater than or equal to 1"
    ]
