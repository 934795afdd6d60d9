"""The DRA driver's API server adapter: read ResourceClaims, keep this node's ResourceSlices.

Only this module talks to the API for the DRA feature. Errors come out as
:class:`~nodeagent.kube.node_patcher.KubeUnavailableError` (slices: the caller retries with backoff)
or :class:`~nodeagent_dra.driver.PrepareError` (claims: the claim's error, the kubelet retries).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from nodeagent.kube.node_patcher import KubeUnavailableError, api_errors
from nodeagent_dra.driver import PrepareError

log = logging.getLogger(__name__)


def _json(response: Any) -> Any:
    return json.loads(response.data)


class ApiClaims:
    """ResourceClaims read from the API server (what the kubelet's request does not carry)."""

    def __init__(self, api_client: Any, request_timeout_s: float = 5.0) -> None:
        self.api = client.ResourceV1Api(api_client)
        self.timeout_s = request_timeout_s

    def get(self, namespace: str, name: str, timeout_s: float | None = None) -> Any:
        """The claim's JSON (any shape: the driver validates it), read within ``timeout_s``
        (at most the configured request timeout). Raises PrepareError naming why it could not
        be read."""
        timeout = self.timeout_s if timeout_s is None else min(timeout_s, self.timeout_s)
        if timeout <= 0:
            raise PrepareError(f"no time left to read claim {namespace}/{name}")
        try:
            # Not preloaded: the raw response, whose body is read here, within the same timeout.
            answer: Any = self.api.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=timeout
            )
            data = answer.data
        except ApiException as exc:
            if exc.status == 404:
                raise PrepareError(f"claim {namespace}/{name} not found") from exc
            raise PrepareError(
                f"API server answered {exc.status} {exc.reason} for claim {namespace}/{name}"
            ) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            # Without retries urllib3 wraps a timeout in MaxRetryError; its reason says which.
            if isinstance(exc, urllib3.exceptions.TimeoutError) or isinstance(
                getattr(exc, "reason", None), urllib3.exceptions.TimeoutError
            ):
                raise PrepareError(
                    f"API server did not answer within {timeout:.1f}s reading claim "
                    f"{namespace}/{name}; the kubelet retries"
                ) from exc
            raise PrepareError(f"API server unreachable reading {namespace}/{name}: {exc}") from exc
        try:
            return json.loads(data)
        except ValueError as exc:  # not JSON, or not UTF-8
            raise PrepareError(
                f"API server's answer for claim {namespace}/{name} is not JSON: {exc}"
            ) from exc


class SlicePublisher:
    """Creates, replaces and deletes this node's ResourceSlices of one driver."""

    def __init__(
        self, api_client: Any, node_name: str, driver: str, request_timeout_s: float = 5.0
    ) -> None:
        self.resources = client.ResourceV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.node_name = node_name
        self.driver = driver
        self.timeout_s = request_timeout_s
        self.writes = 0  # API writes sent (tests count them: unchanged slices send none)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with api_errors(f"to {what}"):
            return fn(*args, _request_timeout=self.timeout_s, **kwargs)

    def current(self) -> list[dict[str, Any]]:
        """This node's slices of the driver, as stored."""
        selector = f"spec.nodeName={self.node_name},spec.driver={self.driver}"
        answer = self._call(
            "list ResourceSlices",
            self.resources.list_resource_slice,
            field_selector=selector,
            _preload_content=False,
        )
        items: list[dict[str, Any]] = _json(answer).get("items", [])
        return items

    def generation(self) -> int:
        """The highest pool generation stored now (0 when there is none)."""
        return max((int(s["spec"]["pool"]["generation"]) for s in self.current()), default=0)

    def node_uid(self) -> str | None:
        """The Node's UID (the slices' owner), or None when the Node cannot be read."""
        try:
            node = self._call(
                "read Node", self.core.read_node, self.node_name, _preload_content=False
            )
        except KubeUnavailableError as exc:
            log.info("publishing ResourceSlices without an owner: %s", exc)
            return None
        uid: str | None = _json(node).get("metadata", {}).get("uid")
        return uid

    def publish(self, slices: Sequence[Mapping[str, Any]]) -> None:
        """Make the stored slices exactly ``slices``: replace, create, then delete the rest."""
        stored = {s["metadata"]["name"]: s for s in self.current()}
        for body in slices:
            name = body["metadata"]["name"]
            old = stored.pop(name, None)
            if old is None:
                self._call("create ResourceSlice", self.resources.create_resource_slice, body)
            else:
                meta = {**body["metadata"], "resourceVersion": old["metadata"]["resourceVersion"]}
                self._call(
                    "replace ResourceSlice",
                    self.resources.replace_resource_slice,
                    name,
                    {**body, "metadata": meta},
                )
            self.writes += 1
        for name in stored:
            self._call("delete ResourceSlice", self.resources.delete_resource_slice, name)
            self.writes += 1

    def withdraw(self) -> None:
        """Delete every slice of this node and driver (the driver stops serving it)."""
        self.publish([])
