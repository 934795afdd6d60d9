"""A local stand-in for the Kubernetes API server, on loopback, for tests and benchmarks.

It is faithful where nodeagent's code depends on the API server's behaviour:

- nodes, pods, events (core/v1), leases (coordination.k8s.io/v1) and PodDisruptionBudgets
  (policy/v1), each with create, get, list, replace (PUT), patch and delete;
- one cluster-wide ``resourceVersion`` counter (like etcd's revision); lists report it, and
  ``?watch=true&resourceVersion=N`` streams every change after N as JSON lines over chunked
  HTTP/1.1 (``ADDED``/``MODIFIED``/``DELETED``), or ``410 Gone`` when N is older than the kept
  history; ``timeoutSeconds`` ends a watch;
- ``labelSelector`` (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!key``) and
  ``fieldSelector`` (dotted-path equality/inequality, e.g. ``spec.nodeName=n1``) on lists and
  watches; ``limit``/``continue`` paging;
- JSON merge patch (RFC 7386), strategic merge patch (node ``status.conditions`` merge by
  ``type``, ``$patch: delete`` items; node ``spec.taints`` is atomic, as in Kubernetes, so it
  is replaced whole) and JSON patch (RFC 6902);
- optimistic concurrency: a write whose body carries ``metadata.resourceVersion`` different
  from the stored one answers ``409 Conflict`` (leases rely on this);
- the main endpoint of nodes and pods ignores ``status`` and ``/status`` ignores everything but
  ``status`` (the status-subresource split);
- ``POST .../pods/NAME/eviction``: ``429`` when the pod's PodDisruptionBudget allows no
  disruption, ``500`` when several budgets select the pod, else the pod is deleted.

Tests reach the store directly through :meth:`KubeAPIServer.put` / :meth:`get` /
:meth:`patch_direct` (no HTTP) and inspect :attr:`KubeAPIServer.requests`, a log of every HTTP
request with its body; :meth:`KubeAPIServer.wait_for` blocks until a predicate over the
stand-in holds. ``stop()`` then ``start()`` is an outage: open connections are cut, the store is
kept, and the server comes back on the same port. Run
``python -m tests.support.kubeapi --nodes 5000 --pods 50000`` to serve a populated cluster in its
own process (the tiering benchmark does).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import math
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

JSON = dict[str, Any]


@dataclass(frozen=True)
class Kind:
    """One resource type the stand-in serves."""

    plural: str
    kind: str
    api_version: str
    namespaced: bool
    prefix: str  # "/api/v1" or "/apis/<group>/<version>"


KINDS: dict[str, Kind] = {
    k.plural: k
    for k in (
        Kind("nodes", "Node", "v1", False, "/api/v1"),
        Kind("pods", "Pod", "v1", True, "/api/v1"),
        Kind("events", "Event", "v1", True, "/api/v1"),
        Kind("leases", "Lease", "coordination.k8s.io/v1", True, "/apis/coordination.k8s.io/v1"),
        Kind(
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            "policy/v1",
            True,
            "/apis/policy/v1",
        ),
    )
}

# Resources whose status lives behind the /status subresource.
_STATUS_SPLIT = {"nodes", "pods"}

# Strategic merge patch: lists merged by a key instead of replaced (path from the object root).
# Node spec.taints has no patch strategy in Kubernetes (it is replaced whole), so it is absent.
_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("spec", "containers"): "name",
    ("metadata", "ownerReferences"): "uid",
}


class ApiError(Exception):
    """An error the stand-in answers with a ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


@dataclass(frozen=True)
class RequestRecord:
    """One HTTP request the stand-in served."""

    method: str
    path: str
    query: Mapping[str, str]
    content_type: str
    body: Any
    status: int
    received_s: float = 0.0  # time.perf_counter() when the request arrived (for latency)


@dataclass
class _Change:
    rv: int
    plural: str
    type: str
    obj: JSON


@dataclass
class _Store:
    objects: dict[str, dict[tuple[str, str], JSON]] = field(
        default_factory=lambda: {plural: {} for plural in KINDS}
    )
    history: list[_Change] = field(default_factory=list)
    rv: int = 0
    # spec.nodeName -> pod keys, so "pods on this node" is not a scan of every pod.
    pods_by_node: dict[str, set[tuple[str, str]]] = field(default_factory=dict)


def now_rfc3339() -> str:
    """The current time as Kubernetes writes it (second precision, UTC, ``Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- selectors --------------------------------------------------------------------------------

_SET_RE = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    current = ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """Compile a Kubernetes label selector string into a predicate over a label map."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for term in _split_selector(text):
        match = _SET_RE.match(term)
        if match:
            key, op, values_text = match.groups()
            values = {v.strip() for v in values_text.split(",") if v.strip()}
            if op == "in":
                tests.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                tests.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            absent = term[1:].strip()
            tests.append(lambda labels, k=absent: k not in labels)
        else:
            tests.append(lambda labels, k=term: k in labels)
    return lambda labels: all(t(labels) for t in tests)


def _dotted(obj: JSON, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def field_selector(text: str) -> Callable[[JSON], bool]:
    """Compile a field selector (``a.b=v``, ``a.b==v``, ``a.b!=v``, comma-joined)."""
    tests: list[Callable[[JSON], bool]] = []
    for term in _split_selector(text):
        if "!=" in term:
            path, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda o, p=path, v=value: _dotted(o, p) != v)
        elif "=" in term:
            path, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda o, p=path, v=value: _dotted(o, p) == v)
        else:
            raise ApiError(400, "BadRequest", f"invalid field selector term {term!r}")
    return lambda obj: all(t(obj) for t in tests)


def match_label_selector_object(selector: JSON | None, labels: Mapping[str, str]) -> bool:
    """Whether a structured ``LabelSelector`` (matchLabels/matchExpressions) selects labels."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        present = key in labels
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


# --- patches ----------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, ``null`` deletes, the rest replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch for the fields the stand-in knows (see ``_MERGE_KEYS``)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and sub in _MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, _MERGE_KEYS[sub], sub)
        elif isinstance(value, dict):
            result[key] = strategic_merge_patch(result.get(key), value, sub)
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current: list[Any], patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(422, "Invalid", f"{'.'.join(path)}: every item needs {key!r}")
        index = next((i for i, m in enumerate(merged) if m.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if index is not None:
                merged.pop(index)
        elif index is None:
            merged.append({k: v for k, v in item.items() if not k.startswith("$")})
        else:
            merged[index] = strategic_merge_patch(merged[index], item, path)
    return merged


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    return [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]


def json_patch(target: JSON, ops: list[JSON]) -> JSON:
    """RFC 6902 JSON patch (add, remove, replace, test)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = _pointer(op["path"])
        parent: Any = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1]
        name = op["op"]
        try:
            if name == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != op["value"]:
                    raise ApiError(422, "Invalid", f"test failed at {op['path']}")
            elif name == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif name in ("add", "replace"):
                if isinstance(parent, list):
                    if last == "-":
                        parent.append(op["value"])
                    elif name == "add":
                        parent.insert(int(last), op["value"])
                    else:
                        parent[int(last)] = op["value"]
                else:
                    if name == "replace" and last not in parent:
                        raise ApiError(422, "Invalid", f"no value at {op['path']} to replace")
                    parent[last] = op["value"]
            else:
                raise ApiError(422, "Invalid", f"unsupported JSON patch op {name!r}")
        except (KeyError, IndexError) as exc:
            raise ApiError(422, "Invalid", f"no value at {op['path']}") from exc
    return doc


# --- the server -------------------------------------------------------------------------------


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A connection cut by stop() (or by a client giving up) is expected, not worth a trace.
        pass


class KubeAPIServer:
    """The stand-in: a threaded HTTP server over an in-memory object store."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, history_limit: int = 200_000):
        self._lock = threading.Condition()  # an RLock inside: wait_for predicates may re-enter
        self._store = _Store()
        self._history_limit = history_limit
        self._record = True
        self.requests: list[RequestRecord] = []
        self._closing = False
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._server: _HTTPServer | None = _HTTPServer((host, port), _make_handler(self))
        # The bound address (the real port when 0 was asked for), kept so a restart reuses it.
        bound_host, bound_port = self._server.server_address[:2]
        self._address = (str(bound_host), int(bound_port))
        self._thread: threading.Thread | None = None

    # lifecycle

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:41234`` (the same across a stop and start)."""
        host, port = self._address
        return f"http://{host!s}:{port}"

    def start(self) -> KubeAPIServer:
        """Serve on a background thread; after :meth:`stop`, serve again on the same port."""
        if self._server is None:
            self._server = _HTTPServer(self._address, _make_handler(self))
        with self._lock:
            self._closing = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="kubeapi", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every open watch and cut every open connection; keep the store.

        Cutting keep-alive connections is what makes this an outage: otherwise a client's pooled
        connection would still be served by its handler thread after the listener closed.
        """
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        with self._connections_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # already closed by its handler
                conn.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def record_requests(self, enabled: bool) -> None:
        """Turn the request log on or off (off for benchmarks: it holds every body)."""
        self._record = enabled

    @property
    def resource_version(self) -> int:
        """The current cluster-wide resource version."""
        with self._lock:
            return self._store.rv

    def reset(self) -> None:
        """Forget every object and request (reuse one server across property-test examples)."""
        with self._lock:
            self._store = _Store(rv=self._store.rv)
            self.requests = []

    # direct access for tests (no HTTP)

    def put(self, plural: str, obj: JSON) -> JSON:
        """Create or replace an object directly (status included), as a test fixture does."""
        with self._lock:
            meta = obj.setdefault("metadata", {})
            key = (meta.get("namespace", "") if KINDS[plural].namespaced else "", meta["name"])
            exists = key in self._store.objects[plural]
            return self._commit(plural, key, obj, "MODIFIED" if exists else "ADDED")

    def get(self, plural: str, name: str, namespace: str = "") -> JSON | None:
        """The stored object, or ``None``."""
        with self._lock:
            return self._store.objects[plural].get((namespace, name))

    def list(self, plural: str) -> list[JSON]:
        """Every stored object of a kind."""
        with self._lock:
            return list(self._store.objects[plural].values())

    def patch_direct(self, plural: str, name: str, patch: JSON, namespace: str = "") -> JSON:
        """Apply a strategic merge patch directly (status included)."""
        with self._lock:
            current = self._store.objects[plural][(namespace, name)]
            merged = strategic_merge_patch(current, patch)
            return self._commit(plural, (namespace, name), merged, "MODIFIED")

    def delete_direct(self, plural: str, name: str, namespace: str = "") -> None:
        """Delete an object directly."""
        with self._lock:
            current = self._store.objects[plural].get((namespace, name))
            if current is not None:
                self._remove(plural, (namespace, name), current)

    def requests_matching(self, method: str, path_re: str) -> list[RequestRecord]:
        """Logged requests with this method whose path matches the regular expression."""
        pattern = re.compile(path_re)
        return [r for r in self.requests if r.method == method and pattern.search(r.path)]

    def node_condition(self, node: str, condition_type: str) -> JSON | None:
        """A copy of the node's status condition of this type, or ``None`` (no node or none)."""
        with self._lock:
            obj = self._store.objects["nodes"].get(("", node))
            for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
                if cond.get("type") == condition_type:
                    return copy.deepcopy(dict(cond))
        return None

    def wait_for(
        self, predicate: Callable[[KubeAPIServer], object], timeout_s: float = 5.0
    ) -> bool:
        """Block until ``predicate(self)`` is true; ``False`` when ``timeout_s`` passes first.

        The predicate is checked now and again after every stored change and every logged
        request (so predicates over :attr:`requests` need the request log on).
        """
        with self._lock:
            return bool(self._lock.wait_for(lambda: predicate(self), timeout_s))

    # store internals (call with the lock held)

    def _commit(self, plural: str, key: tuple[str, str], obj: JSON, kind: str) -> JSON:
        store = self._store
        store.rv += 1
        spec = KINDS[plural]
        obj = dict(obj)
        meta = dict(obj.get("metadata") or {})
        meta["name"] = key[1]
        if spec.namespaced:
            meta["namespace"] = key[0]
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now_rfc3339())
        meta["resourceVersion"] = str(store.rv)
        obj["metadata"] = meta
        obj["kind"] = spec.kind
        obj["apiVersion"] = spec.api_version
        previous = store.objects[plural].get(key)
        store.objects[plural][key] = obj
        if plural == "pods":
            self._index_pod(key, previous, obj)
        self._append(_Change(store.rv, plural, kind, obj))
        return obj

    def _remove(self, plural: str, key: tuple[str, str], current: JSON) -> None:
        store = self._store
        store.rv += 1
        del store.objects[plural][key]
        if plural == "pods":
            self._index_pod(key, current, None)
        gone = dict(current)
        gone["metadata"] = {**current["metadata"], "resourceVersion": str(store.rv)}
        self._append(_Change(store.rv, plural, "DELETED", gone))

    def _index_pod(self, key: tuple[str, str], old: JSON | None, new: JSON | None) -> None:
        index = self._store.pods_by_node
        if old is not None:
            index.get((old.get("spec") or {}).get("nodeName") or "", set()).discard(key)
        if new is not None:
            index.setdefault((new.get("spec") or {}).get("nodeName") or "", set()).add(key)

    def _append(self, change: _Change) -> None:
        history = self._store.history
        history.append(change)
        if len(history) > self._history_limit:
            del history[: len(history) - self._history_limit]
        self._lock.notify_all()

    # request handling

    def handle(self, method: str, path: str, query: dict[str, str], body: Any, ctype: str) -> Any:
        """Route one request; returns a JSON body or an iterator of watch lines."""
        plural, namespace, name, sub = _route(path)
        spec = KINDS[plural]
        if sub not in ("", "status", "eviction") or (sub == "eviction" and plural != "pods"):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub == "status" and plural not in _STATUS_SPLIT:
            raise ApiError(404, "NotFound", f"{plural} has no status subresource")
        if method == "GET" and name is None:
            if query.get("watch") in ("true", "1"):
                return self._watch(plural, namespace, query)
            return self._list(spec, namespace, query)
        with self._lock:
            if method == "GET":
                return self._get_or_404(spec, namespace, name)
            if method == "POST" and sub == "eviction":
                return self._evict(namespace or "", name or "", body)
            if method == "POST":
                return self._create(spec, namespace, body)
            if method == "PUT":
                return self._replace(spec, namespace, name or "", body, sub)
            if method == "PATCH":
                return self._patch(spec, namespace, name or "", body, ctype, sub)
            if method == "DELETE":
                current = self._get_or_404(spec, namespace, name)
                self._remove(plural, (namespace or "", name or ""), current)
                return current
        raise ApiError(405, "MethodNotAllowed", f"{method} is not supported on {path}")

    def _get_or_404(self, spec: Kind, namespace: str | None, name: str | None) -> JSON:
        obj = self._store.objects[spec.plural].get((namespace or "", name or ""))
        if obj is None:
            raise ApiError(
                404,
                "NotFound",
                f'{spec.plural} "{name}" not found',
                {"name": name, "kind": spec.plural},
            )
        return obj

    def _filter(
        self, spec: Kind, namespace: str | None, query: Mapping[str, str]
    ) -> Callable[[JSON], bool]:
        labels = label_selector(query.get("labelSelector", ""))
        fields = field_selector(query.get("fieldSelector", ""))

        def accept(obj: JSON) -> bool:
            meta = obj["metadata"]
            if namespace and meta.get("namespace") != namespace:
                return False
            return labels(meta.get("labels") or {}) and fields(obj)

        return accept

    def _list(self, spec: Kind, namespace: str | None, query: Mapping[str, str]) -> JSON:
        accept = self._filter(spec, namespace, query)
        with self._lock:
            rv = self._store.rv
            objects = self._store.objects[spec.plural]
            node_name = _node_name_selector(query.get("fieldSelector", ""))
            if spec.plural == "pods" and node_name is not None:
                keys = sorted(self._store.pods_by_node.get(node_name, set()))
                candidates = [objects[k] for k in keys]
            else:
                candidates = [objects[k] for k in sorted(objects)]
            items = [o for o in candidates if accept(o)]
        start = 0
        if query.get("continue"):
            token = json.loads(base64.b64decode(query["continue"]))
            start, rv = token["start"], token["rv"]
        meta: JSON = {"resourceVersion": str(rv)}
        limit = int(query.get("limit") or 0)
        if limit > 0 and start + limit < len(items):
            token = {"start": start + limit, "rv": rv}
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(items) - start - limit
            items = items[start : start + limit]
        else:
            items = items[start:]
        return {
            "kind": f"{spec.kind}List",
            "apiVersion": spec.api_version,
            "metadata": meta,
            "items": items,
        }

    def _watch(
        self, plural: str, namespace: str | None, query: Mapping[str, str]
    ) -> Iterator[JSON]:
        spec = KINDS[plural]
        accept = self._filter(spec, namespace, query)
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        with self._lock:
            since = int(query.get("resourceVersion") or 0) or self._store.rv
            history = self._store.history
            if history and since < history[0].rv - 1:
                gone = ApiError(410, "Expired", f"too old resource version: {since}")
                return iter([{"type": "ERROR", "object": gone.status()}])

        def stream() -> Iterator[JSON]:
            last = since
            while True:
                with self._lock:
                    pending = self._changes_after(last)
                    while not pending:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0 or self._closing:
                            return
                        self._lock.wait(min(remaining, 0.5))
                        pending = self._changes_after(last)
                for change in pending:
                    last = change.rv
                    if change.plural == plural and accept(change.obj):
                        yield {"type": change.type, "object": change.obj}

        return stream()

    def _changes_after(self, rv: int) -> list[_Change]:
        history = self._store.history
        if not history or history[-1].rv <= rv:
            return []
        # History is sorted by rv: binary search for the first newer change.
        lo, hi = 0, len(history)
        while lo < hi:
            mid = (lo + hi) // 2
            if history[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return history[lo:]

    def _create(self, spec: Kind, namespace: str | None, body: Any) -> JSON:
        if not isinstance(body, dict) or not (body.get("metadata") or {}).get("name"):
            generate = (body or {}).get("metadata", {}).get("generateName")
            if not generate:
                raise ApiError(422, "Invalid", "metadata.name: Required value")
            body["metadata"]["name"] = generate + uuid.uuid4().hex[:5]
        key = (namespace or "", body["metadata"]["name"])
        if key in self._store.objects[spec.plural]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{spec.plural} "{key[1]}" already exists',
                {"name": key[1], "kind": spec.plural},
            )
        body["metadata"].pop("resourceVersion", None)
        return self._commit(spec.plural, key, body, "ADDED")

    def _check_version(self, spec: Kind, current: JSON, body: Any) -> None:
        wanted = ((body or {}).get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {spec.plural} "{current["metadata"]["name"]}":'
                " the object has been modified; please apply your changes to the latest version"
                " and try again",
                {"name": current["metadata"]["name"], "kind": spec.plural},
            )

    def _split(self, spec: Kind, current: JSON, updated: JSON, sub: str) -> JSON:
        """Keep status on main-endpoint writes and everything but status on /status writes."""
        if spec.plural not in _STATUS_SPLIT:
            return updated
        if sub == "status":
            kept = dict(current)
            kept["status"] = updated.get("status", {})
            return kept
        updated = dict(updated)
        if "status" in current:
            updated["status"] = current["status"]
        else:
            updated.pop("status", None)
        return updated

    def _replace(self, spec: Kind, namespace: str | None, name: str, body: Any, sub: str) -> JSON:
        current = self._get_or_404(spec, namespace, name)
        self._check_version(spec, current, body)
        if (body.get("metadata") or {}).get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the URL")
        updated = self._split(spec, current, body, sub)
        updated["metadata"] = {
            **body["metadata"],
            "uid": current["metadata"]["uid"],
            "creationTimestamp": current["metadata"].get("creationTimestamp"),
        }
        return self._commit(spec.plural, (namespace or "", name), updated, "MODIFIED")

    def _patch(
        self, spec: Kind, namespace: str | None, name: str, body: Any, ctype: str, sub: str
    ) -> JSON:
        current = self._get_or_404(spec, namespace, name)
        base = ctype.split(";")[0].strip()
        if base == "application/merge-patch+json":
            self._check_version(spec, current, body)
            merged = merge_patch(current, body)
        elif base == "application/strategic-merge-patch+json":
            self._check_version(spec, current, body)
            merged = strategic_merge_patch(current, body)
        elif base == "application/json-patch+json":
            if not isinstance(body, list):
                raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
            merged = json_patch(current, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {base!r}")
        if not isinstance(merged, dict):
            raise ApiError(422, "Invalid", "the patch must leave an object")
        merged["metadata"] = {
            **(merged.get("metadata") or {}),
            "name": name,
            "uid": current["metadata"]["uid"],
        }
        updated = self._split(spec, current, merged, sub)
        return self._commit(spec.plural, (namespace or "", name), updated, "MODIFIED")

    def _evict(self, namespace: str, name: str, body: Any) -> JSON:
        pod = self._get_or_404(KINDS["pods"], namespace, name)
        labels = pod["metadata"].get("labels") or {}
        budgets = [
            pdb
            for (ns, _), pdb in self._store.objects["poddisruptionbudgets"].items()
            if ns == namespace and match_label_selector_object(pdb["spec"].get("selector"), labels)
        ]
        if len(budgets) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource"
                " does not support.",
            )
        if budgets and not self._disruption_allowed(budgets[0], pod):
            pdb_name = budgets[0]["metadata"]["name"]
            raise ApiError(
                429,
                "TooManyRequests",
                "Cannot evict pod as it would violate the pod's disruption budget.",
                {
                    "causes": [
                        {
                            "reason": "DisruptionBudget",
                            "message": f"The disruption budget {pdb_name} needs more healthy pods",
                        }
                    ]
                },
            )
        self._remove("pods", (namespace, name), pod)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _disruption_allowed(self, pdb: JSON, pod: JSON) -> bool:
        selector = pdb["spec"].get("selector")
        ns = pdb["metadata"]["namespace"]
        selected = [
            p
            for (pns, _), p in self._store.objects["pods"].items()
            if pns == ns
            and match_label_selector_object(selector, p["metadata"].get("labels") or {})
        ]
        healthy = sum(1 for p in selected if pod_ready(p))
        expected = len(selected)
        spec = pdb["spec"]
        if "minAvailable" in spec:
            desired = _int_or_percent(spec["minAvailable"], expected, round_up=True)
        elif "maxUnavailable" in spec:
            desired = expected - _int_or_percent(spec["maxUnavailable"], expected, round_up=True)
        else:
            desired = expected
        if not pod_ready(pod) and spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
            return True
        if not pod_ready(pod):
            return healthy >= desired  # IfHealthyBudget: unhealthy pods go if the budget holds
        return healthy - desired > 0


def pod_ready(pod: JSON) -> bool:
    """A pod counts as healthy for a PDB when its Ready condition is True and it is not deleting."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = float(value[:-1]) * total / 100
        return math.ceil(share) if round_up else math.floor(share)
    return int(value)


def _node_name_selector(text: str) -> str | None:
    for term in _split_selector(text):
        if "!=" not in term and term.replace("==", "=").startswith("spec.nodeName="):
            return term.replace("==", "=").split("=", 1)[1].strip()
    return None


_PATH_RE = re.compile(
    r"^(?:/api/v1|/apis/[^/]+/v1)"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?$"
)


def _route(path: str) -> tuple[str, str | None, str | None, str]:
    match = _PATH_RE.match(path)
    if not match or match["plural"] not in KINDS:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource {path}")
    spec = KINDS[match["plural"]]
    if not path.startswith(spec.prefix + "/"):
        raise ApiError(404, "NotFound", f"{spec.plural} is not served under this group")
    if match["ns"] and not spec.namespaced:
        raise ApiError(404, "NotFound", f"{spec.plural} is not namespaced")
    return match["plural"], match["ns"], match["name"], match["sub"] or ""


def _make_handler(api: KubeAPIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go out in separate writes

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def setup(self) -> None:
            super().setup()
            with api._connections_lock:
                api._connections.add(self.connection)

        def finish(self) -> None:
            with api._connections_lock:
                api._connections.discard(self.connection)
            super().finish()

        def _serve(self, method: str) -> None:
            received = time.perf_counter()
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            ctype = self.headers.get("Content-Type") or ""
            body: Any = None
            result: Any = None
            try:
                body = json.loads(raw) if raw else None
                result = api.handle(method, parts.path, query, body, ctype)
                status = 201 if method == "POST" and isinstance(result, dict) else 200
            except ApiError as exc:
                status, result = exc.code, exc.status()
            except (ValueError, KeyError, TypeError) as exc:
                status, result = 400, ApiError(400, "BadRequest", str(exc)).status()
            # Log before answering, so a client that got its answer finds its request logged.
            if api._record:
                record = RequestRecord(method, parts.path, query, ctype, body, status, received)
                with api._lock:
                    api.requests.append(record)
                    api._lock.notify_all()  # wake wait_for() callers
            if isinstance(result, dict):
                self._send_json(status, result)
            else:
                self._stream(result)

        def _send_json(self, status: int, body: JSON) -> None:
            data = json.dumps(body, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _stream(self, lines: Iterator[JSON]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for line in lines:
                    data = json.dumps(line, separators=(",", ":")).encode() + b"\n"
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

    return Handler


# --- fixtures ---------------------------------------------------------------------------------


def make_node(
    name: str,
    labels: Mapping[str, str] | None = None,
    *,
    gpu_healthy: bool | None = True,
    reason: str = "AllGPUsHealthy",
    message: str = "",
) -> JSON:
    """A Node object as the agents leave it (labels, a ``GPUHealthy`` condition, Ready)."""
    conditions: list[JSON] = [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    if gpu_healthy is not None:
        conditions.append(
            {
                "type": "GPUHealthy",
                "status": "True" if gpu_healthy else "False",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now_rfc3339(),
            }
        )
    return {
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {},
        "status": {"conditions": conditions},
    }


def make_pod(
    name: str,
    node: str,
    *,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    owner_kind: str | None = "ReplicaSet",
    mirror: bool = False,
    grace_s: int = 30,
    ready: bool = True,
) -> JSON:
    """A running Pod bound to ``node`` (DaemonSet-owned with ``owner_kind="DaemonSet"``)."""
    meta: JSON = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
    if owner_kind:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner", "uid": name}
        ]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "mirror"}
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": grace_s,
            "containers": [{"name": "main", "image": "registry.example/job:1"}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def make_pdb(
    name: str,
    match_labels: Mapping[str, str],
    *,
    namespace: str = "default",
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
) -> JSON:
    """A policy/v1 PodDisruptionBudget."""
    spec: JSON = {"selector": {"matchLabels": dict(match_labels)}}
    if min_available is not None:
        spec["minAvailable"] = min_available
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def populate(api: KubeAPIServer, nodes: int, pods: int) -> None:
    """Fill the store with a mixed GPU cluster (used by the benchmark)."""
    products = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S"]
    for i in range(nodes):
        product = products[i % len(products)]
        labels = {
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": "8",
            "nodeagent.io/nvlink-largest-set": "8" if "L40S" not in product else "1",
            "nodeagent.io/stability": "stable",
            "nodeagent.io/gpu-health": "healthy",
            "nodeagent.io/pool": "default",
        }
        api.put("nodes", make_node(f"node-{i:05d}", labels))
    for j in range(pods):
        api.put("pods", make_pod(f"pod-{j:06d}", f"node-{j % max(nodes, 1):05d}"))


def main() -> None:
    """Serve a populated stand-in until killed; prints the URL on the first line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--pods", type=int, default=0)
    args = parser.parse_args()
    api = KubeAPIServer(port=args.port)
    api.record_requests(False)
    populate(api, args.nodes, args.pods)
    api.start()
    print(api.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        api.stop()


if __name__ == "__main__":
    main()


__all__ = [
    "KINDS",
    "ApiError",
    "HTTPStatus",
    "KubeAPIServer",
    "RequestRecord",
    "label_selector",
    "make_node",
    "make_pdb",
    "make_pod",
    "merge_patch",
    "populate",
    "strategic_merge_patch",
]
