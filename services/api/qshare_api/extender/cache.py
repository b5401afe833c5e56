"""The last placement previews by pod: the scheduler calls prioritize right after filter for
the same pod, and prioritize can reuse the preview filter fetched (for a second or two)."""

from __future__ import annotations

import time
from collections import OrderedDict

from qshare.contracts.placement import PlacementPreview

TTL_S = 2.0
ENTRIES = 512


class PreviewCache:
    def __init__(self, ttl_s: float = TTL_S, entries: int = ENTRIES) -> None:
        self._ttl = ttl_s
        self._entries = entries
        self._items: OrderedDict[str, tuple[float, PlacementPreview]] = OrderedDict()

    def put(self, pod_uid: str, preview: PlacementPreview) -> None:
        self._items[pod_uid] = (time.monotonic(), preview)
        self._items.move_to_end(pod_uid)
        while len(self._items) > self._entries:
            self._items.popitem(last=False)

    def get(self, pod_uid: str, nodes: list[str]) -> PlacementPreview | None:
        """The pod's recent preview if it covers every node in `nodes`."""
        found = self._items.get(pod_uid)
        if found is None or time.monotonic() - found[0] > self._ttl:
            return None
        preview = found[1]
        known = preview.scores.keys() | preview.failed.keys()
        return preview if all(n in known for n in nodes) else None
