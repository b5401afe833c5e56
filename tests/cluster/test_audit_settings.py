"""Node agent settings the driver would refuse are refused as settings, naming the flag,
before the agent starts anything (its health server, the cards' timeslice)."""

from __future__ import annotations

import pytest

from qshare_node_agent.__main__ import main


@pytest.mark.parametrize("segment", ["bad/name", "x" * 48, ".hidden", "sp ace"])
def test_a_segment_name_the_driver_refuses_is_named_as_a_setting(
    segment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--segment", segment, "--simulate", "1", "--name", "n1"]) == 2
    err = capsys.readouterr().err
    assert f"qshare node agent: --segment={segment!r}" in err
