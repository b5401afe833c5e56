"""Says when a process attached from a PID namespace the agent cannot see: the driver then
records its pid as 0 (the kernel's answer), and an agent restarted later cannot find that
process alive to adopt it (its memory is given back while it still holds it). The agent
belongs in the host's PID namespace (`hostPID: true`; `qshare check` warns before it starts)."""

from __future__ import annotations

import logging

from qshare_driver import Event, EventKind

log = logging.getLogger(__name__)


class HiddenPidWatch:
    """An event-pump listener: one warning per agent at the first such attach, and a count."""

    def __init__(self, node_name: str) -> None:
        self._node = node_name
        self.hidden = 0
        """Attaches seen whose process the agent cannot see."""

    def __call__(self, event: Event) -> None:
        if event.kind is not EventKind.ATTACH or event.pid != 0:
            return
        self.hidden += 1
        if self.hidden == 1:
            log.warning(
                "node agent %s: a process attached to vGPU %s from a PID namespace this agent "
                "cannot see (pid 0): if the agent restarts it cannot adopt such processes and "
                "gives back the memory they hold; run the agent in the host's PID namespace "
                "(hostPID: true)", self._node, event.vgpu,
            )  # fmt: skip
