"""The quota policy (``version: v1``): teams, their guaranteed, borrowable and reclaimable GPU
quota per tier, and the Kueue objects it becomes.

A policy names teams (by their namespaces, or by LocalQueues) and, per tier and per resource
(``nvidia.com/gpu``, each ``nvidia.com/mig-<profile>``), how much the team is guaranteed,
whether that guarantee is ``hard`` (never lent to others: ``lendingLimit: 0``) or ``soft``
(lent while idle), how much more it may ``borrow`` from its tier, and whether what it lent is
``reclaimable`` (Kueue preempts the borrowers when the team needs its quota back:
``preemption.reclaimWithinCohort: Any``). Each tier is one cohort, so borrowing stays inside a
tier. :func:`render` turns the policy into what Kueue runs on:

- one ResourceFlavor per tier (or per GPU product inside a tier) -- :mod:`.flavors`;
- one Cohort per tier;
- one ClusterQueue per team and tier, named ``<team>-<tier>``, selecting the team's namespaces;
- one LocalQueue per team namespace and tier (named after the tier unless the policy says
  otherwise), so a job picks its tier with ``kueue.x-k8s.io/queue-name: training``.

Loading is strict (the project's one YAML reader, :mod:`nodeagent.config.yamlfile`, then
pydantic v2 with unknown fields refused) and every problem is one line naming the file, the
line and the field. Every name that ends up on a Kubernetes object is checked against
Kubernetes' own rules when the file is read (tier and product names become label values, taint
keys label keys, team and queue names object names), and every count must fit the int64 of a
Kubernetes quantity, so :func:`render` never writes an object the API server would refuse.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
)

from nodeagent import labels as lbl
from nodeagent.config.errors import ConfigError
from nodeagent.config.quantity import MAX as MAX_QUANTITY
from nodeagent.config.types import any_label_value, dns_subdomain, label_key, label_value
from nodeagent.config.yamlfile import parse_document, read_document
from nodeagent_tiering.cluster import JSON, kueue
from nodeagent_tiering.cluster.nodes import QUOTA_RESOURCE
from nodeagent_tiering.quota.flavors import Flavor, FlavorSettings, TaintSpec, desired_flavors

GPU = "nvidia.com/gpu"
RESOURCE = QUOTA_RESOURCE  # the GPU resources a quota may name (defined in the floor)
NAMESPACE_SELECTOR_KEY = "kubernetes.io/metadata.name"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Kueue's API limits (ClusterQueue resourceGroups: flavors and covered resources per group).
MAX_FLAVORS = 64
MAX_COVERED = 64


class QuotaPolicyError(ValueError):
    """The policy file is not valid; one problem per line, each ``file:line: field: what``."""


def _whole_or_unlimited(value: Any) -> Any:
    if value == "unlimited":
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUANTITY:
        raise ValueError(
            "must be a whole number of devices (0 to 2^63-1, Kubernetes' largest quantity) "
            "or 'unlimited'"
        )
    return value


class _Model(BaseModel):
    # Scalars are strict (no "4" for 4, no 1 for true); lists are read as tuples (frozen).
    model_config = ConfigDict(extra="forbid", frozen=True)


class Taint(_Model):
    """A taint every node of the tier carries (Kueue only weighs NoSchedule and NoExecute)."""

    key: str = Field(min_length=1)
    value: str = ""
    effect: Literal["NoSchedule", "NoExecute"]


class Templates(_Model):
    """The GPU shapes a pod may ask for (request templates), checked where requests enter: a
    ValidatingAdmissionPolicy the API server runs (:mod:`.templates`)."""

    # hard: a pod or Job of another shape is refused; soft: admitted with a warning (and an
    # audit annotation), so teams see it before it is enforced.
    type: Literal["hard", "soft"] = "soft"
    gpus: tuple[StrictInt, ...] = ()  # whole nvidia.com/gpu per pod; () leaves counts free
    mig: tuple[str, ...] = ()  # MIG profiles (``3g.40gb``) a pod may ask for; () leaves them free


class Reserve(_Model):
    """Whole nodes of a tier kept for large jobs, lent to the tier's other jobs while idle.

    The tiering service picks and marks the nodes (:mod:`.reserve`); the quota is Kueue's: the
    nodes are their own flavor whose whole quota belongs to the ClusterQueue
    ``<tier>-reserved``, which lends it in the tier's cohort and reclaims it by preemption
    (``reclaimWithinCohort: Any``) when a large job arrives.
    """

    nodes: StrictInt = Field(ge=1, le=10_000)  # how many whole nodes to keep
    gpus: StrictInt = Field(8, ge=1, le=1024)  # GPUs of each (the large shape: a whole node)
    teams: tuple[str, ...] = Field(min_length=1)  # who submits large jobs (their namespaces)
    queue: str | None = None  # their LocalQueue; default ``<tier>-large``


class TierSettings(_Model):
    """How a tier becomes ResourceFlavors and a cohort."""

    cohort: str | None = None  # the tier's cohort; default: the tier's name
    products: tuple[str, ...] = ()  # one flavor per GPU product (nvidia.com/gpu.product) instead
    taints: tuple[Taint, ...] = Field(default=(), max_length=8)
    tolerate: StrictBool = True  # admitted pods get tolerations for the taints (Kueue adds them)
    templates: Templates | None = None  # the shapes jobs submitted to the tier may ask for
    reserve: Reserve | None = None  # nodes kept for large jobs, lent while idle


class ResourceQuota(_Model):
    """One team's quota of one resource in one tier (or GPU product)."""

    # Devices always available to the team: nominalQuota, a Kubernetes quantity (int64).
    guaranteed: StrictInt = Field(ge=0, le=MAX_QUANTITY)
    type: Literal["hard", "soft"] = "soft"  # hard: never lent (lendingLimit 0); soft: lendable
    # How many more the team may borrow from the tier's idle quota (borrowingLimit); 0 by
    # default, so a team gets what it is guaranteed unless the policy says it may burst.
    borrow: Annotated[int | None, BeforeValidator(_whole_or_unlimited)] = 0
    lend: StrictInt | None = Field(
        default=None, ge=0, le=MAX_QUANTITY
    )  # soft only: at most this much lent at once

    @property
    def unlimited_borrow(self) -> bool:
        """``borrow: unlimited``."""
        return self.borrow is None


class TeamTier(_Model):
    """A team's quota in one tier."""

    reclaimable: StrictBool = (
        False  # preempt borrowers to take lent quota back (reclaimWithinCohort)
    )
    queue: str | None = None  # LocalQueue name in each team namespace; default: the tier's name
    resources: dict[str, ResourceQuota] = Field(default_factory=dict)
    products: dict[str, dict[str, ResourceQuota]] = Field(default_factory=dict)
    templates: Templates | None = None  # this team's shapes in the tier, instead of the tier's


class LocalQueueRef(_Model):
    """A LocalQueue a team submits to (for teams that already have their queue names)."""

    namespace: str
    name: str
    tier: str


class Team(_Model):
    """A team: the namespaces (or LocalQueues) it submits from, and its quota per tier."""

    name: str
    namespaces: tuple[str, ...] = ()
    local_queues: tuple[LocalQueueRef, ...] = ()
    tiers: dict[str, TeamTier]


class QuotaPolicy(_Model):
    """The whole policy file."""

    version: Literal["v1"]
    flavor_prefix: str = ""  # prepended to every flavor name (when a tier name is taken)
    tiers: dict[str, TierSettings] = Field(default_factory=dict)
    teams: tuple[Team, ...]

    def settings(self, tier: str) -> TierSettings:
        """The tier's settings (defaults when the policy lists none)."""
        return self.tiers.get(tier) or TierSettings()

    def flavor_settings(self) -> dict[str, FlavorSettings]:
        """Per tier, what :mod:`.flavors` needs to build its flavors."""
        return {
            name: FlavorSettings(
                products=s.products,
                taints=tuple(TaintSpec(t.key, t.value, t.effect) for t in s.taints),
                tolerate=s.tolerate,
                reserve=s.reserve is not None,
            )
            for name, s in self.tiers.items()
        }

    def tier_names(self) -> list[str]:
        """Every tier the policy names, in first-mention order."""
        names: dict[str, None] = dict.fromkeys(self.tiers)
        for team in self.teams:
            names.update(dict.fromkeys(team.tiers))
            names.update(dict.fromkeys(q.tier for q in team.local_queues))
        return list(names)


# --- loading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Where:
    name: str
    lines: Mapping[tuple[str, ...], int]

    def at(self, path: Sequence[str | int]) -> str:
        keys = tuple(str(p) for p in path)
        probe = keys
        while probe and probe not in self.lines:
            probe = probe[:-1]
        line = self.lines.get(probe)
        where = f"{self.name}:{line}" if line is not None else self.name
        return f"{where}: {'.'.join(keys) or '(top level)'}"


def _known_fields(path: Sequence[str | int]) -> list[str]:
    """The fields of the model at ``path`` (for 'unknown field' errors)."""
    model: Any = QuotaPolicy
    for part in path:
        if model is None:
            return []
        fields = model.model_fields
        if isinstance(part, str) and part in fields:
            model = _inner_model(fields[part].annotation)
        # an index or a key of a dict[str, Model] keeps the element model already unwrapped
    return list(model.model_fields) if model is not None else []


def _inner_model(annotation: Any) -> Any:
    """The model a field holds, through tuple[...] / dict[str, ...] / dict[str, dict[...]]."""
    while True:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return annotation
        args = getattr(annotation, "__args__", ())
        if not args:
            return None
        annotation = args[-1] if args[-1] is not Ellipsis else args[0]


def _messages(exc: ValidationError, where: _Where, data: Any) -> list[str]:
    out: list[str] = []
    for error in exc.errors():
        loc = list(error["loc"])
        # Union members show up as extra loc parts; cut the path where the data ends.
        probe: Any = data
        kept: list[str | int] = []
        for part in loc:
            in_map = isinstance(probe, Mapping) and part in probe
            if in_map or (isinstance(probe, list) and isinstance(part, int) and part < len(probe)):
                probe = probe[part]
            elif error["type"] in ("missing", "extra_forbidden") and part == loc[-1]:
                probe = None
            else:
                break
            kept.append(part)
        if error["type"] == "extra_forbidden":
            known = ", ".join(_known_fields(kept[:-1]))
            text = f"unknown field (known: {known})"
        elif error["type"] == "missing":
            text = "required field missing"
        else:
            text = str(error["msg"]).removeprefix("Value error, ")
        out.append(f"{where.at(kept)}: {text}")
    return list(dict.fromkeys(out))


def load_quota_policy(path: Path, *, tiers: Iterable[str] | None = None) -> QuotaPolicy:
    """Load and validate a quota policy file.

    ``tiers``: the tier policy's tier names, when known; a quota in any other tier is an error.

    Raises:
        QuotaPolicyError: unreadable, not YAML, or not a valid policy (every problem, one line
            each, naming the file, the line and the field).
    """
    try:
        doc = read_document(path)
    except ConfigError as exc:
        raise QuotaPolicyError(str(exc)) from None
    return _validate(doc.name, doc.data, doc.lines, tiers)


def parse_quota_policy(
    text: str | bytes, *, source: str = "<quota policy>", tiers: Iterable[str] | None = None
) -> QuotaPolicy:
    """Validate a policy given as YAML text (see :func:`load_quota_policy`)."""
    try:
        doc = parse_document(text, source)
    except ConfigError as exc:
        raise QuotaPolicyError(str(exc)) from None
    return _validate(source, doc.data, doc.lines, tiers)


def _validate(
    source: str,
    data: Any,
    lines: Mapping[tuple[str | int, ...], int],
    tiers: Iterable[str] | None,
) -> QuotaPolicy:
    where = _Where(source, {tuple(str(p) for p in path): line for path, line in lines.items()})
    if not isinstance(data, Mapping):
        raise QuotaPolicyError(f"{source}: expected a mapping with version: v1 and teams")
    if data.get("version") != "v1":
        raise QuotaPolicyError(
            f"{where.at(['version'])}: unsupported version {data.get('version')!r} (known: v1)"
        )
    try:
        policy = QuotaPolicy.model_validate(data)
    except ValidationError as exc:
        raise QuotaPolicyError("\n".join(_messages(exc, where, data))) from None
    problems = [f"{where.at(path)}: {text}" for path, text in check_policy(policy, tiers)]
    if problems:
        raise QuotaPolicyError("\n".join(problems))
    return policy


def check_policy(
    policy: QuotaPolicy, tiers: Iterable[str] | None = None
) -> list[tuple[list[str | int], str]]:
    """What the schema cannot say: names Kubernetes accepts, one owner per namespace and
    queue, products the tier declares, Kueue's limits. ``(path, problem)`` pairs."""
    problems: list[tuple[list[str | int], str]] = []
    if not policy.teams:
        problems.append((["teams"], "list at least one team"))
    known = set(tiers) if tiers is not None else None
    for name, settings in policy.tiers.items():
        problems.extend(_tier_name_problems(["tiers", name], name))
        if known is not None and name not in known:
            problems.append((["tiers", name], _unknown_tier(name, known)))
        if len(set(settings.products)) != len(settings.products):
            problems.append((["tiers", name, "products"], "a product is listed twice"))
        problems.extend(_settings_problems(["tiers", name], settings))
    try:
        _flavors(policy)  # flavor names: valid and distinct
    except ValueError as exc:
        problems.append((["tiers"], str(exc)))
    owners: dict[str, str] = {}
    queues: dict[tuple[str, str], str] = {}
    cq_names: dict[str, str] = {}
    team_names: set[str] = set()
    for t_index, team in enumerate(policy.teams):
        base: list[str | int] = ["teams", t_index]
        if not DNS_LABEL.match(team.name) or len(team.name) > 63:
            problems.append(([*base, "name"], f"{team.name!r} is not a DNS label"))
        if team.name in team_names:
            problems.append(([*base, "name"], f"team {team.name} is listed twice"))
        team_names.add(team.name)
        if not team.namespaces and not team.local_queues:
            problems.append((base, f"team {team.name}: list its namespaces or local_queues"))
        for n_index, ns in enumerate(team.namespaces):
            if not DNS_LABEL.match(ns) or len(ns) > 63:
                problems.append(([*base, "namespaces", n_index], f"{ns!r} is not a namespace"))
            elif owners.setdefault(ns, team.name) != team.name:
                problems.append(
                    ([*base, "namespaces", n_index], f"namespace {ns} is team {owners[ns]}'s")
                )
        for q_index, ref in enumerate(team.local_queues):
            where: list[str | int] = [*base, "local_queues", q_index]
            problems.extend(_tier_name_problems([*where, "tier"], ref.tier))
            if not DNS_LABEL.fullmatch(ref.namespace) or len(ref.namespace) > 63:
                problems.append(([*where, "namespace"], f"{ref.namespace!r} is not a namespace"))
            if not DNS_LABEL.fullmatch(ref.name) or len(ref.name) > 63:
                problems.append(([*where, "name"], f"{ref.name!r} is not a DNS label"))
            if ref.tier not in team.tiers:
                problems.append(
                    ([*where, "tier"], f"team {team.name} has no quota in tier {ref.tier}")
                )
            if owners.setdefault(ref.namespace, team.name) != team.name:
                problems.append(
                    (
                        [*where, "namespace"],
                        f"namespace {ref.namespace} is team {owners[ref.namespace]}'s",
                    )
                )
        for tier, tt in team.tiers.items():
            here: list[str | int] = [*base, "tiers", tier]
            problems.extend(_tier_name_problems(here, tier))
            for product in tt.products:
                problems.extend(_checked([*here, "products", product], label_value, product))
            if known is not None and tier not in known:
                problems.append((here, _unknown_tier(tier, known)))
            problems.extend(_check_team_tier(policy, team, tier, tt, here))
            cq = cluster_queue_name(team.name, tier)
            owner = f"team {team.name} in tier {tier}"
            if cq_names.setdefault(cq, owner) != owner:
                problems.append((here, f"ClusterQueue name {cq} is also {cq_names[cq]}'s"))
            for ns, queue in _local_queues(team, tier, tt):
                key = (ns, queue)
                if queues.setdefault(key, owner) != owner:
                    problems.append((here, f"LocalQueue {ns}/{queue} is also {queues[key]}'s"))
                if not DNS_LABEL.match(queue):
                    problems.append((here, f"LocalQueue name {queue!r} is not a DNS label"))
    problems.extend(_reserve_problems(policy))
    for tier, settings in policy.tiers.items():
        if settings.reserve is None:
            continue
        cq, owner = reserved_queue_name(tier), f"the reserve of tier {tier}"
        if cq_names.setdefault(cq, owner) != owner:
            problems.append((["tiers", tier, "reserve"], f"ClusterQueue {cq} is {cq_names[cq]}'s"))
        for ns in reserve_namespaces(policy, tier):
            key = (ns, reserved_local_queue(policy, tier))
            if queues.setdefault(key, owner) != owner:
                problems.append(
                    (
                        ["tiers", tier, "reserve", "queue"],
                        f"LocalQueue {key[0]}/{key[1]} is also {queues[key]}'s",
                    )
                )
    return problems


def _checked(
    path: list[str | int], check: Callable[[str], str], value: str
) -> list[tuple[list[str | int], str]]:
    """``[(path, why)]`` when ``check`` (a Kubernetes name rule) refuses ``value``."""
    try:
        check(value)
    except ValueError as exc:
        return [(path, str(exc))]
    return []


def _tier_name_problems(path: list[str | int], name: str) -> list[tuple[list[str | int], str]]:
    # A tier becomes the value of the tier label on nodes and flavors.
    return [(p, f"tier name: {why}") for p, why in _checked(path, label_value, name)]


def _settings_problems(
    path: list[str | int], settings: TierSettings
) -> list[tuple[list[str | int], str]]:
    problems: list[tuple[list[str | int], str]] = []
    if settings.cohort is not None:
        problems.extend(
            _checked(
                [*path, "cohort"],
                lambda c: dns_subdomain(c, 253, "cohort name (a DNS subdomain)"),
                settings.cohort,
            )
        )
    for p_index, product in enumerate(settings.products):
        # Each product is the value of nvidia.com/gpu.product in a flavor's node labels.
        problems.extend(_checked([*path, "products", p_index], label_value, product))
    for t_index, taint in enumerate(settings.taints):
        problems.extend(_checked([*path, "taints", t_index, "key"], label_key, taint.key))
        problems.extend(_checked([*path, "taints", t_index, "value"], any_label_value, taint.value))
    if settings.templates is not None:
        problems.extend(_check_templates(settings.templates, [*path, "templates"]))
    if settings.reserve is not None and settings.products:
        problems.append(
            ([*path, "reserve"], "a tier with a flavor per product cannot reserve nodes yet")
        )
    return problems


def _reserve_problems(policy: QuotaPolicy) -> list[tuple[list[str | int], str]]:
    problems: list[tuple[list[str | int], str]] = []
    teams = {t.name: t for t in policy.teams}
    for tier, settings in policy.tiers.items():
        reserve = settings.reserve
        if reserve is None:
            continue
        path: list[str | int] = ["tiers", tier, "reserve"]
        for i, name in enumerate(reserve.teams):
            if name not in teams:
                problems.append(([*path, "teams", i], f"no team {name} in teams"))
            elif not team_namespaces(teams[name]):
                problems.append(([*path, "teams", i], f"team {name} lists no namespaces"))
        queue = reserved_local_queue(policy, tier)
        if not DNS_LABEL.match(queue) or len(queue) > 63:
            problems.append(([*path, "queue"], f"LocalQueue name {queue!r} is not a DNS label"))
        if not any(tier in t.tiers for t in policy.teams):
            problems.append((path, f"no team has quota in tier {tier} to borrow the reserve"))
    return problems


MIG_PROFILE = re.compile(r"^[1-9]\d*g\.[1-9]\d*gb(\+[a-z]+)?$")  # 3g.40gb, 1g.10gb+me


def _check_templates(t: Templates, path: list[str | int]) -> list[tuple[list[str | int], str]]:
    problems: list[tuple[list[str | int], str]] = []
    if not t.gpus and not t.mig:
        problems.append((path, "a template names gpus (counts), mig (profiles) or both"))
    for i, n in enumerate(t.gpus):
        if not 0 < n <= MAX_QUANTITY:
            problems.append(([*path, "gpus", i], f"{n} is not a GPU count (1 or more)"))
    if len(set(t.gpus)) != len(t.gpus):
        problems.append(([*path, "gpus"], "a count is listed twice"))
    for i, profile in enumerate(t.mig):
        if not MIG_PROFILE.match(profile):
            problems.append(
                ([*path, "mig", i], f"{profile!r} is not a MIG profile name such as 3g.40gb")
            )
    return problems


def _unknown_tier(name: str, known: set[str]) -> str:
    return f"tier {name} is not in the tier policy (tiers: {', '.join(sorted(known))})"


def _check_team_tier(
    policy: QuotaPolicy, team: Team, tier: str, tt: TeamTier, here: list[str | int]
) -> list[tuple[list[str | int], str]]:
    problems: list[tuple[list[str | int], str]] = []
    products = policy.settings(tier).products
    if products and tt.resources:
        problems.append(
            (
                [*here, "resources"],
                f"tier {tier} has a flavor per product: give quota per "
                f"product under products ({', '.join(products)})",
            )
        )
    if not products and tt.products:
        problems.append(
            ([*here, "products"], f"tier {tier} lists no products (tiers.{tier}.products)")
        )
    for product in tt.products:
        if products and product not in products:
            problems.append(
                (
                    [*here, "products", product],
                    f"product {product} is not in tiers.{tier}.products ({', '.join(products)})",
                )
            )
    quotas = [([*here, "resources"], tt.resources)] + [
        ([*here, "products", p], q) for p, q in tt.products.items()
    ]
    if not any(q for _, q in quotas):
        problems.append((here, f"team {team.name} has no quota in tier {tier}"))
    covered: set[str] = set()
    for path, entries in quotas:
        for resource, quota in entries.items():
            covered.add(resource)
            at = [*path, resource]
            if not RESOURCE.match(resource):
                problems.append(
                    (at, "not a GPU resource (nvidia.com/gpu or nvidia.com/mig-<profile>)")
                )
            if quota.lend is not None and quota.type == "hard":
                problems.append(([*at, "lend"], "a hard quota is never lent; drop lend"))
            if quota.lend is not None and quota.lend > quota.guaranteed:
                problems.append(([*at, "lend"], "cannot lend more than is guaranteed"))
    if tt.templates is not None:
        problems.extend(_check_templates(tt.templates, [*here, "templates"]))
    if len(covered) > MAX_COVERED:
        problems.append((here, f"more than {MAX_COVERED} resources (Kueue's limit)"))
    if len(tt.products) > MAX_FLAVORS:
        problems.append((here, f"more than {MAX_FLAVORS} products (Kueue's limit)"))
    return problems


# --- names --------------------------------------------------------------------------------------


def dns_name(text: str) -> str:
    """A label value (tier, product) as part of a Kubernetes object name."""
    return re.sub(r"[^a-z0-9.-]+", "-", text.lower()).strip("-.")


def cluster_queue_name(team: str, tier: str) -> str:
    """``<team>-<tier>``."""
    return f"{team}-{dns_name(tier)}"


def reserved_queue_name(tier: str) -> str:
    """``<tier>-reserved``: the ClusterQueue that owns a tier's reserved nodes' quota."""
    return f"{dns_name(tier)}-reserved"


def reserved_local_queue(policy: QuotaPolicy, tier: str) -> str:
    """The LocalQueue large jobs are submitted to (``<tier>-large`` unless the policy says)."""
    reserve = policy.settings(tier).reserve
    return (reserve.queue if reserve and reserve.queue else None) or f"{dns_name(tier)}-large"


def reserve_namespaces(policy: QuotaPolicy, tier: str) -> list[str]:
    """The namespaces of the teams that submit large jobs to the tier's reserve."""
    reserve = policy.settings(tier).reserve
    if reserve is None:
        return []
    wanted = set(reserve.teams)
    return sorted({ns for t in policy.teams if t.name in wanted for ns in team_namespaces(t)})


def cohort_name(policy: QuotaPolicy, tier: str) -> str:
    """The tier's cohort."""
    return dns_name(policy.settings(tier).cohort or tier)


def _local_queues(team: Team, tier: str, tt: TeamTier) -> list[tuple[str, str]]:
    queue = tt.queue or dns_name(tier)
    found = [(ns, queue) for ns in team.namespaces]
    found += [(q.namespace, q.name) for q in team.local_queues if q.tier == tier]
    return found


def team_namespaces(team: Team) -> list[str]:
    """Every namespace the team submits from (its own, and those of its LocalQueues)."""
    return sorted({*team.namespaces, *(q.namespace for q in team.local_queues)})


def _flavors(policy: QuotaPolicy) -> list[Flavor]:
    return desired_flavors(
        policy.tier_names(), policy.flavor_settings(), prefix=policy.flavor_prefix
    )


# --- rendering ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueKey:
    """The team and tier a ClusterQueue serves."""

    team: str
    tier: str


def _meta(name: str, team: str | None, tier: str, namespace: str | None = None) -> JSON:
    labels = {lbl.MANAGED_BY: lbl.MANAGED_BY_VALUE, lbl.TIER: tier}
    if team is not None:
        labels[lbl.TEAM] = team
    meta: JSON = {"name": name, "labels": labels}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def _resource_entry(name: str, quota: ResourceQuota | None) -> JSON:
    if quota is None:  # covered for another product of the tier, none for this one
        return {"name": name, "nominalQuota": 0, "borrowingLimit": 0}
    entry: JSON = {"name": name, "nominalQuota": quota.guaranteed}
    if quota.borrow is not None:
        entry["borrowingLimit"] = quota.borrow
    if quota.type == "hard":
        entry["lendingLimit"] = 0
    elif quota.lend is not None:
        entry["lendingLimit"] = quota.lend
    return entry


def _resource_order(names: Iterable[str]) -> list[str]:
    """Whole GPUs first, then MIG profiles by size (1g before 2g), then the rest by name."""

    def key(name: str) -> tuple[int, int, str]:
        match = re.match(r"^nvidia\.com/mig-(?:\d+c\.)?(\d+)g", name)
        if name == GPU:
            return (0, 0, name)
        if match:
            return (1, int(match.group(1)), name)
        return (2, 0, name)

    return sorted(set(names), key=key)


def cluster_queue(
    policy: QuotaPolicy, team: Team, tier: str, api: kueue.KueueApi, flavors: Sequence[Flavor]
) -> JSON:
    """The ClusterQueue of ``team`` in ``tier``."""
    tt = team.tiers[tier]
    tier_flavors = [f for f in flavors if f.tier == tier and not f.reserved]
    if tt.products:
        per_flavor = [(f, tt.products[f.product]) for f in tier_flavors if f.product in tt.products]
    else:
        per_flavor = [(f, tt.resources) for f in tier_flavors if f.product is None]
    covered = _resource_order(r for _, quotas in per_flavor for r in quotas)
    flavor_entries = [
        {"name": f.name, "resources": [_resource_entry(r, quotas.get(r)) for r in covered]}
        for f, quotas in per_flavor
    ]
    reserved = next((f for f in flavors if f.tier == tier and f.reserved), None)
    if reserved is not None and GPU in covered:
        # Last, so Kueue tries the team's own flavor first: the reserved nodes' quota is
        # borrowed (nothing nominal here, no limit) only when the tier has no room left, and
        # Kueue reclaims it for the large jobs by preemption.
        flavor_entries.append(
            {
                "name": reserved.name,
                "resources": [
                    {"name": r, "nominalQuota": 0}
                    if r == GPU
                    else {"name": r, "nominalQuota": 0, "borrowingLimit": 0}
                    for r in covered
                ],
            }
        )
    spec: JSON = {
        api.cohort_field: cohort_name(policy, tier),
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": NAMESPACE_SELECTOR_KEY,
                    "operator": "In",
                    "values": team_namespaces(team),
                }
            ]
        },
        "preemption": {"reclaimWithinCohort": "Any" if tt.reclaimable else "Never"},
        "resourceGroups": [{"coveredResources": covered, "flavors": flavor_entries}],
    }
    return {
        "apiVersion": api.api_version,
        "kind": kueue.CLUSTER_QUEUE.kind,
        "metadata": _meta(cluster_queue_name(team.name, tier), team.name, tier),
        "spec": spec,
    }


def reserved_cluster_queue(
    policy: QuotaPolicy, tier: str, api: kueue.KueueApi, flavor: Flavor
) -> JSON:
    """The ClusterQueue that owns the reserved nodes' quota: only the reserve's teams submit
    to it; it lends all of it in the cohort while idle and reclaims it by preemption."""
    reserve = policy.settings(tier).reserve
    assert reserve is not None
    return {
        "apiVersion": api.api_version,
        "kind": kueue.CLUSTER_QUEUE.kind,
        "metadata": _meta(reserved_queue_name(tier), None, tier),
        "spec": {
            api.cohort_field: cohort_name(policy, tier),
            "namespaceSelector": {
                "matchExpressions": [
                    {
                        "key": NAMESPACE_SELECTOR_KEY,
                        "operator": "In",
                        "values": reserve_namespaces(policy, tier),
                    }
                ]
            },
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"},
            "resourceGroups": [
                {
                    "coveredResources": [GPU],
                    "flavors": [
                        {
                            "name": flavor.name,
                            "resources": [
                                {
                                    "name": GPU,
                                    "nominalQuota": reserve.nodes * reserve.gpus,
                                    "borrowingLimit": 0,
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    }


def render(policy: QuotaPolicy, api: kueue.KueueApi, *, include_flavors: bool = True) -> list[JSON]:
    """Every object of the policy, in the order to apply them: flavors, cohorts, cluster
    queues, local queues."""
    flavors = _flavors(policy)
    out: list[JSON] = []
    if include_flavors:
        out.extend(f.to_object(api) for f in flavors)
    used_tiers = [t for t in policy.tier_names() if any(t in team.tiers for team in policy.teams)]
    if api.serves(kueue.COHORT):
        cohorts: dict[str, str] = {}
        for tier in used_tiers:
            cohorts.setdefault(cohort_name(policy, tier), tier)
        for name, tier in cohorts.items():
            out.append(
                {
                    "apiVersion": api.api_version,
                    "kind": kueue.COHORT.kind,
                    "metadata": _meta(name, None, tier),
                    "spec": {},
                }
            )
    for team in policy.teams:
        for tier in team.tiers:
            out.append(cluster_queue(policy, team, tier, api, flavors))
    reserved = [f for f in flavors if f.reserved]
    for flavor in reserved:
        out.append(reserved_cluster_queue(policy, flavor.tier, api, flavor))
    for team in policy.teams:
        for tier, tt in team.tiers.items():
            for ns, queue in _local_queues(team, tier, tt):
                out.append(
                    {
                        "apiVersion": api.api_version,
                        "kind": kueue.LOCAL_QUEUE.kind,
                        "metadata": _meta(queue, team.name, tier, ns),
                        "spec": {"clusterQueue": cluster_queue_name(team.name, tier)},
                    }
                )
    for flavor in reserved:
        for ns in reserve_namespaces(policy, flavor.tier):
            out.append(
                {
                    "apiVersion": api.api_version,
                    "kind": kueue.LOCAL_QUEUE.kind,
                    "metadata": _meta(
                        reserved_local_queue(policy, flavor.tier), None, flavor.tier, ns
                    ),
                    "spec": {"clusterQueue": reserved_queue_name(flavor.tier)},
                }
            )
    return out


def render_yaml(objects: Iterable[Mapping[str, Any]]) -> str:
    """Multi-document YAML, each document starting with ``---``."""
    return "".join(
        "---\n" + yaml.safe_dump(dict(o), sort_keys=False, default_flow_style=False)
        for o in objects
    )


def guarantees(policy: QuotaPolicy) -> dict[tuple[str, str, str, str], int]:
    """``(team, tier, flavor, resource) -> guaranteed`` for every quota of the policy."""
    flavors = _flavors(policy)
    out: dict[tuple[str, str, str, str], int] = {}
    for team in policy.teams:
        for tier, tt in team.tiers.items():
            for f in flavors:
                if f.tier != tier:
                    continue
                quotas = tt.products.get(f.product, {}) if f.product else tt.resources
                for resource, quota in quotas.items():
                    out[(team.name, tier, f.name, resource)] = quota.guaranteed
    return out


def team_of_namespace(policy: QuotaPolicy) -> dict[str, str]:
    """Namespace -> team."""
    return {ns: team.name for team in policy.teams for ns in team_namespaces(team)}


def policy_queues(policy: QuotaPolicy) -> dict[str, QueueKey]:
    """ClusterQueue name -> the team and tier it serves."""
    return {
        cluster_queue_name(team.name, tier): QueueKey(team.name, tier)
        for team in policy.teams
        for tier in team.tiers
    }


def local_queues(policy: QuotaPolicy) -> list[tuple[QueueKey, str, str]]:
    """Every LocalQueue of the policy: ``(team and tier, namespace, name)``."""
    return [
        (QueueKey(team.name, tier), ns, queue)
        for team in policy.teams
        for tier, tt in team.tiers.items()
        for ns, queue in _local_queues(team, tier, tt)
    ]


def flavors_of(policy: QuotaPolicy) -> list[Flavor]:
    """The flavors the policy's tiers become."""
    return _flavors(policy)
