"""Node agent settings that cannot work are refused when the agent starts, naming what to
change."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from qshare_node_agent.settings import NodeAgentSettings


def test_a_segment_directory_too_long_for_vgpu_sockets_is_refused_at_start() -> None:
    deep = Path("/tmp") / ("d" * 80)
    with pytest.raises(ValidationError, match="QSHARE_NODE_SHM_DIR or QSHARE_NODE_SEGMENT"):
        NodeAgentSettings(name="ip-10-0-0-1.ec2.internal", simulate="1", shm_dir=deep)


def test_a_long_dotted_node_name_fits_under_the_default_segment_directory() -> None:
    name = "ip-10-0-0-1.us-west-2.compute.internal"
    settings = NodeAgentSettings(name=name, simulate="1", shm_dir=Path("/dev/shm"))
    assert settings.segment_name.startswith("qshare-ip-10-0-0-1.us-west-2")
