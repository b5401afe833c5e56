"""`qshare check` says, before a node agent starts on a machine, whether it would work there
with its settings: each check ok, warn or fail with the reason, exit 1 when any fails, and
nothing on the machine changed. NATS is the session's real server (enforcing identities);
the CUDA driver is the fake one (a test double) or a library that is not there."""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from qshare.cli import main
from qshare.native_build import FAKE_DIR
from qshare.natsauth import NatsAuth, ServiceRole
from qshare.testing.servers import free_port
from qshare_driver import Node
from qshare_node_agent.kubernetes.config import KubernetesSettings
from qshare_node_agent.preflight import (
    Finding,
    Machine,
    check_cards,
    check_cuda_driver,
    check_interposer,
    check_kubelet,
    check_nats,
    check_pid_namespace,
    check_segment_dir,
    check_timeslice,
)
from qshare_node_agent.settings import NodeAgentSettings

from .conftest import as_identity


def simulated(tmp_path: Path, **more: Any) -> NodeAgentSettings:
    return NodeAgentSettings(name="n1", simulate="2:8Gi", shm_dir=tmp_path, **more)


HERE_PID_NAMESPACE = check_pid_namespace(Path("/proc")).status
"""ok on a machine (the host's namespace), warn in a container of its own: tests pass on both."""


def real_cards(**more: Any) -> NodeAgentSettings:
    return NodeAgentSettings(name="n1", **more)


def checked(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, str]]]:
    """`qshare check ARGS --json`: its exit status and findings."""
    capsys.readouterr()
    status = main(["check", *args, "--json"])
    return status, json.loads(capsys.readouterr().out)


def test_simulated_cards_on_this_machine_pass_every_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, findings = checked(capsys, "--simulate", "2", "--shm-dir", str(tmp_path), "--no-nats")
    assert status == 0
    assert {f["check"]: f["status"] for f in findings} == {
        "cards": "ok", "segment directory": "ok", "interposer": "ok", "CUDA driver": "ok",
        "timeslice": "ok", "PID namespace": HERE_PID_NAMESPACE}  # fmt: skip


def test_the_cards_check_counts_the_cards_by_model_and_memory(tmp_path: Path) -> None:
    assert check_cards(simulated(tmp_path)) == Finding(
        "cards", "ok", "2: 2 x qshare-simulated (8192 MiB)"
    )


def test_a_node_without_nvml_fails_the_cards_check_naming_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    found = check_cards(real_cards())
    assert found.status == "fail" and "pip install nvidia-ml-py" in found.detail


def test_a_segment_directory_that_does_not_exist_fails_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir"
    assert check_segment_dir(simulated(missing)) == Finding(
        "segment directory", "fail", f"{missing} is not a directory"
    )


def test_a_segment_left_by_an_earlier_agent_is_said_to_be_adopted(tmp_path: Path) -> None:
    settings = simulated(tmp_path)
    with Node.create(settings.segment_name, str(tmp_path)):
        found = check_segment_dir(settings)
    assert found.status == "ok"
    assert f"segment {settings.segment_name} exists (a new agent adopts it)" in found.detail


def test_the_segment_check_leaves_no_segment_behind(tmp_path: Path) -> None:
    check_segment_dir(simulated(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_the_interposer_named_by_qshare_cuda_lib_is_the_one_found(tmp_path: Path) -> None:
    library = tmp_path / "libqshare-cuda.so"
    library.write_bytes(b"")
    assert check_interposer({"QSHARE_CUDA_LIB": str(library)}) == Finding(
        "interposer", "ok", str(library.resolve())
    )


def test_a_cuda_driver_that_does_not_load_fails_naming_the_library(tmp_path: Path) -> None:
    absent = str(tmp_path / "libcuda.so.1")
    found = check_cuda_driver(real_cards(), lambda _: ctypes.CDLL(absent))
    assert found.status == "fail" and found.detail.startswith("libcuda.so.1 does not load: ")


def test_a_cuda_driver_that_loads_passes_with_its_version(tmp_path: Path) -> None:
    fake = str(FAKE_DIR / "libcuda.so.1")  # the fake CUDA driver, a test double
    found = check_cuda_driver(real_cards(), lambda _: ctypes.CDLL(fake))
    assert found == Finding("CUDA driver", "ok", "libcuda.so.1 loads, CUDA 12.8")


def test_a_cuda_driver_that_cannot_say_its_version_still_passes() -> None:
    found = check_cuda_driver(real_cards(), lambda _: object())
    assert found == Finding("CUDA driver", "ok", "libcuda.so.1 loads")


def test_a_timeslice_asked_of_real_cards_without_root_warns_that_they_keep_the_drivers(
    tmp_path: Path,
) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    found = check_timeslice(real_cards(timeslice="short", nvidia_smi=str(smi)), euid=1000)
    assert found.status == "warn" and "needs root" in found.detail


def test_a_timeslice_asked_with_no_nvidia_smi_fails_naming_the_program(tmp_path: Path) -> None:
    program = str(tmp_path / "no-nvidia-smi")
    found = check_timeslice(real_cards(timeslice="short", nvidia_smi=program), euid=0)
    assert found.status == "fail" and f"{program} is not found" in found.detail


def test_a_timeslice_asked_of_simulated_cards_warns_it_is_not_applied(tmp_path: Path) -> None:
    found = check_timeslice(simulated(tmp_path, timeslice="long"), euid=0)
    assert found == Finding("timeslice", "warn", "'long' is not applied to simulated cards")


async def test_nats_that_takes_the_identity_passes_naming_it(
    tmp_path: Path, bus_url: str, nats_auth: NatsAuth
) -> None:
    identity = as_identity(nats_auth, ServiceRole.ALLOCATOR)  # any identity the server knows
    settings = simulated(tmp_path, nats_url=bus_url, **identity)
    found = await check_nats(settings, timeout_s=5)
    assert found == Finding("NATS", "ok", f"connected to {bus_url} as {identity['nats_user']}")


async def test_nats_refusing_the_identity_fails_naming_it(tmp_path: Path, bus_url: str) -> None:
    settings = simulated(tmp_path, nats_url=bus_url, nats_user="nobody", nats_password="wrong")
    found = await check_nats(settings, timeout_s=5)
    assert found.status == "fail" and "refused the identity 'nobody'" in found.detail


async def test_no_nats_server_fails_naming_the_url_and_the_wait(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    found = await check_nats(simulated(tmp_path, nats_url=url), timeout_s=0.5)
    assert found.status == "fail"
    assert found.detail.startswith(f"no server answered at {url} within 0.5 s (last: ")


def test_each_missing_kubelet_directory_fails_naming_it(tmp_path: Path) -> None:
    (tmp_path / "plugins_registry").mkdir()
    k8s = KubernetesSettings(node_name="n1", registry_dir=tmp_path / "plugins_registry",
                             device_plugin_dir=tmp_path / "device-plugins",
                             plugin_dir=tmp_path / "plugins" / "qshare.io",
                             cdi_dir=tmp_path / "cdi")  # fmt: skip
    assert [(f.check, f.status) for f in check_kubelet(k8s)] == [
        ("kubelet: plugin registry", "ok"), ("kubelet: device plugins", "fail"),
        ("kubelet: DRA plugin", "fail"), ("kubelet: CDI specs", "fail")]  # fmt: skip


def test_a_failed_check_makes_the_command_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, findings = checked(
        capsys, "--simulate", "1", "--shm-dir", str(tmp_path / "absent"), "--no-nats"
    )
    assert status == 1
    assert [f["check"] for f in findings if f["status"] == "fail"] == ["segment directory"]


def test_bad_settings_are_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--simulate", "lots", "--no-nats"]) == 2
    assert "--simulate" in capsys.readouterr().err


def test_the_table_has_a_row_per_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--simulate", "1", "--shm-dir", str(tmp_path), "--no-nats"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert [row.split("  ")[0] for row in rows][:2] == ["cards", "segment directory"]
    assert len(rows) == 6 and all(" ok " in row for row in rows if "PID namespace" not in row)


def test_an_agent_that_sees_the_hosts_kernel_threads_is_in_the_hosts_pid_namespace(
    tmp_path: Path,
) -> None:
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "comm").write_text("kthreadd\n")
    assert check_pid_namespace(tmp_path).status == "ok"


def test_an_agent_in_a_pid_namespace_of_its_own_is_warned_to_run_in_the_hosts(
    tmp_path: Path,
) -> None:
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "comm").write_text("python3\n")
    finding = check_pid_namespace(tmp_path)
    assert (finding.check, finding.status) == ("PID namespace", "warn")
    assert "hostPID: true" in finding.detail


def test_the_machine_is_read_from_this_process() -> None:
    machine = Machine.this_one()
    assert machine.env["PATH"] and machine.load is ctypes.CDLL
