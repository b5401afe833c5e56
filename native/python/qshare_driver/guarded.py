"""A C handle that another thread may retire (close, detach) while calls use it: calls in
progress are counted and retiring waits for them, so nothing runs on a freed handle."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from qshare_driver.errors import DriverError


class Guarded:
    """`handle` until `retire()`; then every call is refused with `closed` as the error."""

    def __init__(self, handle: Any, closed: str) -> None:
        self._handle = handle
        self._closed = closed
        self._idle = threading.Condition()  # guards _handle and _uses
        self._uses = 0

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(handle, *args)`, counted as in progress; refused once retired."""
        with self._idle:
            if self._handle is None:
                raise DriverError(self._closed)
            handle = self._handle
            self._uses += 1
        try:
            return fn(handle, *args)
        finally:
            with self._idle:
                self._uses -= 1
                if self._uses == 0:
                    self._idle.notify_all()

    def retire(self) -> Any:
        """Refuse new calls, wait for those in progress and hand back the handle (None when
        it was retired already)."""
        with self._idle:
            handle, self._handle = self._handle, None
            self._idle.wait_for(lambda: self._uses == 0)
        return handle

    @property
    def retired(self) -> bool:
        with self._idle:
            return self._handle is None
