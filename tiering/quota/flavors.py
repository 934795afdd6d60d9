"""Tiers as Kueue ResourceFlavors, kept in sync by the tiering service.

One flavor per tier selects the tier's nodes by the label the service writes
(``nodeagent.io/tier``); a tier the quota policy splits by GPU product gets one flavor per
product instead, which adds ``nvidia.com/gpu.product``. A tier whose nodes carry taints (a
dedicated tier) declares them in the quota policy: they become the flavor's ``nodeTaints``
and, unless ``tolerate: false``, tolerations Kueue adds to the pods it admits there. The
quarantine tier gets no flavor: nothing is ever admitted onto quarantined nodes.

:class:`FlavorSync` keeps the cluster's flavors equal to the desired ones, and nothing more:

- it touches only flavors labelled ``app.kubernetes.io/managed-by: nodeagent``; a flavor of the
  same name that someone else made is left alone and reported;
- it writes with server-side apply as field manager ``nodeagent`` and never forces: a field
  someone else changed by hand stays as they left it, and the flavor is reported as drifted
  (metric, log, and the pool review) until the two agree again;
- a flavor nodeagent made that the policy no longer wants is deleted only once no ClusterQueue
  names it (Kueue's own ``resource-in-use`` finalizer is a second guard).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nodeagent import labels as lbl
from nodeagent_tiering.cluster import JSON, kueue
from nodeagent_tiering.cluster.cluster_api import KubeError
from nodeagent_tiering.cluster.nodes import Taint

log = logging.getLogger(__name__)


FIELD_MANAGER = "nodeagent"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class TaintSpec:
    """A taint the nodes of a tier carry."""

    key: str
    value: str
    effect: str  # NoSchedule | NoExecute

    def taint(self) -> JSON:
        """As a ``corev1.Taint``."""
        out: JSON = {"key": self.key, "effect": self.effect}
        if self.value:
            out["value"] = self.value
        return out

    def toleration(self) -> JSON:
        """The toleration that matches exactly this taint."""
        if not self.value:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}

    def on(self, taints: Iterable[Taint]) -> bool:
        """Whether a node's taints include this one."""
        return any(
            t.key == self.key and t.value == self.value and t.effect == self.effect for t in taints
        )


@dataclass(frozen=True, slots=True)
class FlavorSettings:
    """What the quota policy says about a tier's flavors."""

    products: tuple[str, ...] = ()
    taints: tuple[TaintSpec, ...] = ()
    tolerate: bool = True
    reserve: bool = False  # some of the tier's nodes are kept for large jobs: a flavor of theirs


RESERVED_TAINT = TaintSpec(lbl.RESERVED, lbl.RESERVED_VALUE, "NoSchedule")


@dataclass(frozen=True, slots=True)
class Flavor:
    """One desired ResourceFlavor."""

    name: str
    tier: str
    product: str | None = None
    taints: tuple[TaintSpec, ...] = ()
    tolerate: bool = True
    # None: the tier keeps no nodes for large jobs; True: the flavor of the nodes it keeps
    # (labelled and tainted :data:`RESERVED_TAINT`); False: its other nodes.
    reserved: bool | None = None

    @property
    def node_labels(self) -> dict[str, str]:
        """The node labels the flavor selects."""
        out = {lbl.TIER: self.tier}
        if self.product is not None:
            out[lbl.GPU_PRODUCT] = self.product
        if self.reserved:
            out[lbl.RESERVED] = lbl.RESERVED_VALUE
        return out

    def selects(self, labels: Mapping[str, str]) -> bool:
        """Whether a node with these labels belongs to the flavor (a tier's reserved nodes
        belong to its reserved flavor only: the taint keeps the other flavor's pods off)."""
        if self.reserved is False and labels.get(lbl.RESERVED) == lbl.RESERVED_VALUE:
            return False
        return all(labels.get(k) == v for k, v in self.node_labels.items())

    def spec(self) -> JSON:
        """The flavor's spec."""
        spec: JSON = {"nodeLabels": self.node_labels}
        if self.taints:
            spec["nodeTaints"] = [t.taint() for t in self.taints]
            if self.tolerate:
                spec["tolerations"] = [t.toleration() for t in self.taints]
        return spec

    def labels(self) -> dict[str, str]:
        """The flavor object's own labels."""
        out = {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE, lbl.TIER: self.tier}
        if self.product is not None:
            out[lbl.GPU_PRODUCT_FLAVOR] = self.product
        return out

    def to_object(self, api: kueue.KueueApi) -> JSON:
        """The ResourceFlavor object."""
        return {
            "apiVersion": api.api_version,
            "kind": kueue.RESOURCE_FLAVOR.kind,
            "metadata": {"name": self.name, "labels": self.labels()},
            "spec": self.spec(),
        }


def _name(prefix: str, *parts: str) -> str:
    text = "-".join(parts)
    return prefix + re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")


def desired_flavors(
    tiers: Iterable[str], settings: Mapping[str, FlavorSettings], *, prefix: str = ""
) -> list[Flavor]:
    """The flavors for ``tiers`` (in order), each tier as its settings say.

    Raises:
        ValueError: a flavor name is not a valid object name, or two tiers or products would
            share one.
    """
    out: list[Flavor] = []
    seen: dict[str, str] = {}
    for tier in dict.fromkeys(tiers):
        s = settings.get(tier) or FlavorSettings()
        wanted: list[tuple[str, str | None]] = [(_name(prefix, tier, p), p) for p in s.products]
        wanted = wanted or [(_name(prefix, tier), None)]
        for name, product in wanted:
            what = f"tier {tier}" + (f" product {product}" if product else "")
            if not DNS_SUBDOMAIN.match(name) or len(name) > 253:
                raise ValueError(f"{what}: flavor name {name!r} is not a valid object name")
            if name in seen:
                raise ValueError(f"{what} and {seen[name]} would both be flavor {name}")
            seen[name] = what
            out.append(
                Flavor(name, tier, product, s.taints, s.tolerate, False if s.reserve else None)
            )
        if s.reserve:
            # Whole nodes for large jobs: tolerated only by what Kueue admits to this flavor,
            # so the tier's other flavor never places a pod there.
            name = _name(prefix, tier, "reserved")
            if not DNS_SUBDOMAIN.match(name) or len(name) > 253 or name in seen:
                raise ValueError(f"tier {tier}: reserved flavor name {name!r} is taken or invalid")
            seen[name] = f"tier {tier} reserved nodes"
            taints = (*s.taints, RESERVED_TAINT)
            out.append(Flavor(name, tier, None, taints, True, True))
    return out


# --- comparing what is there with what is wanted --------------------------------------------


def _normal_spec(spec: Mapping[str, Any]) -> JSON:
    """A flavor spec reduced to what nodeagent sets (the API server adds ``timeAdded`` and
    Kueue defaults nothing here), with lists in a stable order."""

    def taint(t: Mapping[str, Any]) -> tuple[str, str, str]:
        return (str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))

    def toleration(t: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(
            str(t.get(k) or "") for k in ("key", "operator", "value", "effect", "tolerationSeconds")
        )

    return {
        "nodeLabels": dict(spec.get("nodeLabels") or {}),
        "nodeTaints": sorted(taint(t) for t in spec.get("nodeTaints") or ()),
        "tolerations": sorted(toleration(t) for t in spec.get("tolerations") or ()),
        "topologyName": spec.get("topologyName") or "",
    }


def differences(desired: Flavor, actual: Mapping[str, Any]) -> list[str]:
    """The spec fields of ``actual`` (an object) that differ from ``desired``."""
    want = _normal_spec(desired.spec())
    have = _normal_spec(actual.get("spec") or {})
    return [f"spec.{k}" for k in want if want[k] != have[k]]


def editors(obj: Mapping[str, Any]) -> list[str]:
    """Field managers other than nodeagent that own part of the object's spec."""
    out: list[str] = []
    for entry in (obj.get("metadata") or {}).get("managedFields") or ():
        manager = str(entry.get("manager") or "")
        if manager != FIELD_MANAGER and "f:spec" in (entry.get("fieldsV1") or {}):
            out.append(manager)
    return sorted(set(out))


# --- the sync ---------------------------------------------------------------------------------


@dataclass
class FlavorReport:
    """What one sync pass found and did."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    kept: dict[str, list[str]] = field(default_factory=dict)  # stale, still named by these CQs
    foreign: list[str] = field(default_factory=list)  # wanted name held by someone else's flavor
    drifted: dict[str, str] = field(default_factory=dict)  # flavor -> what was changed, by whom
    errors: list[str] = field(default_factory=list)
    would: list[str] = field(default_factory=list)  # dry run: what it would do

    @property
    def in_sync(self) -> list[str]:
        """Wanted flavors that match (created, updated or already equal)."""
        return self.created + self.updated + self.unchanged


class KueueClient(Protocol):
    """The calls the flavor sync and the quota apply make (:class:`~.kube.Kube` has them)."""

    def list_kueue(self, api: kueue.KueueApi, kind: kueue.Kind) -> list[JSON]:
        """Every object of the kind (all namespaces)."""

    def apply_kueue(
        self, api: kueue.KueueApi, kind: kueue.Kind, obj: JSON, *, field_manager: str
    ) -> JSON:
        """Server-side apply, never forced; 409 when another manager owns a field."""

    def delete_kueue(
        self, api: kueue.KueueApi, kind: kueue.Kind, obj: JSON, *, same_version: bool = True
    ) -> None:
        """Delete exactly this object: its uid, and its resourceVersion unless
        ``same_version=False``, as preconditions."""


class FlavorSync:
    """Keeps nodeagent's ResourceFlavors equal to the desired ones (see the module doc)."""

    def __init__(self, kube: KueueClient, api: kueue.KueueApi, *, dry_run: bool = False) -> None:
        self.kube = kube
        self.api = api
        self.dry_run = dry_run
        # Drift already reported, by flavor: the resourceVersion it was seen at. A drifted
        # flavor is not written again (nor logged again) until someone changes it.
        self._drift_seen: dict[str, str] = {}

    def sync(
        self,
        desired: Sequence[Flavor],
        *,
        flavors: Sequence[JSON] | None = None,
        cluster_queues: Sequence[JSON] | None = None,
    ) -> FlavorReport:
        """One pass. ``flavors`` / ``cluster_queues``: lists already read, else read here.

        Raises:
            KubeError: listing failed (writes that fail are recorded in the report instead).
        """
        report = FlavorReport()
        have = {
            o["metadata"]["name"]: o
            for o in (
                flavors
                if flavors is not None
                else self.kube.list_kueue(self.api, kueue.RESOURCE_FLAVOR)
            )
        }
        cqs = (
            cluster_queues
            if cluster_queues is not None
            else self.kube.list_kueue(self.api, kueue.CLUSTER_QUEUE)
        )
        referenced = kueue.referenced_flavors(cqs)
        wanted = {f.name for f in desired}
        for flavor in desired:
            current = have.get(flavor.name)
            try:
                self._one(flavor, current, report)
            except KubeError as exc:
                report.errors.append(f"flavor {flavor.name}: {exc}")
                log.warning("cannot write ResourceFlavor %s: %s", flavor.name, exc)
        for name, obj in sorted(have.items()):
            if name in wanted or not kueue.managed(obj):
                continue
            if (obj.get("metadata") or {}).get("deletionTimestamp"):
                continue  # already going (Kueue's finalizer holds it while in use)
            users = referenced.get(name)
            if users:
                report.kept[name] = users
                continue
            if self.dry_run:
                report.would.append(f"delete ResourceFlavor {name} (no tier wants it)")
                continue
            try:
                self.kube.delete_kueue(self.api, kueue.RESOURCE_FLAVOR, obj)
                report.deleted.append(name)
                log.info("deleted ResourceFlavor %s: no tier wants it, no queue names it", name)
            except KubeError as exc:
                if exc.status != 404:
                    report.errors.append(f"flavor {name}: {exc}")
        for name in list(self._drift_seen):
            if name not in report.drifted:
                del self._drift_seen[name]
        return report

    def _one(self, flavor: Flavor, current: JSON | None, report: FlavorReport) -> None:
        obj = flavor.to_object(self.api)
        if current is None:
            if self.dry_run:
                report.would.append(f"create ResourceFlavor {flavor.name}")
                return
            self.kube.apply_kueue(self.api, kueue.RESOURCE_FLAVOR, obj, field_manager=FIELD_MANAGER)
            report.created.append(flavor.name)
            log.info("created ResourceFlavor %s (tier %s)", flavor.name, flavor.tier)
            return
        if not kueue.managed(current):
            report.foreign.append(flavor.name)
            return
        diff = differences(flavor, current)
        if not diff:
            report.unchanged.append(flavor.name)
            return
        version = str(current["metadata"].get("resourceVersion", ""))
        if self._drift_seen.get(flavor.name) == version:
            report.drifted[flavor.name] = _note(current, diff)
            return
        if self.dry_run:
            report.would.append(f"update ResourceFlavor {flavor.name} ({', '.join(diff)})")
            return
        try:
            applied = self.kube.apply_kueue(
                self.api, kueue.RESOURCE_FLAVOR, obj, field_manager=FIELD_MANAGER
            )
        except KubeError as exc:
            if exc.status != 409:
                raise
            self._drifted(flavor, current, diff, report, str(exc))
            return
        rest = differences(flavor, applied)
        if rest:  # ours are right now; someone else's additions remain
            self._drifted(flavor, applied, rest, report, "")
            return
        report.updated.append(flavor.name)
        log.info("updated ResourceFlavor %s (%s)", flavor.name, ", ".join(diff))

    def _drifted(
        self, flavor: Flavor, obj: JSON, diff: list[str], report: FlavorReport, conflict: str
    ) -> None:
        note = _note(obj, diff)
        report.drifted[flavor.name] = note
        version = str(obj["metadata"].get("resourceVersion", ""))
        if self._drift_seen.get(flavor.name) != version:
            log.warning(
                "ResourceFlavor %s (tier %s): %s; left as it is%s",
                flavor.name,
                flavor.tier,
                note,
                f" ({conflict})" if conflict else "",
            )
        self._drift_seen[flavor.name] = version


def drift(desired: Sequence[Flavor], flavors: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Flavor -> what differs, for nodeagent's flavors that differ from the desired ones (the
    review's reading; the service's sync reports the same through its metrics)."""
    by_name = {f.name: f for f in desired}
    out: dict[str, str] = {}
    for obj in flavors:
        name = str((obj.get("metadata") or {}).get("name"))
        flavor = by_name.get(name)
        if flavor is None or not kueue.managed(obj):
            continue
        diff = differences(flavor, obj)
        if diff:
            out[name] = _note(obj, diff)
    return out


def _note(obj: Mapping[str, Any], diff: list[str]) -> str:
    who = editors(obj)
    by = f" by {', '.join(who)}" if who else " by hand"
    return f"{', '.join(diff)} changed{by}, not as the tier and quota policies say"
