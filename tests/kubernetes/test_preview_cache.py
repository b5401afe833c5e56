"""The extender's preview cache: prioritize reuses filter's preview of the same pod, briefly."""

from __future__ import annotations

from qshare.contracts.placement import PlacementPreview
from qshare_api.extender.cache import PreviewCache

PREVIEW = PlacementPreview(scores={"a": 5}, failed={"b": "full"})


def test_a_preview_covering_the_nodes_is_reused() -> None:
    cache = PreviewCache()
    cache.put("pod-1", PREVIEW)
    assert cache.get("pod-1", ["a"]) == PREVIEW


def test_a_preview_missing_a_node_is_not_reused() -> None:
    cache = PreviewCache()
    cache.put("pod-1", PREVIEW)
    assert cache.get("pod-1", ["a", "c"]) is None


def test_an_old_preview_is_not_reused() -> None:
    cache = PreviewCache(ttl_s=0.0)
    cache.put("pod-1", PREVIEW)
    assert cache.get("pod-1", ["a"]) is None


def test_the_cache_keeps_only_the_latest_pods() -> None:
    cache = PreviewCache(entries=2)
    for pod in ("p1", "p2", "p3"):
        cache.put(pod, PREVIEW)
    assert cache.get("p1", ["a"]) is None
    assert cache.get("p3", ["a"]) == PREVIEW


def test_previews_older_than_their_lifetime_are_dropped_when_the_next_is_kept() -> None:
    now = [0.0]
    cache = PreviewCache(ttl_s=2.0, clock=lambda: now[0])
    for pod in ("p1", "p2"):
        cache.put(pod, PREVIEW)
    now[0] = 5.0
    cache.put("p3", PREVIEW)
    assert len(cache) == 1
    assert cache.get("p3", ["a", "b"]) == PREVIEW


def test_a_preview_within_its_lifetime_is_kept_beside_newer_ones() -> None:
    now = [0.0]
    cache = PreviewCache(ttl_s=2.0, clock=lambda: now[0])
    cache.put("p1", PREVIEW)
    now[0] = 1.5
    cache.put("p2", PREVIEW)
    assert cache.get("p1", ["a"]) == PREVIEW
