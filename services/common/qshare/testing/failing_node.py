"""A test double for the driver failing and then recovering: a real Node whose one method
raises DriverError a given number of times first. No real call makes the driver fail that
way on demand (a ring read, a listing, a destroy); every other attribute is the real Node's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qshare_driver import DriverError, Node


class FailingNode:
    """`node` whose `method` raises DriverError(`why`) `failures` times first (-1: always),
    once `passes` calls of it went through; set `failures` (and `passes`) again to fail again."""

    def __init__(
        self, node: Node, method: str, failures: int = 0, why: str = "failed", passes: int = 0
    ) -> None:
        self._node = node
        self._method = method
        self._why = why
        self.failures = failures
        self.passes = passes

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._node, name)
        return self._failing(real) if name == self._method else real

    def _failing(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.passes:
                self.passes -= 1
            elif self.failures:
                self.failures -= 1
                raise DriverError(f"{self._why} (injected)")
            return real(*args, **kwargs)

        return call
