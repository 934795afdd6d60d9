"""The cluster file (``version: v1``) that ``nodeagent tiering simulate`` reads.

::

    version: v1
    nodes:                          # each node is simulated as its agent would publish it
      - name: gpu-a
        preset: dgx-h100            # a simulator preset (`nodeagent sim presets`)
        labels: {nodeagent.io/tier: training}   # added to (and winning over) the agent's labels
        taints: [{key: pool, value: training, effect: NoSchedule}]
        unschedulable: false        # cordoned
        mig: {layout: all-balanced, file: layouts.yaml}   # a mig-parted layout; file optional
    pods:                           # ordinary Pod manifests: with spec.nodeName it runs there,
      - {apiVersion: v1, kind: Pod, metadata: {...}, spec: {...}}   # without it it is pending
    kueue: []                       # optional Kueue objects (Workloads with status, queues...)

Validated strictly with pydantic: unknown fields are errors, in the file's own sections and in
the Pod manifests (checked against the Kubernetes client's field names, so a misspelt
``nodeSelectr`` does not silently change the answer). Every error is one line naming the file,
the line and the field. Preset names are checked by the command (the simulator is not a
dependency of the tiering service).
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from kubernetes import client
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)

KUEUE_GROUP = "kueue.x-k8s.io/"
KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "Workload", "Cohort")
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class ClusterFileError(ValueError):
    """The cluster file is unreadable or invalid; the message is one line with file:line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- Pod manifests: typed where the diagnosis reads, every other Kubernetes field allowed ------


def _known(model: type, typed: dict[str, Any], name: str) -> type[BaseModel]:
    """A strict model with ``typed`` fields plus every other JSON field of the client's model."""
    fields: dict[str, Any] = {
        json_name: (Any, None)
        for json_name in model.attribute_map.values()  # type: ignore[attr-defined]
        if json_name not in typed
    }
    fields.update(typed)
    return create_model(name, __config__=ConfigDict(extra="forbid", frozen=True), **fields)


Quantity = int | str


class Resources(_Strict):
    """A container's resources."""

    limits: dict[str, Quantity] = {}
    requests: dict[str, Quantity] = {}
    claims: list[dict[str, Any]] | None = None


class Toleration(_Strict):
    """A pod toleration."""

    key: str | None = None
    operator: Literal["Equal", "Exists"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    tolerationSeconds: int | None = None  # noqa: N815 - the Kubernetes field name


class Gate(_Strict):
    """A scheduling gate."""

    name: str


@cache
def _pod_models() -> tuple[type[BaseModel], type[BaseModel], type[BaseModel]]:
    container = _known(
        client.V1Container, {"name": (str, ...), "resources": (Resources | None, None)}, "Container"
    )
    spec = _known(
        client.V1PodSpec,
        {
            "containers": (Annotated[list[container], Field(min_length=1)], ...),  # type: ignore[valid-type]
            "initContainers": (list[container] | None, None),  # type: ignore[valid-type]
            "nodeName": (str | None, None),
            "nodeSelector": (dict[str, str] | None, None),
            "tolerations": (list[Toleration] | None, None),
            "schedulingGates": (list[Gate] | None, None),
            "affinity": (dict[str, Any] | None, None),
        },
        "PodSpec",
    )
    meta = _known(
        client.V1ObjectMeta,
        {
            "name": (str, ...),
            "namespace": (str, "default"),
            "labels": (dict[str, str] | None, None),
            "annotations": (dict[str, str] | None, None),
        },
        "ObjectMeta",
    )
    return container, spec, meta


_V1: Any = Literal["v1"]
_POD: Any = Literal["Pod"]


def _pod_model() -> type[BaseModel]:
    _, spec, meta = _pod_models()
    return create_model(
        "Pod",
        __config__=ConfigDict(extra="forbid", frozen=True),
        apiVersion=(_V1, ...),
        kind=(_POD, ...),
        metadata=(meta, ...),
        spec=(spec, ...),
        status=(dict[str, Any] | None, None),
    )


# --- the file's own sections --------------------------------------------------------------------


def _node_name(value: str) -> str:
    if not _DNS_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid node name (DNS-1123 subdomain)")
    return value


def _kueue_api_version(value: str) -> str:
    if not value.startswith(KUEUE_GROUP):
        raise ValueError(f"{value!r} is not a Kueue API version ({KUEUE_GROUP}v1beta2)")
    return value


class Taint(_Strict):
    """A node taint."""

    key: str
    value: str = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Mig(_Strict):
    """The MIG layout the node's agent applies."""

    layout: str  # a layout name in ``file`` (default: the built-in layouts)
    file: str | None = None  # a mig-parted file, relative to the cluster file


class Node(_Strict):
    """One simulated node."""

    name: Annotated[str, AfterValidator(_node_name)]
    preset: str
    labels: dict[str, str] = {}
    taints: list[Taint] = []
    unschedulable: bool = False
    mig: Mig | None = None


class KueueObject(BaseModel):
    """A Kueue object, passed through (its own controller validates it on a real cluster)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    apiVersion: Annotated[str, AfterValidator(_kueue_api_version)]  # noqa: N815 - Kubernetes' name
    kind: Literal["ResourceFlavor", "ClusterQueue", "LocalQueue", "Workload", "Cohort"]
    metadata: dict[str, Any]


class ClusterFile(_Strict):
    """The whole file."""

    version: Literal["v1"]
    nodes: Annotated[list[Node], Field(min_length=1)]
    pods: list[dict[str, Any]] = []
    kueue: list[KueueObject] = []


# --- loading with lines -------------------------------------------------------------------------


def _lines(node: yaml.Node, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    out[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[(*path, key.value)] = key.start_mark.line + 1
            _lines(value, (*path, key.value), out)
            out[(*path, key.value)] = key.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)


def _line(lines: dict[tuple[Any, ...], int], loc: tuple[Any, ...]) -> int:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return 1


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top)"


def _first_error(
    source: str,
    exc: ValidationError,
    lines: dict[tuple[Any, ...], int],
    prefix: tuple[Any, ...] = (),
) -> str:
    err = exc.errors()[0]
    loc = (*prefix, *err["loc"])
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    elif err["type"] == "missing":
        message = "required field missing"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return f"{source}:{_line(lines, loc)}: {_where(loc)}: {message}"


def parse_cluster(text: str, source: str = "<cluster>") -> ClusterFile:
    """Validate a cluster file's text.

    Raises:
        ClusterFileError: the first problem, as ``file:line: field: what``.
    """
    try:
        root = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise ClusterFileError(f"{source}:{line}: not valid YAML ({exc})") from None
    if root is None or data is None:
        raise ClusterFileError(f"{source}:1: the file is empty; start it with `version: v1`")
    lines: dict[tuple[Any, ...], int] = {}
    _lines(root, (), lines)
    if isinstance(data, dict) and data.get("version", "v1") != "v1":
        raise ClusterFileError(
            f"{source}:{_line(lines, ('version',))}: version: {data['version']!r} is not "
            "supported (this nodeagent reads v1)"
        )
    try:
        cluster = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise ClusterFileError(_first_error(source, exc, lines)) from None
    pod_model = _pod_model()
    seen: dict[str, int] = {}
    for i, pod in enumerate(cluster.pods):
        try:
            pod_model.model_validate(pod)
        except ValidationError as exc:
            raise ClusterFileError(_first_error(source, exc, lines, ("pods", i))) from None
        meta = pod["metadata"]
        key = f"{meta.get('namespace') or 'default'}/{meta['name']}"
        if key in seen:
            raise ClusterFileError(
                f"{source}:{_line(lines, ('pods', i))}: pods.{i}: pod {key} is already defined "
                f"at line {seen[key]}"
            )
        seen[key] = _line(lines, ("pods", i))
    names: dict[str, int] = {}
    for i, node in enumerate(cluster.nodes):
        if node.name in names:
            raise ClusterFileError(
                f"{source}:{_line(lines, ('nodes', i, 'name'))}: nodes.{i}.name: node "
                f"{node.name} is already defined at line {names[node.name]}"
            )
        names[node.name] = _line(lines, ("nodes", i, "name"))
    return cluster


def load_cluster(path: Path) -> ClusterFile:
    """Read and validate a cluster file.

    Raises:
        ClusterFileError: unreadable or invalid (one line naming the file and line).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ClusterFileError(f"{path}: cannot read: {exc.strerror}") from None
    return parse_cluster(text, str(path))


def line_of(text: str, loc: tuple[Any, ...]) -> int:
    """The line of ``loc`` (``("nodes", 0, "preset")``) in a cluster file's text."""
    lines: dict[tuple[Any, ...], int] = {}
    root = yaml.compose(text)
    if root is not None:
        _lines(root, (), lines)
    return _line(lines, loc)
