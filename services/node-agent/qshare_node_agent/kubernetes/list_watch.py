"""The thread behind a LIST + WATCH of API-server objects (the informer pattern): list, then
follow watches from the version listed; list again when the server says the version is too
old (410 Gone) or a request fails (or brings what cannot be read), waiting longer after each
failure in a row. `stop()` closes the watch under way, so the thread ends at once."""

from __future__ import annotations

import logging
import threading
from typing import Any

from qshare_node_agent.kubernetes.apiserver import ApiError, Watch

log = logging.getLogger(__name__)
GONE = 410


class ListWatch:
    """`start()` / `stop()`. Subclasses list (`_relist`, returning the list's version), open a
    watch from a version (`_open`) and take its events (`_apply`, returning the event's
    version or "")."""

    def __init__(self, what: str, retry_s: float, max_retry_s: float) -> None:
        self._what = what
        self._retry_s, self._max_retry_s = retry_s, max_retry_s
        self._stop = threading.Event()
        self._watch_lock = threading.Lock()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread; nothing when it runs already (until `stop()`)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"{self._what} watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _relist(self) -> str:
        raise NotImplementedError

    def _open(self, version: str) -> Watch:
        raise NotImplementedError

    def _apply(self, event: dict[str, Any]) -> str:
        raise NotImplementedError

    def _run(self) -> None:
        delay = self._retry_s  # grows while requests keep failing (an API server down)
        while not self._stop.is_set():
            try:
                version = self._relist()
                delay = self._retry_s
                while not self._stop.is_set():
                    version = self._follow(version)
            except ApiError as exc:
                if exc.status == GONE or self._stop.is_set():
                    continue
                log.warning("watching %s failed (%s); listing again", self._what, exc)
            except Exception:  # an object of a shape it cannot read: never the thread's end
                log.exception("watching %s failed; listing again", self._what)
            self._stop.wait(delay)
            delay = min(delay * 2, self._max_retry_s)

    def _follow(self, version: str) -> str:
        """One watch from `version` until the server ends it; returns the last version seen."""
        watch = self._open(version)
        with self._watch_lock:
            self._watch = watch
        if self._stop.is_set():
            watch.close()
        for event in watch:
            version = self._apply(event) or version
        return version
