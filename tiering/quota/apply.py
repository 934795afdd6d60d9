"""Applying the rendered quota objects: server-side apply as ``nodeagent``, nothing forced.

What a platform team already runs keeps working: an object of the same name that nodeagent
did not make (no ``app.kubernetes.io/managed-by: nodeagent`` label) is left as it is and
reported; a field of nodeagent's objects that someone else changed makes the apply of that
object fail with a conflict, which is reported too, and the other objects still go in. With
``prune``, nodeagent's own objects the policy no longer has are deleted (ClusterQueues last
among the objects that name them, so no LocalQueue points at a missing queue for long).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nodeagent_tiering.cluster import JSON, kueue, units
from nodeagent_tiering.cluster.cluster_api import KubeError
from nodeagent_tiering.quota.flavors import FIELD_MANAGER, KueueClient
from nodeagent_tiering.quota.policy import QuotaPolicy, render
from nodeagent_tiering.quota.templates import admission_objects

# The order objects are applied in (flavors before the queues that name them, a policy before
# its binding) and pruned in (the reverse).
ORDER = (
    kueue.RESOURCE_FLAVOR,
    kueue.COHORT,
    kueue.CLUSTER_QUEUE,
    kueue.LOCAL_QUEUE,
    kueue.VALIDATING_POLICY,
    kueue.VALIDATING_BINDING,
)


def policy_objects(
    policy: QuotaPolicy, api: kueue.KueueApi, *, include_flavors: bool = True
) -> list[JSON]:
    """Everything the policy becomes, in the order to apply it: Kueue's objects, then the
    request templates' admission policies and bindings."""
    return [*render(policy, api, include_flavors=include_flavors), *admission_objects(policy)]


def describe(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` or ``Kind name``."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"


@dataclass
class ApplyReport:
    """Per object, what happened."""

    applied: list[str] = field(default_factory=list)  # created or brought up to date
    unchanged: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # exists, not nodeagent's: left alone
    conflicts: list[str] = field(default_factory=list)  # a field someone else owns
    pruned: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # nodeagent's, not in the policy (no prune)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether everything the policy wants is in place."""
        return not (self.skipped or self.conflicts or self.errors)

    def lines(self) -> list[str]:
        """One line per object, for the command's output."""
        out = [f"{what}: applied" for what in self.applied]
        out += [f"{what}: unchanged" for what in self.unchanged]
        out += [
            f"{what}: exists and is not managed by nodeagent; left alone" for what in self.skipped
        ]
        out += self.conflicts
        out += [f"{what}: pruned" for what in self.pruned]
        out += [
            f"{what}: managed by nodeagent, not in the policy (kept; --prune deletes it)"
            for what in self.stale
        ]
        out += self.errors
        return out


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name")))


def _same(desired: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether ``current`` already holds every label and spec field of ``desired``."""
    labels = (current.get("metadata") or {}).get("labels") or {}
    wanted = (desired.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in wanted.items()):
        return False
    return _contains(current.get("spec") or {}, desired.get("spec") or {})


def _contains(have: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        return isinstance(have, Mapping) and all(_contains(have.get(k), v) for k, v in want.items())
    if isinstance(want, list):
        return (
            isinstance(have, list)
            and len(have) == len(want)
            and all(_contains(h, w) for h, w in zip(have, want, strict=True))
        )
    if isinstance(want, int | float) and not isinstance(want, bool):
        try:
            return units.amount(have) == float(want)
        except ValueError:
            return False
    return bool(have == want)


def apply_objects(
    kube: KueueClient, api: kueue.KueueApi, objects: Sequence[JSON], *, prune: bool = False
) -> ApplyReport:
    """Apply ``objects`` (as :func:`~.quota.render` orders them); see the module doc.

    Raises:
        KubeError: listing the existing objects failed (a failed write is in the report).
    """
    report = ApplyReport()
    kinds = [k for k in ORDER if api.serves(k)]
    # Items of a built-in kind's list carry no kind of their own (a custom resource's do).
    existing: dict[str, dict[tuple[str, str], JSON]] = {
        k.kind: {_key(o): {"kind": k.kind, **o} for o in kube.list_kueue(api, k)} for k in kinds
    }
    wanted: dict[str, set[tuple[str, str]]] = {k.kind: set() for k in kinds}
    for obj in objects:
        kind = kueue.KINDS[str(obj["kind"])]
        what = describe(obj)
        wanted.setdefault(kind.kind, set()).add(_key(obj))
        current = existing.get(kind.kind, {}).get(_key(obj))
        if current is not None and not kueue.managed(current):
            report.skipped.append(what)
            continue
        if current is not None and _same(obj, current):
            report.unchanged.append(what)
            continue
        try:
            kube.apply_kueue(api, kind, obj, field_manager=FIELD_MANAGER)
            report.applied.append(what)
        except KubeError as exc:
            if exc.status == 409:
                report.conflicts.append(f"{what}: not applied: {exc} (someone else owns it)")
            else:
                report.errors.append(f"{what}: {exc}")
    for kind in reversed(kinds):
        for key, obj in sorted(existing[kind.kind].items()):
            if key in wanted.get(kind.kind, set()) or not kueue.managed(obj):
                continue
            if kind is kueue.RESOURCE_FLAVOR:
                continue  # the tiering service owns the flavors' lifecycle
            if not prune:
                report.stale.append(describe(obj))
                continue
            try:
                # The uid only: Kueue writes the queues' status and the API server an admission
                # policy's type check moments after they change, so the version read is soon
                # stale; the object is still the one listed, nodeagent's and not in the policy.
                kube.delete_kueue(api, kind, obj, same_version=False)
                report.pruned.append(describe(obj))
            except KubeError as exc:
                if exc.status != 404:
                    report.errors.append(f"{describe(obj)}: {exc}")
    return report
