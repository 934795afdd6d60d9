"""The tiering service's only contact with the Kubernetes API (official ``kubernetes`` client).

Responses are read raw (``_preload_content=False``) and parsed with ``json``: turning 5,000
nodes into generated model objects costs seconds, and the service needs a few fields of each.
Nodes come from a watch-driven cache (list once, then watch from the list's resourceVersion,
relist on ``410 Gone``), the way an informer does.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from nodeagent.kube.client import api_client as build_client
from nodeagent_tiering.cluster import JSON, kueue
from nodeagent_tiering.cluster.units import micro_time

log = logging.getLogger(__name__)

# A dropped watch is retried after 0.5 s, doubling to 30 s while the API server stays away.
WATCH_RETRY_INITIAL_S = 0.5
WATCH_RETRY_MAX_S = 30.0

# Events about cluster-scoped objects (nodes) live here; the API server refuses other namespaces.
CLUSTER_EVENT_NAMESPACE = "default"
MERGE_PATCH = "application/merge-patch+json"
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"  # served since Kueue v0.15 and its storage version since v0.16
APPLY_PATCH = "application/apply-patch+yaml"
LIST_CHUNK = 500  # items per page of a chunked list (what kubectl asks for)
_LEASES = "/apis/coordination.k8s.io/v1"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server was unreachable)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def api_client(
    *, server: str | None = None, kubeconfig: Path | None = None, in_cluster: bool = False
) -> client.ApiClient:
    """A client from the project's one builder (:mod:`nodeagent.kube.client`, kubectl's order).

    Raises:
        NoCredentialsError: no source of credentials applies.
    """
    return build_client(server=server, kubeconfig=kubeconfig, in_cluster=in_cluster)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about."""

    kind: str
    name: str
    namespace: str = ""  # empty for cluster-scoped objects
    uid: str = ""
    api_version: str = "v1"

    @classmethod
    def node(cls, obj: JSON | None, name: str) -> ObjectRef:
        """A Node, with its UID when ``obj`` (the node as read) is known."""
        uid = str(((obj or {}).get("metadata") or {}).get("uid") or "")
        return cls("Node", name, uid=uid)


@dataclass(frozen=True, slots=True)
class EvictResult:
    """The outcome of one eviction request."""

    outcome: str  # "evicted" | "blocked" (429: PDB) | "gone" (404) | "error"
    message: str = ""


class Kube:
    """Typed-enough wrappers over the calls the service makes."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            with _reaching():
                resp = fn(*args, _preload_content=False, **kwargs)
        except client.ApiException as exc:
            raise KubeError(int(exc.status or 0), _message(exc)) from None
        data = resp.data
        return json.loads(data) if data else {}

    def _call_if_found(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON | None:
        """:meth:`_call`, with ``None`` for a 404 (the object, or the API, does not exist)."""
        try:
            result: JSON = self._call(fn, *args, **kwargs)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return result

    # nodes

    def list_nodes(self, label_selector: str | None = None) -> JSON:
        """The NodeList (raw)."""
        result: JSON = self._call(self.core.list_node, label_selector=label_selector)
        return result

    def watch_nodes(self, resource_version: str, timeout_s: int) -> Iterator[JSON]:
        """Watch node events after ``resource_version`` as raw dicts (``type``, ``object``)."""
        return self.watch_objects(self.core.list_node, resource_version, timeout_s)

    def patch_node(self, name: str, patch: JSON) -> JSON:
        """JSON merge patch of a node (a ``metadata.resourceVersion`` in it is a precondition)."""
        result: JSON = self._call(self.core.patch_node, name, patch, _content_type=MERGE_PATCH)
        return result

    # pods

    def pods_on_node(self, node: str) -> list[JSON]:
        """Every pod bound to the node, in all namespaces."""
        data = self._call(
            self.core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )
        items: list[JSON] = data.get("items") or []
        return items

    def evict(self, namespace: str, name: str, grace_s: int | None) -> EvictResult:
        """POST a policy/v1 Eviction; a 429 means a PodDisruptionBudget refuses it for now."""
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
            delete_options=(
                client.V1DeleteOptions(grace_period_seconds=grace_s)
                if grace_s is not None
                else None
            ),
        )
        try:
            self._call(self.core.create_namespaced_pod_eviction, name, namespace, body)
        except KubeError as exc:
            if exc.status == 429:
                return EvictResult("blocked", str(exc))
            if exc.status == 404:
                return EvictResult("gone", str(exc))
            return EvictResult("error", f"{exc.status}: {exc}")
        return EvictResult("evicted")

    # events

    def record_event(
        self,
        about: ObjectRef,
        reason: str,
        message: str,
        *,
        warning: bool,
        now_s: float,
        component: str,
    ) -> None:
        """Record a core/v1 Event about an object (failures only logged).

        The API server keeps an Event in the namespace of the object it is about; for a
        cluster-scoped object such as a Node it must be ``default`` (the kubelet's and the node
        controllers' choice too), any other namespace is refused as invalid. ``kubectl describe``
        finds the Events of an object by its UID, so the reference carries the real one.
        """
        stamp = micro_time(now_s)
        namespace = about.namespace or CLUSTER_EVENT_NAMESPACE
        involved = {"apiVersion": about.api_version, "kind": about.kind, "name": about.name}
        if about.namespace:
            involved["namespace"] = about.namespace
        if about.uid:
            involved["uid"] = about.uid
        body = {
            "metadata": {"generateName": f"{about.name}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": component},
            "firstTimestamp": stamp[:19] + "Z",
            "lastTimestamp": stamp[:19] + "Z",
            "count": 1,
            "reportingComponent": component,
        }
        try:
            self._call(self.core.create_namespaced_event, namespace, body)
        except KubeError as exc:
            log.warning("cannot record event %s on %s %s: %s", reason, about.kind, about.name, exc)

    def list_events(self, namespace: str | None = None) -> list[JSON]:
        """Events about nodes (for the report)."""
        selector = "involvedObject.kind=Node"
        if namespace:
            data = self._call(self.core.list_namespaced_event, namespace, field_selector=selector)
        else:
            data = self._call(self.core.list_event_for_all_namespaces, field_selector=selector)
        items: list[JSON] = data.get("items") or []
        return items

    # the pending-workload diagnosis

    def list_pods(self, field_selector: str | None = None) -> JSON:
        """The PodList of every namespace (raw)."""
        result: JSON = self._call(
            self.core.list_pod_for_all_namespaces, field_selector=field_selector
        )
        return result

    def watch_objects(
        self, list_fn: Callable[..., Any], resource_version: str, timeout_s: int, **kwargs: Any
    ) -> Iterator[JSON]:
        """Watch events of any list call after ``resource_version`` (``type``, ``object``)."""
        try:
            resp: Any = list_fn(
                **kwargs,
                watch=True,
                resource_version=resource_version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
                _preload_content=False,
            )
        except client.ApiException as exc:
            raise KubeError(int(exc.status or 0), _message(exc)) from None
        buffer = b""
        try:
            for chunk in resp.stream(amt=None, decode_content=False):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
        finally:
            resp.release_conn()

    def list_workloads(self) -> JSON | None:
        """Kueue's WorkloadList of every namespace, or ``None`` when Kueue is not installed."""
        return self.list_kueue_plural("workloads")

    def list_kueue_plural(self, plural: str) -> JSON | None:
        """A Kueue list (``workloads``, ``localqueues``, ``clusterqueues``) of every namespace
        in the version the service reads, or ``None`` when Kueue is not installed."""
        return self._call_if_found(
            self.custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, plural
        )

    def list_component_events(self, component: str) -> list[JSON]:
        """The Events ``component`` recorded (about pods and jobs), in every namespace."""
        selector = f"source={component}"
        data = self._call(self.core.list_event_for_all_namespaces, field_selector=selector)
        items: list[JSON] = data.get("items") or []
        return items

    def create_event(self, namespace: str, body: JSON) -> JSON:
        """Create a core/v1 Event."""
        result: JSON = self._call(self.core.create_namespaced_event, namespace, body)
        return result

    def patch_event(self, namespace: str, name: str, patch: JSON) -> JSON:
        """Merge-patch an Event (its count, last timestamp and message)."""
        result: JSON = self._call(
            self.core.patch_namespaced_event, name, namespace, patch, _content_type=MERGE_PATCH
        )
        return result

    def get_config_map(self, namespace: str, name: str) -> JSON | None:
        """The ConfigMap, or ``None`` when it does not exist."""
        return self._call_if_found(self.core.read_namespaced_config_map, name, namespace)

    def create_config_map(self, namespace: str, body: JSON) -> JSON:
        """Create a ConfigMap (409 when it exists)."""
        result: JSON = self._call(self.core.create_namespaced_config_map, namespace, body)
        return result

    def replace_config_map(self, namespace: str, name: str, body: JSON) -> JSON:
        """Replace a ConfigMap; the body's resourceVersion makes a stale write fail with 409."""
        result: JSON = self._call(self.core.replace_namespaced_config_map, name, namespace, body)
        return result

    # leases

    def get_lease(self, namespace: str, name: str) -> JSON | None:
        """The Lease, or ``None`` when it does not exist."""
        return self._call_if_found(self.coordination.read_namespaced_lease, name, namespace)

    def create_lease(self, namespace: str, body: JSON) -> JSON:
        """Create a Lease (409 when someone else created it first)."""
        return self._send("POST", f"{_LEASES}/namespaces/{namespace}/leases", body)

    def replace_lease(self, namespace: str, name: str, body: JSON) -> JSON:
        """Replace a Lease; the body's resourceVersion makes it fail with 409 when stale."""
        return self._send("PUT", f"{_LEASES}/namespaces/{namespace}/leases/{name}", body)

    def _send(self, method: str, path: str, body: JSON) -> JSON:
        """Write a raw JSON body. The generated calls parse a body into the client's models
        first, which turns a Lease's MicroTime into a ``datetime`` and back with ``isoformat``:
        that drops a fraction of zero microseconds, and the API server refuses a MicroTime
        without one (400, "cannot parse ... as .000000")."""
        request = self.api.param_serialize(
            method=method,
            resource_path=path,
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        with _reaching():
            resp = self.api.call_api(*request)
            data = resp.read()  # type: ignore[no-untyped-call]
        answer: JSON = json.loads(data) if data else {}
        if not 200 <= resp.status <= 299:
            raise KubeError(resp.status, str(answer.get("message") or resp.reason))
        return answer

    # Kueue, and the cluster-wide reads of the quota check and the pool review

    def kueue_api(self) -> kueue.KueueApi | None:
        """The Kueue API the cluster serves, found through discovery; ``None`` without Kueue."""
        # A server without API groups (a stand-in) answers 404: no Kueue.
        groups = self._call_if_found(client.ApisApi(self.api).get_api_versions)
        if groups is None:
            return None
        for group in groups.get("groups") or []:
            if group.get("name") != kueue.GROUP:
                continue
            versions = [v.get("version") for v in group.get("versions") or []]
            preferred = (group.get("preferredVersion") or {}).get("version")
            version = kueue.served_version(versions, preferred)
            if version is None:
                return None
            resources = self._call(
                client.CustomObjectsApi(self.api).get_api_resources, kueue.GROUP, version
            )
            plurals = frozenset(
                str(r["name"]) for r in resources.get("resources") or [] if "/" not in r["name"]
            )
            return kueue.KueueApi(version, plurals)
        return None

    def list_kueue(self, api: kueue.KueueApi, kind: kueue.Kind) -> list[JSON]:
        """Every object of a Kueue kind, in all namespaces (chunked)."""
        custom = client.CustomObjectsApi(self.api)
        return self._pages(
            custom.list_cluster_custom_object, kind.group, api.version_of(kind), kind.plural
        )

    def apply_kueue(
        self, api: kueue.KueueApi, kind: kueue.Kind, obj: JSON, *, field_manager: str
    ) -> JSON:
        """Server-side apply of a Kueue object, never forced: a field another manager owns
        makes it fail with 409 instead of being taken over."""
        custom = client.CustomObjectsApi(self.api)
        options: dict[str, Any] = {
            "field_manager": field_manager,
            "force": False,
            "_content_type": APPLY_PATCH,
        }
        fn, where = _kueue_call(
            api,
            kind,
            obj,
            custom.patch_namespaced_custom_object,
            custom.patch_cluster_custom_object,
        )
        result: JSON = self._call(fn, *where, obj, **options)
        return result

    def delete_kueue(
        self, api: kueue.KueueApi, kind: kueue.Kind, obj: JSON, *, same_version: bool = True
    ) -> None:
        """Delete exactly the object read (uid and resourceVersion preconditions): one changed
        or recreated since then stays (409). ``same_version=False`` checks the uid only: for an
        object whose status others keep writing (a queue's usage, an admission policy's type
        check), where a new resourceVersion says nothing about who owns it."""
        custom = client.CustomObjectsApi(self.api)
        meta = obj["metadata"]
        version = meta.get("resourceVersion") if same_version else None
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=meta.get("uid"), resource_version=version)
        )
        fn, where = _kueue_call(
            api,
            kind,
            obj,
            custom.delete_namespaced_custom_object,
            custom.delete_cluster_custom_object,
        )
        self._call(fn, *where, body=body)

    def list_all_pods(self, field_selector: str | None = None) -> list[JSON]:
        """Every pod of the cluster (chunked), or those ``field_selector`` selects."""
        return self._pages(self.core.list_pod_for_all_namespaces, field_selector=field_selector)

    def list_all_events(self) -> list[JSON]:
        """Every Event of the cluster, about any kind (chunked)."""
        return self._pages(self.core.list_event_for_all_namespaces)

    def _pages(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[JSON]:
        """Every item of a list call, read in chunks (``limit`` / ``continue``), so that no
        response has to carry 100,000 objects at once."""
        items: list[JSON] = []
        token: str | None = None
        while True:
            page = self._call(fn, *args, limit=LIST_CHUNK, _continue=token, **kwargs)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or None
            if token is None:
                return items


@contextlib.contextmanager
def _reaching() -> Iterator[None]:
    """Connection failures as ``KubeError`` with status 0 (the server was not reached)."""
    try:
        yield
    except OSError as exc:  # urllib3 wraps connection errors in OSError subclasses
        raise KubeError(0, f"cannot reach the API server: {exc}") from None
    except Exception as exc:
        if exc.__class__.__module__.startswith("urllib3"):
            raise KubeError(0, f"cannot reach the API server: {exc}") from None
        raise


def _kueue_call(
    api: kueue.KueueApi,
    kind: kueue.Kind,
    obj: JSON,
    namespaced: Callable[..., Any],
    cluster_scoped: Callable[..., Any],
) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """The call for one Kueue object by its kind's scope, and the arguments that name the
    object (group, version, the namespace when namespaced, plural, name)."""
    meta = obj["metadata"]
    version = api.version_of(kind)
    if kind.namespaced:
        return namespaced, (kind.group, version, meta["namespace"], kind.plural, meta["name"])
    return cluster_scoped, (kind.group, version, kind.plural, meta["name"])


def _message(exc: client.ApiException) -> str:
    try:
        return str(json.loads(exc.body or "").get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
