"""Node agent settings that cannot work are refused when the agent starts, naming what to
change."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from qshare_node_agent.__main__ import main
from qshare_node_agent.discovery import DiscoveryError, nvml_cards
from qshare_node_agent.settings import NodeAgentSettings


def test_a_segment_directory_too_long_for_vgpu_sockets_is_refused_at_start() -> None:
    deep = Path("/tmp") / ("d" * 80)
    with pytest.raises(ValidationError, match="QSHARE_NODE_SHM_DIR or QSHARE_NODE_SEGMENT"):
        NodeAgentSettings(name="ip-10-0-0-1.ec2.internal", simulate="1", shm_dir=deep)


def test_a_long_dotted_node_name_fits_under_the_default_segment_directory() -> None:
    name = "ip-10-0-0-1.us-west-2.compute.internal"
    settings = NodeAgentSettings(name=name, simulate="1", shm_dir=Path("/dev/shm"))
    assert settings.segment_name.startswith("qshare-ip-10-0-0-1.us-west-2")


def test_a_bad_simulate_value_is_named_without_the_validator_prefix(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--simulate", "2:16G", "--name", "n1"]) == 2
    err = capsys.readouterr().err
    assert "qshare node agent: --simulate='2:16G': expected N[:MEM]" in err
    assert "Value error" not in err


def test_a_node_without_pynvml_is_told_which_package_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with pytest.raises(DiscoveryError, match="pip install nvidia-ml-py"):
        nvml_cards()
