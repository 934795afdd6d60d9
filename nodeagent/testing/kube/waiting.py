"""Waiting for the API server's objects to reach a state, by watching them (no sleeps).

:func:`until` lists, checks, then watches from the list's resourceVersion and checks again on
every change, so a test waits exactly as long as the component under test takes. An API server
restart or an expired watch just means a fresh list. On timeout the AssertionError names what
was awaited (say, ``"tiering: node n1 cordoned"``; a callable is called then, so it can add the
end of a component's log) and shows the objects as last seen.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

JSON = dict[str, Any]
T = TypeVar("T")
Objects = dict[str, JSON]  # "namespace/name" (or "name") -> object
What = str | Callable[[], str]


def _key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _lines(resp: Any) -> Any:
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line


def _summary(objects: Objects, limit: int = 1500) -> str:
    shown = {}
    for key, obj in objects.items():
        meta = obj.get("metadata") or {}
        shown[key] = {
            "labels": meta.get("labels"),
            "annotations": meta.get("annotations"),
            "deletionTimestamp": meta.get("deletionTimestamp"),
            "spec": obj.get("spec") if obj.get("kind") in ("Node", "Lease") else None,
            "status": (obj.get("status") or {}).get("conditions") or (obj.get("status") or {}),
            **({"reason": obj["reason"], "message": obj.get("message")} if "reason" in obj else {}),
        }
    text = json.dumps(shown, default=str)
    return text if len(text) <= limit else text[:limit] + "..."


def until(
    list_fn: Callable[..., Any],
    predicate: Callable[[Objects], T | None],
    *,
    what: What,
    timeout_s: float = 30.0,
    **kwargs: Any,
) -> T:
    """The first truthy ``predicate(objects)`` over what ``list_fn(**kwargs)`` lists and watches.

    ``list_fn`` is a generated list call (``CoreV1Api(api).list_node``, a bound
    ``list_namespaced_pod`` with ``namespace=``...); ``kwargs`` select (``field_selector=``,
    ``label_selector=``, ``namespace=``).
    """
    deadline = time.monotonic() + timeout_s
    objects: Objects = {}
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            described = what() if callable(what) else what
            raise AssertionError(
                f"{described}: not reached within {timeout_s:.0f}s; last seen: {_summary(objects)}"
            )
        try:
            listed = json.loads(list_fn(**kwargs, _preload_content=False).data)
            objects = {_key(o): o for o in listed.get("items") or []}
            result = predicate(objects)
            if result:
                return result
            resp = list_fn(
                **kwargs,
                watch=True,
                resource_version=listed["metadata"]["resourceVersion"],
                allow_watch_bookmarks=True,
                timeout_seconds=max(1, int(remaining)),
                _preload_content=False,
                _request_timeout=remaining + 5,
            )
            try:
                for line in _lines(resp):
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        break  # expired: list again
                    if kind == "BOOKMARK":
                        continue
                    if kind == "DELETED":
                        objects.pop(_key(obj), None)
                    else:
                        objects[_key(obj)] = obj
                    result = predicate(objects)
                    if result:
                        return result
                    if time.monotonic() > deadline:
                        break
            finally:
                resp.release_conn()
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
            time.sleep(0.1)  # an API server restart: list again once it answers


def node(
    api: client.ApiClient,
    name: str,
    predicate: Callable[[JSON], object],
    *,
    what: What,
    timeout_s: float = 30.0,
) -> JSON:
    """Node ``name`` as soon as ``predicate(node)`` holds."""

    def check(objects: Objects) -> JSON | None:
        obj = objects.get(name)
        return obj if obj is not None and predicate(obj) else None

    return until(
        client.CoreV1Api(api).list_node,
        check,
        what=what,
        timeout_s=timeout_s,
        field_selector=f"metadata.name={name}",
    )


def pods(
    api: client.ApiClient,
    namespace: str,
    predicate: Callable[[dict[str, JSON]], T | None],
    *,
    what: What,
    timeout_s: float = 30.0,
) -> T:
    """The first truthy ``predicate(pods by name)`` over the pods of ``namespace``."""
    core = client.CoreV1Api(api)

    def check(objects: Objects) -> T | None:
        return predicate({k.split("/", 1)[1]: v for k, v in objects.items()})

    return until(
        core.list_namespaced_pod, check, what=what, timeout_s=timeout_s, namespace=namespace
    )


def events(
    api: client.ApiClient,
    about: str,
    predicate: Callable[[list[JSON]], T | None],
    *,
    namespace: str = "default",
    what: What,
    timeout_s: float = 30.0,
) -> T:
    """The first truthy ``predicate(events)`` over the Events about object ``about`` in
    ``namespace`` (Events about nodes live in ``default``), oldest first."""

    def check(objects: Objects) -> T | None:
        return predicate(sorted(objects.values(), key=_event_order))

    return until(
        client.CoreV1Api(api).list_namespaced_event,
        check,
        what=what,
        timeout_s=timeout_s,
        namespace=namespace,
        field_selector=f"involvedObject.name={about}",
    )


def _event_order(event: JSON) -> int:
    return int((event.get("metadata") or {}).get("resourceVersion") or 0)


def condition(obj: JSON, kind: str) -> JSON | None:
    """The status condition of type ``kind`` of an object, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None
