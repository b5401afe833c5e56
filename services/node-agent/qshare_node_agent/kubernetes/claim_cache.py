"""ResourceClaims kept in memory by LIST + WATCH (the informer pattern of DRA drivers), so a
prepare reads its claim here instead of making one GET to the API server per claim.

A claim is served from here only when it is the very claim the kubelet names (same uid)
and the held copy is allocated with a pod reserved for it; anything else (not seen yet,
another uid, not allocated, nobody reserved in the held copy) is a miss and the caller GETs
it: a lagging watch costs a GET, not a wrong answer. A held allocation with a reservation
is current: a claim is deallocated only once no pod is reserved for it, and the kubelet
prepares a claim for a pod reserved for it. `forget` drops a claim when it is unprepared,
so a claim allocated again later (to another device, for another pod) is read afresh
rather than from a copy of its earlier allocation; and since a lagging watch can still
bring an event from before the unprepare (the old allocation, still reserved), a copy of
that claim is a miss until one shows it released (no pod reserved) or it is deleted.
"""

from __future__ import annotations

import threading
from typing import Any

from qshare_node_agent.kubernetes.apiserver import KubeApi, Watch
from qshare_node_agent.kubernetes.list_watch import ListWatch

WATCH_S = 300  # one watch request's length; the next continues from the last version seen
RETRY_S = 1.0
MAX_RETRY_S = 30.0


class ClaimCache(ListWatch):
    """`start()` / `stop()`; `get` is thread-safe."""

    def __init__(self, api: KubeApi, watch_s: int = WATCH_S, retry_s: float = RETRY_S) -> None:
        super().__init__("ResourceClaims", retry_s, MAX_RETRY_S)
        self._api = api
        self._watch_s = watch_s
        self._claims: dict[tuple[str, str], dict[str, Any]] = {}
        self._unprepared: set[str] = set()  # uids whose held copies may predate the unprepare
        self._lock = threading.Lock()
        self.synced = threading.Event()  # set once the first LIST is held
        self.hits = 0
        self.misses = 0

    def holds(self, namespace: str, name: str, uid: str) -> bool:
        """Whether `get` would answer the claim now (counting nothing)."""
        with self._lock:
            return self._usable(namespace, name, uid) is not None

    def get(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The held claim if it is claim `uid`, allocated and reserved; None (a miss)
        otherwise."""
        with self._lock:
            claim = self._usable(namespace, name, uid)
            if claim is not None:
                self.hits += 1
            else:
                self.misses += 1
        return claim

    def _usable(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The caller holds `_lock`."""
        claim = self._claims.get((namespace, name))
        if claim is None or _uid(claim) != uid or uid in self._unprepared:
            return None
        return claim if _reserved(claim) else None

    def forget(self, uid: str) -> None:
        """Drop claim `uid` (it was unprepared); held again once a change shows it released."""
        with self._lock:
            for key in [k for k, c in self._claims.items() if _uid(c) == uid]:
                del self._claims[key]
            self._unprepared.add(uid)

    def _relist(self) -> str:
        items, version = self._api.resource_claims()
        held = {_key(c): c for c in items}
        reserved = {_uid(c) for c in items if _reserved(c)}
        with self._lock:
            self._claims = held
            self._unprepared &= reserved  # released or gone: what is held now is current
        self.synced.set()
        return version

    def _open(self, version: str) -> Watch:
        return self._api.watch_resource_claims(version, self._watch_s)

    def _apply(self, event: dict[str, Any]) -> str:
        claim = event["object"]
        version = str((claim.get("metadata") or {}).get("resourceVersion") or "")
        if event.get("type") == "BOOKMARK":
            return version
        with self._lock:
            if event.get("type") == "DELETED":
                self._claims.pop(_key(claim), None)
            else:
                self._claims[_key(claim)] = claim
            if event.get("type") == "DELETED" or not _reserved(claim):
                self._unprepared.discard(_uid(claim))
        return version


def _key(claim: dict[str, Any]) -> tuple[str, str]:
    meta = claim.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _uid(claim: dict[str, Any]) -> str:
    return str((claim.get("metadata") or {}).get("uid", ""))


def _reserved(claim: dict[str, Any]) -> bool:
    status = claim.get("status") or {}
    return bool(status.get("allocation")) and bool(status.get("reservedFor"))
