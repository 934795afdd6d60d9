"""A watch-driven cache of one kind of object, kept as parsed values (pods, Kueue Workloads).

List once, then watch from the list's resourceVersion, relist on ``410 Gone``, reconnect with
backoff, as client-go's informers do. Objects are parsed on arrival (``parse``), so a cluster
of 50,000 pods is held as small frozen values rather than raw JSON.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from nodeagent.runtime.backoff import Backoff
from nodeagent_tiering.kube import WATCH_RETRY_INITIAL_S, WATCH_RETRY_MAX_S, KubeError

log = logging.getLogger(__name__)

T = TypeVar("T")
JSON = dict[str, Any]
ABSENT_RETRY_S = 300.0  # an API that is not served (Kueue not installed) is asked again this often


def object_key(obj: JSON) -> str:
    """The UID, else ``namespace/name``."""
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


class Informer(Generic[T]):
    """A dict of parsed objects kept current by list + watch, with a change signal.

    ``list_call`` returns the raw list, or ``None`` when the API is not served (then
    :attr:`available` is false and the list is retried every :data:`ABSENT_RETRY_S`);
    ``watch_call(resource_version, timeout_s)`` yields watch events.
    """

    def __init__(
        self,
        what: str,
        list_call: Callable[[], JSON | None],
        watch_call: Callable[[str, int], Iterator[JSON]],
        parse: Callable[[JSON], T],
        *,
        watch_timeout_s: int = 300,
    ) -> None:
        self.what = what
        self._list = list_call
        self._watch = watch_call
        self._parse = parse
        self._timeout = watch_timeout_s
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._rv = ""
        self.available = True
        self.changed = threading.Event()
        self.synced = threading.Event()

    def snapshot(self) -> list[T]:
        """The cached values."""
        with self._lock:
            return list(self._items.values())

    def relist(self) -> None:
        """Replace the cache with a fresh list."""
        data = self._list()
        with self._lock:
            if data is None:
                self.available = False
                self._items = {}
                self._rv = ""
            else:
                self.available = True
                self._items = {object_key(o): self._parse(o) for o in data.get("items") or ()}
                self._rv = str((data.get("metadata") or {}).get("resourceVersion", ""))
        self.synced.set()
        self.changed.set()

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
                for event in self._watch(self._rv, self._timeout):
                    if stop.is_set():
                        return
                    self._apply(event)
                backoff.succeed()
            except KubeError as exc:
                delay = backoff.fail()
                log.warning("%s watch failed: %s; retrying in %.1fs", self.what, exc, delay)
                stop.wait(delay)
            except Exception as exc:  # noqa: BLE001 - a dropped stream must not end the informer
                delay = backoff.fail()
                log.warning("%s watch interrupted: %s; retrying in %.1fs", self.what, exc, delay)
                stop.wait(delay)

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
            key = object_key(obj)
            if kind == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = self._parse(obj)
        self.changed.set()
