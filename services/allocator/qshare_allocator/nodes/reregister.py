"""Asking a node agent to register again (`qshare.node.<node>.cmd.register`) when its
heartbeat names a node the inventory does not hold: one deleted over REST while its agent
ran. Heartbeats are publish-only, so without this the agent would never learn it is gone;
with it the node comes back with its cards, as a kubelet re-creates a deleted Node object.

At most one request per node every `every_s` (per replica): a node heartbeats several times
before its new registration lands, and an agent that cannot register must not be asked on
every beat. A node deleted because it is gone sends no heartbeats, so it is never asked (a
heartbeat still in flight at the deletion asks an agent that is not there: nothing answers).
"""

from __future__ import annotations

import logging
import time

from nats.aio.client import Client

from qshare.contracts import envelope, subjects
from qshare.contracts.agent import RegisterCommand

log = logging.getLogger(__name__)
MAX_REMEMBERED = 4096
"""Nodes whose last request is remembered; beyond it the stale ones are forgotten."""


class Reregistration:
    def __init__(self, nc: Client, source: str, every_s: float) -> None:
        self._nc = nc
        self._source = source
        self._every_s = every_s
        self._asked: dict[str, float] = {}
        self.asked = 0
        """Requests sent so far."""

    async def unknown_heartbeat(self, node: str) -> None:
        """A heartbeat of `node`, which is not in the inventory: ask it to register again,
        unless it was asked less than `every_s` ago."""
        now = time.monotonic()
        if now - self._asked.get(node, -self._every_s) < self._every_s:
            return
        self._remember(node, now)
        command = RegisterCommand(reason=f"node {node} is not in the inventory")
        body = envelope.wrap(self._source, "io.qshare.node.register", command)
        try:
            await self._nc.publish(subjects.node_command(node, "register"), envelope.encode(body))
        except Exception as error:  # NATS away: its next heartbeat asks again
            log.warning("asking node %s to register again failed: %r", node, error)
            return
        self.asked += 1
        log.info("heartbeat of unknown node %s: asked it to register again", node)

    def _remember(self, node: str, now: float) -> None:
        if len(self._asked) >= MAX_REMEMBERED:
            self._asked = {n: t for n, t in self._asked.items() if now - t < self._every_s}
        self._asked[node] = now
