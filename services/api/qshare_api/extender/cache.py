"""The last placement previews by pod: the scheduler calls prioritize right after filter for
the same pod, and prioritize can reuse the preview filter fetched (for a second or two).
A preview older than that is dropped when the next one is kept: a thousand-node preview
holds ~90 KB, and a full cache of stale ones would hold tens of MB (hundreds on a cluster
of several thousand nodes) for nothing."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from qshare.contracts.placement import PlacementPreview

TTL_S = 2.0
ENTRIES = 512


class PreviewCache:
    def __init__(
        self,
        ttl_s: float = TTL_S,
        entries: int = ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = ttl_s
        self._entries = entries
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, PlacementPreview]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, pod_uid: str, preview: PlacementPreview) -> None:
        now = self._clock()
        self._items[pod_uid] = (now, preview)
        self._items.move_to_end(pod_uid)
        while len(self._items) > self._entries or self._expired(next(iter(self._items)), now):
            self._items.popitem(last=False)  # the newest, just put, is never expired

    def get(self, pod_uid: str, nodes: list[str]) -> PlacementPreview | None:
        """The pod's recent preview if it covers every node in `nodes`."""
        found = self._items.get(pod_uid)
        if found is None or self._clock() - found[0] > self._ttl:
            return None
        preview = found[1]
        scores, failed = preview.scores, preview.failed
        return preview if all(n in scores or n in failed for n in nodes) else None

    def _expired(self, pod_uid: str, now: float) -> bool:
        return now - self._items[pod_uid][0] > self._ttl
