"""Watch-driven caches of one kind of object: nodes, pods, Kueue Workloads.

List once, then watch from the list's resourceVersion, relist on ``410 Gone``, reconnect with
backoff, as client-go's informers do. Objects are parsed on arrival (``parse``), so a cluster
of 50,000 pods is held as small frozen values rather than raw JSON.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, TypeVar

from nodeagent.runtime.backoff import Backoff
from nodeagent_tiering.cluster import JSON
from nodeagent_tiering.cluster.cluster_api import (
    WATCH_RETRY_INITIAL_S,
    WATCH_RETRY_MAX_S,
    Kube,
    KubeError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

ABSENT_RETRY_S = 300.0  # an API that is not served (Kueue not installed) is asked again this often


def object_key(obj: JSON) -> str:
    """The UID, else ``namespace/name``."""
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def node_name(obj: JSON) -> str:
    """A cluster-scoped object's name."""
    return str((obj.get("metadata") or {}).get("name", ""))


def strip_managed_fields(obj: JSON) -> JSON:
    """Drop ``metadata.managedFields`` (server-side apply's record of who set which field):
    the service never reads it, and on real nodes it is the larger part of the object, in
    memory and for the garbage collector (client-go's informers drop it the same way)."""
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


def resource_version(obj: JSON) -> int:
    """``metadata.resourceVersion`` as a number (0 when absent): etcd's revisions only grow."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


@dataclass(eq=False, repr=False)  # the default repr would print every cached object
class Informer(Generic[T]):
    """A dict of parsed objects kept current by list + watch, with a change signal.

    ``list_call`` returns the raw list, or ``None`` when the API is not served (then
    :attr:`available` is false and the list is retried every :data:`ABSENT_RETRY_S`);
    ``watch_call(resource_version, timeout_s)`` yields watch events; ``key`` names an object
    in the cache (its UID unless told otherwise).
    """

    what: str
    list_call: Callable[[], JSON | None]
    watch_call: Callable[[str, int], Iterator[JSON]]
    parse: Callable[[JSON], T]
    _: KW_ONLY
    key: Callable[[JSON], str] = object_key
    watch_timeout_s: int = 300
    available: bool = field(init=False, default=True)
    # Set on every change; the consumer clears it.
    changed: threading.Event = field(init=False, default_factory=threading.Event)
    synced: threading.Event = field(init=False, default_factory=threading.Event)
    last_change_s: float = field(init=False, default=0.0)  # monotonic time of the last change
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    _items: dict[str, T] = field(init=False, default_factory=dict)
    _versions: dict[str, int] = field(init=False, default_factory=dict)  # key -> resourceVersion
    _rv: str = field(init=False, default="")

    def snapshot(self) -> list[T]:
        """The cached values."""
        with self._lock:
            return list(self._items.values())

    def get(self, key: str) -> T | None:
        """One cached value."""
        with self._lock:
            return self._items.get(key)

    def update(self, obj: JSON) -> None:
        """Adopt an object the caller just wrote (the watch confirms it later), unless the
        cache holds a newer version already."""
        key = self.key(obj)
        with self._lock:
            if resource_version(obj) >= self._versions.get(key, 0):
                self._store(key, obj)

    def relist(self) -> None:
        """Replace the cache with a fresh list."""
        data = self.list_call()
        with self._lock:
            self._items = {}
            self._versions = {}
            if data is None:
                self.available = False
                self._rv = ""
            else:
                self.available = True
                for obj in data.get("items") or ():
                    self._store(self.key(obj), obj)
                self._rv = str((data.get("metadata") or {}).get("resourceVersion", ""))
        self.synced.set()
        self._signal()

    def run(self, stop: threading.Event) -> None:
        """List, then watch until ``stop``; reconnect on errors, relist on ``410 Gone``."""
        backoff = Backoff(WATCH_RETRY_INITIAL_S, WATCH_RETRY_MAX_S)
        while not stop.is_set():
            try:
                if not self.synced.is_set():
                    self.relist()
                if not self.available:
                    stop.wait(ABSENT_RETRY_S)
                    self.synced.clear()
                    continue
                for event in self.watch_call(self._rv, self.watch_timeout_s):
                    if stop.is_set():
                        return
                    self._apply(event)
                backoff.succeed()
            except KubeError as exc:
                if exc.status == 410:
                    # Expired: the API server says so in an ERROR event of a 200 stream (see
                    # _apply); a proxy may answer the request itself with 410. Either way the
                    # history is gone: list again at once, as client-go's informers do.
                    log.info("%s watch expired (%s); listing again", self.what, exc)
                    self.synced.clear()
                    continue
                delay = backoff.fail()
                log.warning("%s watch failed: %s; retrying in %.1fs", self.what, exc, delay)
                stop.wait(delay)
            except Exception as exc:  # noqa: BLE001 - a dropped stream must not end the informer
                delay = backoff.fail()
                log.warning("%s watch interrupted: %s; retrying in %.1fs", self.what, exc, delay)
                stop.wait(delay)

    def _store(self, key: str, obj: JSON) -> None:
        self._items[key] = self.parse(obj)
        self._versions[key] = resource_version(obj)

    def _signal(self) -> None:
        self.last_change_s = time.monotonic()
        self.changed.set()

    def _apply(self, event: JSON) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                self.synced.clear()  # history compacted: relist on the next turn
            raise KubeError(int(obj.get("code") or 0), str(obj.get("message")))
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        with self._lock:
            if rv:
                self._rv = rv
            if kind == "BOOKMARK":
                return
            key = self.key(obj)
            if kind == "DELETED":
                self._items.pop(key, None)
                self._versions.pop(key, None)
            elif resource_version(obj) < self._versions.get(key, 0):
                return  # the caller's own newer write is cached already (update)
            else:
                self._store(key, obj)
        self._signal()


class NodeCache(Informer[JSON]):
    """The informer for nodes, keyed by name, holding the raw objects without managedFields."""

    def __init__(self, kube: Kube, *, watch_timeout_s: int = 300) -> None:
        super().__init__(
            "node",
            kube.list_nodes,
            kube.watch_nodes,
            strip_managed_fields,
            key=node_name,
            watch_timeout_s=watch_timeout_s,
        )
