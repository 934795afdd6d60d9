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
    jobs:                           # batch/v1 Jobs; a suspended one with a queue-name label
      - {apiVersion: batch/v1, kind: Job, metadata: {...}, spec: {...}}  # waits in Kueue
    kueue: []                       # optional Kueue objects (Workloads with status, queues...)

Read by the project's one YAML reader (:mod:`nodeagent.config.yamlfile`: UTF-8 only, no tags,
limits on size, nesting and alias expansion sized for a cluster's worth of pods), then
validated strictly with pydantic: unknown fields are errors, in the file's own sections and in
the Pod manifests (checked against the Kubernetes client's field names, so a misspelt
``nodeSelectr`` does not silently change the answer). What the API server would refuse is
refused here too, so the simulation never answers for a cluster that cannot exist: label keys
and values, node, pod and namespace names, taint and toleration keys, and every resource
quantity (the one Kubernetes quantity parser, :mod:`nodeagent.config.quantity`; device counts
such as ``nvidia.com/gpu`` must be whole and not negative). Every error is one line naming the
file, the line and the field (and the pod, for a pod's field). Preset names are checked by the
command (the simulator is not a dependency of the tiering service).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal

from kubernetes import client
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
)

from nodeagent.config.errors import ConfigError
from nodeagent.config.quantity import QuantityError, parse_count, parse_quantity
from nodeagent.config.types import (
    AnyLabelValue,
    LabelKey,
    Labels,
    dns_label,
    dns_subdomain,
    label_key,
)
from nodeagent.config.yamlfile import Document, Limits, parse_document, read_document

KUEUE_GROUP = "kueue.x-k8s.io/"
KUEUE_KINDS = ("ResourceFlavor", "ClusterQueue", "LocalQueue", "Workload", "Cohort")
# A cluster file holds a cluster's pods: 10,000 pods are ~2 MB and ~150,000 values. The limits
# leave room for far more, while an alias bomb stops after 200,000 values (well under a second)
# -- enough for every pod of a large file to share one aliased spec.
LIMITS = Limits(
    max_bytes=64 * 1024 * 1024,
    max_values=5_000_000,
    max_alias_values=200_000,
    size_hint="split the cluster into smaller files",
)


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


class Resources(_Strict):
    """A container's resources; the quantities are checked per pod (:func:`_resource_problems`), so
    the error can name the pod."""

    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    claims: list[dict[str, Any]] | None = None


class _Read(BaseModel):
    """A part of a Kubernetes object the simulation reads: typed, every other field allowed."""

    model_config = ConfigDict(extra="allow", frozen=True)


class _Expression(_Read):
    key: str
    operator: str
    values: list[str] | None = None


class _SelectorTerm(_Read):
    matchExpressions: list[_Expression] | None = None  # noqa: N815 - Kubernetes' name
    matchFields: list[_Expression] | None = None  # noqa: N815 - Kubernetes' name


class _NodeSelector(_Read):
    nodeSelectorTerms: list[_SelectorTerm]  # noqa: N815 - Kubernetes' name


class _NodeAffinity(_Read):
    requiredDuringSchedulingIgnoredDuringExecution: _NodeSelector | None = None  # noqa: N815


class Affinity(_Read):
    """A pod's affinity: the required node affinity is what the simulation reads."""

    nodeAffinity: _NodeAffinity | None = None  # noqa: N815 - Kubernetes' name
    podAffinity: dict[str, Any] | None = None  # noqa: N815 - Kubernetes' name
    podAntiAffinity: dict[str, Any] | None = None  # noqa: N815 - Kubernetes' name


def _amount(value: object) -> object:
    """A quota or usage quantity: a number or quantity string, 0 or more."""
    try:
        amount = parse_quantity(value)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    if amount < 0:
        raise ValueError(f"{value!r} is negative; a quantity is 0 or more")
    return value


Amount = Annotated[int | str, AfterValidator(_amount)]


class _QuotaEntry(_Read):
    name: str
    nominalQuota: Amount  # noqa: N815 - Kueue's name
    borrowingLimit: Amount | None = None  # noqa: N815 - Kueue's name
    lendingLimit: Amount | None = None  # noqa: N815 - Kueue's name


class _FlavorQuotas(_Read):
    name: str
    resources: list[_QuotaEntry]


class _ResourceGroup(_Read):
    coveredResources: list[str] = []  # noqa: N815 - Kueue's name
    flavors: list[_FlavorQuotas]


class _UsageEntry(_Read):
    name: str
    total: Amount = 0
    borrowed: Amount = 0


class _FlavorUsage(_Read):
    name: str
    resources: list[_UsageEntry] = []


class _ClusterQueueSpec(_Read):
    resourceGroups: list[_ResourceGroup] = []  # noqa: N815 - Kueue's name


class _ClusterQueueStatus(_Read):
    flavorsUsage: list[_FlavorUsage] = []  # noqa: N815 - Kueue's name


class ClusterQueue(_Read):
    """The parts of a ClusterQueue the simulation reads: its quotas and what Kueue reports used."""

    spec: _ClusterQueueSpec
    status: _ClusterQueueStatus | None = None


def _toleration_key(key: str) -> str:
    return key if key == "" else label_key(key)


class Toleration(_Strict):
    """A pod toleration."""

    key: Annotated[str, AfterValidator(_toleration_key)] | None = None
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
            "nodeName": (Annotated[str, AfterValidator(_node_name)] | None, None),
            "nodeSelector": (Labels | None, None),
            "tolerations": (list[Toleration] | None, None),
            "schedulingGates": (list[Gate] | None, None),
            "affinity": (Affinity | None, None),
        },
        "PodSpec",
    )
    meta = _known(
        client.V1ObjectMeta,
        {
            "name": (Annotated[str, AfterValidator(_pod_name)], ...),
            "namespace": (Annotated[str, AfterValidator(_namespace)], "default"),
            "labels": (Labels | None, None),
            "annotations": (
                Annotated[dict[str, str], AfterValidator(_annotation_keys)] | None,
                None,
            ),
        },
        "ObjectMeta",
    )
    return container, spec, meta


_V1: Any = Literal["v1"]
_POD: Any = Literal["Pod"]


_BATCH_V1: Any = Literal["batch/v1"]
_JOB: Any = Literal["Job"]


def _job_model() -> type[BaseModel]:
    """A Job: its pod template checked as strictly as a Pod, the fields Kueue reads typed."""
    _, spec, meta = _pod_models()
    template = create_model(
        "PodTemplateSpec",
        __config__=ConfigDict(extra="forbid", frozen=True),
        metadata=(dict[str, Any] | None, None),
        spec=(spec, ...),
    )
    job_spec = create_model(
        "JobSpec",
        # Fields the simulation does not read (backoffLimit, completionMode...) pass.
        __config__=ConfigDict(extra="allow", frozen=True),
        template=(template, ...),
        parallelism=(Annotated[int, Field(ge=0)] | None, None),
        completions=(Annotated[int, Field(ge=0)] | None, None),
        suspend=(bool | None, None),
    )
    return create_model(
        "Job",
        __config__=ConfigDict(extra="forbid", frozen=True),
        apiVersion=(_BATCH_V1, ...),
        kind=(_JOB, ...),
        metadata=(meta, ...),
        spec=(job_spec, ...),
        status=(dict[str, Any] | None, None),
    )


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
    return dns_subdomain(value, 253, "node name")


def _pod_name(value: str) -> str:
    return dns_subdomain(value, 253, "pod name")


def _namespace(value: str) -> str:
    return dns_label(value, "namespace")


def _annotation_keys(values: dict[str, str]) -> dict[str, str]:
    for key in values:  # annotation keys follow the label-key rules; values are free text
        label_key(key)
    return values


def _kueue_api_version(value: str) -> str:
    if not value.startswith(KUEUE_GROUP):
        raise ValueError(f"{value!r} is not a Kueue API version ({KUEUE_GROUP}v1beta2)")
    return value


class Taint(_Strict):
    """A node taint."""

    key: LabelKey
    value: AnyLabelValue = ""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class Mig(_Strict):
    """The MIG layout the node's agent applies."""

    layout: str  # a layout name in ``file`` (default: the built-in layouts)
    file: str | None = None  # a mig-parted file, relative to the cluster file


class Node(_Strict):
    """One simulated node."""

    name: Annotated[str, AfterValidator(_node_name)]
    preset: str
    labels: Labels = {}
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
    jobs: list[dict[str, Any]] = []
    kueue: list[KueueObject] = []


# --- loading with lines -------------------------------------------------------------------------


def _line(doc: Document, loc: tuple[Any, ...]) -> int:
    return doc.line(loc) or 1


def _where(loc: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in loc) or "(top)"


def _first_error(
    doc: Document,
    exc: ValidationError,
    prefix: tuple[Any, ...] = (),
    pod: str | None = None,
    kind: str = "pod",
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
    if pod is not None:
        message = f"{message} ({kind} {pod})"
    return f"{doc.name}:{_line(doc, loc)}: {_where(loc)}: {message}"


def _resource_problems(spec: Mapping[str, Any]) -> Iterator[tuple[tuple[Any, ...], str]]:
    """``(path below spec, what is wrong)`` for each resource the API server would refuse."""
    for section in ("containers", "initContainers"):
        for c_index, container in enumerate(spec.get(section) or ()):
            resources = container.get("resources") or {}
            for kind in ("limits", "requests"):
                for name, value in (resources.get(kind) or {}).items():
                    at = (section, c_index, "resources", kind, name)
                    try:
                        label_key(name)  # a resource name is a qualified name, like a label key
                    except ValueError:
                        yield at, f"{name!r} is not a valid resource name"
                        continue
                    try:
                        if "/" in name and not name.startswith("kubernetes.io/"):
                            parse_count(value)  # an extended resource: whole devices
                        elif parse_quantity(value) < 0:
                            yield at, f"{value!r} is negative; a quantity is 0 or more"
                    except QuantityError as exc:
                        yield at, str(exc)


def parse_cluster(text: str | bytes, source: str = "<cluster>") -> ClusterFile:
    """Validate a cluster file's text.

    Raises:
        ClusterFileError: the first problem, as ``file:line: field: what``.
    """
    try:
        doc = parse_document(text, source, LIMITS)
    except ConfigError as exc:
        raise ClusterFileError(str(exc.problems[0])) from None
    return _validate(doc)


def _check_manifests(
    doc: Document,
    section: str,
    kind: str,
    manifests: list[dict[str, Any]],
    model: type[BaseModel],
    pod_spec: tuple[str, ...],
) -> None:
    """Check one section of Kubernetes manifests (``pods``, ``jobs``): each against ``model``,
    the quantities of the pod spec at ``pod_spec``, and no ``namespace/name`` twice."""
    seen: dict[str, int] = {}
    for i, obj in enumerate(manifests):
        meta = obj.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        key = f"{(meta or {}).get('namespace') or 'default'}/{name}" if name else None
        try:
            model.model_validate(obj)
        except ValidationError as exc:
            raise ClusterFileError(_first_error(doc, exc, (section, i), key, kind)) from None
        spec: Any = obj
        for part in pod_spec:
            spec = spec[part]
        for at, problem in _resource_problems(spec):
            loc = (section, i, *pod_spec, *at)
            raise ClusterFileError(
                f"{doc.name}:{_line(doc, loc)}: {_where(loc)}: {problem} ({kind} {key})"
            )
        assert key is not None  # the model requires metadata.name
        if key in seen:
            raise ClusterFileError(
                f"{doc.name}:{_line(doc, (section, i))}: {section}.{i}: {kind} {key} is already "
                f"defined at line {seen[key]}"
            )
        seen[key] = _line(doc, (section, i))


def _validate(doc: Document) -> ClusterFile:
    source, data = doc.name, doc.data
    if data is None:
        raise ClusterFileError(f"{source}:1: the file is empty; start it with `version: v1`")
    if isinstance(data, dict) and data.get("version", "v1") != "v1":
        raise ClusterFileError(
            f"{source}:{_line(doc, ('version',))}: version: {data['version']!r} is not "
            "supported (this nodeagent reads v1)"
        )
    try:
        cluster = ClusterFile.model_validate(data)
    except ValidationError as exc:
        raise ClusterFileError(_first_error(doc, exc)) from None
    _check_manifests(doc, "pods", "pod", cluster.pods, _pod_model(), ("spec",))
    _check_manifests(doc, "jobs", "job", cluster.jobs, _job_model(), ("spec", "template", "spec"))
    for i, obj in enumerate(cluster.kueue):
        if obj.kind == "ClusterQueue":
            try:
                ClusterQueue.model_validate(obj.model_dump())
            except ValidationError as exc:
                name = obj.metadata.get("name")
                raise ClusterFileError(
                    _first_error(doc, exc, ("kueue", i), str(name), "ClusterQueue")
                ) from None
    names: dict[str, int] = {}
    for i, node in enumerate(cluster.nodes):
        if node.name in names:
            raise ClusterFileError(
                f"{source}:{_line(doc, ('nodes', i, 'name'))}: nodes.{i}.name: node "
                f"{node.name} is already defined at line {names[node.name]}"
            )
        names[node.name] = _line(doc, ("nodes", i, "name"))
    return cluster


def load_cluster(path: Path) -> ClusterFile:
    """Read and validate a cluster file.

    Raises:
        ClusterFileError: unreadable, not UTF-8, beyond the reader's limits, or invalid (one
            line naming the file and line).
    """
    try:
        doc = read_document(path, LIMITS)
    except ConfigError as exc:
        raise ClusterFileError(str(exc.problems[0])) from None
    return _validate(doc)


def line_of(text: str, loc: tuple[Any, ...]) -> int:
    """The line of ``loc`` (``("nodes", 0, "preset")``) in a cluster file's text."""
    try:
        return _line(parse_document(text, "<cluster>", LIMITS), loc)
    except ConfigError:
        return 1
