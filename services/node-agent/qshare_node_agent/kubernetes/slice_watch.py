"""Watches this node's ResourceSlice and reports when it is gone: the kubelet deletes every
ResourceSlice of its node when it starts (before any plugin registers) and a driver's slices
when its plugin stays unreachable, so the plugin must publish its slice again then."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from qshare_node_agent.kubernetes.apiserver import KubeApi, Watch
from qshare_node_agent.kubernetes.list_watch import ListWatch

WATCH_S = 300
RETRY_S = 1.0


class SliceWatch(ListWatch):
    """`start()` / `stop()`; calls `on_gone()` (from its own thread) when the slice named
    `name` is deleted, and whenever a list finds it absent, the first included: the plugin
    starts the watch once it has published, so an absent slice at the first list is one a
    kubelet wiped in between, which no watch event will report."""

    def __init__(
        self, api: KubeApi, name: str, on_gone: Callable[[], None], watch_s: int = WATCH_S
    ) -> None:
        super().__init__(f"ResourceSlice {name}", RETRY_S, RETRY_S)
        self._api, self._name, self._on_gone, self._watch_s = api, name, on_gone, watch_s

    def _relist(self) -> str:
        present, version = self._api.resource_slice_names(self._name)
        if not present:
            self._on_gone()
        return version

    def _open(self, version: str) -> Watch:
        return self._api.watch_resource_slice(self._name, version, self._watch_s)

    def _apply(self, event: dict[str, Any]) -> str:
        meta = event["object"].get("metadata") or {}
        if event.get("type") == "DELETED" and meta.get("name") == self._name:
            self._on_gone()
        return str(meta.get("resourceVersion") or "")
