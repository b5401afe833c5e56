"""Watches this node's ResourceSlice and reports when it is gone: the kubelet deletes every
ResourceSlice of its node when it starts (before any plugin registers) and a driver's slices
when its plugin stays unreachable, so the plugin must publish its slice again then."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from qshare_node_agent.kubernetes.apiserver import ApiError, KubeApi, Watch

log = logging.getLogger(__name__)
WATCH_S = 300
RETRY_S = 1.0


class SliceWatch:
    """`start()` / `stop()`; calls `on_gone()` (from its own thread) when the slice named
    `name` is deleted, and when a list after the first finds it absent (the plugin publishes
    on start anyway: the first list's answer says nothing new)."""

    def __init__(
        self, api: KubeApi, name: str, on_gone: Callable[[], None], watch_s: int = WATCH_S
    ) -> None:
        self._api, self._name, self._on_gone, self._watch_s = api, name, on_gone, watch_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="slice watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._watch is not None:
                self._watch.close()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        version, first = "", True
        while not self._stop.is_set():
            try:
                if not version:
                    version, first = self._list(report=not first), False
                version = self._follow(version)
            except ApiError as exc:
                if exc.status == 410:  # our version is too old: list again
                    version = ""
                    continue
                log.warning("watching ResourceSlice %s failed (%s); retrying", self._name, exc)
                version = ""
                self._stop.wait(RETRY_S)

    def _list(self, report: bool) -> str:
        present, version = self._api.resource_slice_names(self._name)
        if report and not present:
            self._on_gone()
        return version

    def _follow(self, version: str) -> str:
        """One watch request; returns the last version seen."""
        watch = self._api.watch_resource_slice(self._name, version, self._watch_s)
        with self._lock:
            if self._stop.is_set():
                watch.close()
                return version
            self._watch = watch
        for event in watch:
            meta = event["object"].get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            if event.get("type") == "DELETED" and meta.get("name") == self._name:
                self._on_gone()
        return version
