"""What the tiering service knows about Kueue's API: the group, the kinds, the served version.

Kueue serves ``kueue.x-k8s.io`` in v1beta1 and, from v0.15, v1beta2 (the storage version from
v0.16). The two differ, for the objects nodeagent writes, in one field: a ClusterQueue joins its
cohort with ``spec.cohortName`` in v1beta2 and ``spec.cohort`` in v1beta1. Which version to
speak is found through discovery (:func:`served_version`), never assumed; a cluster that serves
neither has no Kueue, and every Kueue feature of the service stays off there.

Quantities and times are parsed here once for every reader (flavor sync, quota check, review).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nodeagent import labels as lbl

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # what nodeagent can speak, most preferred first


@dataclass(frozen=True, slots=True)
class Kind:
    """One kind of the quota policy's objects as the REST API names it: Kueue's, in the version
    the cluster serves, or (``group``/``version`` set) one of kube-apiserver's own."""

    kind: str
    plural: str
    namespaced: bool
    group: str = GROUP
    version: str = ""  # "": the Kueue version the cluster serves (:class:`KueueApi`)

    @property
    def api_version(self) -> str:
        """``group/version`` of a kind with a fixed version."""
        return f"{self.group}/{self.version}"


RESOURCE_FLAVOR = Kind("ResourceFlavor", "resourceflavors", namespaced=False)
CLUSTER_QUEUE = Kind("ClusterQueue", "clusterqueues", namespaced=False)
COHORT = Kind("Cohort", "cohorts", namespaced=False)
LOCAL_QUEUE = Kind("LocalQueue", "localqueues", namespaced=True)
WORKLOAD = Kind("Workload", "workloads", namespaced=True)
# The request templates (quota/templates.py): kube-apiserver's, GA since Kubernetes 1.30.
ADMISSION = "admissionregistration.k8s.io"
VALIDATING_POLICY = Kind(
    "ValidatingAdmissionPolicy", "validatingadmissionpolicies", False, ADMISSION, "v1"
)
VALIDATING_BINDING = Kind(
    "ValidatingAdmissionPolicyBinding", "validatingadmissionpolicybindings", False, ADMISSION, "v1"
)
KINDS = {
    k.kind: k
    for k in (
        RESOURCE_FLAVOR,
        CLUSTER_QUEUE,
        COHORT,
        LOCAL_QUEUE,
        WORKLOAD,
        VALIDATING_POLICY,
        VALIDATING_BINDING,
    )
}


@dataclass(frozen=True, slots=True)
class KueueApi:
    """The Kueue API a cluster serves: the version nodeagent speaks, and which kinds it has.

    ``plurals`` is what discovery lists for that version; Cohort objects, for instance, are
    served in v1beta1 only from Kueue v0.13 (a cohort named by a ClusterQueue exists without
    one, so their absence only means nodeagent writes none).
    """

    version: str
    plurals: frozenset[str] = frozenset(k.plural for k in KINDS.values() if k.group == GROUP)

    @property
    def api_version(self) -> str:
        """``kueue.x-k8s.io/<version>``."""
        return f"{GROUP}/{self.version}"

    def serves(self, kind: Kind) -> bool:
        """Whether the cluster serves ``kind`` in this version (kube-apiserver's own kinds:
        always)."""
        return kind.group != GROUP or kind.plural in self.plurals

    def version_of(self, kind: Kind) -> str:
        """The version to read and write ``kind`` in."""
        return kind.version or self.version

    @property
    def cohort_field(self) -> str:
        """The ClusterQueue spec field that names its cohort in this version."""
        return "cohortName" if self.version == "v1beta2" else "cohort"


def served_version(group_versions: Iterable[str], preferred: str | None) -> str | None:
    """The version to speak, from a discovery answer for ``kueue.x-k8s.io``.

    The group's preferred version when nodeagent speaks it, else the newest it speaks that the
    group serves; ``None`` when none (no Kueue, or only versions nodeagent does not know).
    """
    served = set(group_versions)
    if preferred in VERSIONS and preferred in served:
        return preferred
    return next((v for v in VERSIONS if v in served), None)


def managed(obj: Mapping[str, Any]) -> bool:
    """Whether the object carries nodeagent's managed-by label."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(lbl.MANAGED_BY) == lbl.MANAGED_BY_VALUE)


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The status condition of type ``kind``, or ``None``."""
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return cond  # type: ignore[no-any-return]
    return None


def flavor_quotas(cq: Mapping[str, Any]) -> Iterable[tuple[str, str, Mapping[str, Any]]]:
    """Every ``(flavor, resource, quota entry)`` of a ClusterQueue's spec."""
    for group in (cq.get("spec") or {}).get("resourceGroups") or ():
        for flavor in group.get("flavors") or ():
            for res in flavor.get("resources") or ():
                yield str(flavor.get("name")), str(res.get("name")), res


def referenced_flavors(cqs: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Flavor name -> the ClusterQueues whose spec names it."""
    out: dict[str, list[str]] = {}
    for cq in cqs:
        name = str((cq.get("metadata") or {}).get("name"))
        seen: set[str] = set()
        for group in (cq.get("spec") or {}).get("resourceGroups") or ():
            for flavor in group.get("flavors") or ():
                seen.add(str(flavor.get("name")))
        for flavor_name in sorted(seen):
            out.setdefault(flavor_name, []).append(name)
    return out


def cohort_of(cq: Mapping[str, Any]) -> str | None:
    """The cohort a ClusterQueue joins, in either API version."""
    spec = cq.get("spec") or {}
    value = spec.get("cohortName") or spec.get("cohort")
    return str(value) if value else None
