"""The service's rolling history of pending GPU workloads (the review's section on it is
:mod:`nodeagent_tiering.review.fragmentation`).

The leader folds every diagnosis pass into daily aggregates (UTC days) and keeps the last
:data:`KEEP_DAYS` of them in a ConfigMap it owns (:data:`CONFIG_MAP` in its namespace, labelled
``app.kubernetes.io/managed-by: nodeagent``), written at most every :data:`SAVE_INTERVAL_S`. A
pass counts for the time since the previous one (at most :data:`MAX_STEP_S`, so a stopped
service does not invent history). Per day:

- ``pending``: pod-seconds pending, by reason, and ``peak``: most pods at once, by reason;
- ``blocked``: units requested by pods blocked by contiguity, times seconds, by namespace and by
  request size (who waits on fragmentation);
- ``stranded_gpus`` / ``stranded_slices``: free GPUs and MIG slices that no blocked request
  could use, times seconds, split over the pods running on the node by their share of its
  GPUs (whose placements leave the capacity stranded), by namespace and by request size;
- ``queues``: the same by the ClusterQueue of the pods (:func:`pod_queues`): ``stranded``, the
  stranded unit-seconds beside a queue's pods, and ``blocking``, the unit-seconds of
  contiguity-blocked requests whose smallest fix moves its pods (split over the pods named);
  ``queue_sizes``: per queue, the request sizes of its pods in those (what the queue would
  change). The queues that make fragmentation day after day come from these;
- ``free_blocks``: free GPU-seconds per tier by the size of the node's free block, and
  ``mig_free`` / ``mig_fit``: free slice-seconds per tier, and how many of them new instances of
  each profile could have taken. The request-size templates come from these.

``nodeagent tiering report`` reads the ConfigMap; nothing else is stored.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.view import NO_QUEUE, ClusterView, pod_queues
from nodeagent_tiering.pending.fits import primary_request
from nodeagent_tiering.pending.results import CONTIGUITY, PassResult

log = logging.getLogger(__name__)

CONFIG_MAP = "nodeagent-tiering-history"
DATA_KEY = "history.json"
VERSION = 1
KEEP_DAYS = 35  # a monthly review, with room for a late one
MAX_STEP_S = 120.0  # one pass counts for at most this long
SAVE_INTERVAL_S = 300.0  # at most one write every 5 minutes (a crash loses at most that)
TOP = 25  # entries kept per namespace / size table per day (the ConfigMap stays small)
TOP_SIZES = 5  # request sizes kept per queue per day
WHOLE_SIZES = (8, 4, 2, 1)  # whole-GPU templates considered, largest first
MANAGED_BY = {"app.kubernetes.io/managed-by": "nodeagent", "app.kubernetes.io/component": "tiering"}


def _add(table: dict[str, float], key: str, value: float) -> None:
    if value:
        table[key] = table.get(key, 0.0) + value


def _top(table: Mapping[str, float], n: int = TOP) -> dict[str, float]:
    ranked = sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return {k: round(v, 1) for k, v in ranked}


@dataclass
class Day:
    """One UTC day of aggregates (seconds everywhere)."""

    observed_s: float = 0.0
    pending: dict[str, float] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    blocked: dict[str, dict[str, float]] = field(default_factory=lambda: {"ns": {}, "size": {}})
    stranded_gpus: dict[str, dict[str, float]] = field(
        default_factory=lambda: {"ns": {}, "size": {}}
    )
    stranded_slices: dict[str, dict[str, float]] = field(
        default_factory=lambda: {"ns": {}, "size": {}}
    )
    queues: dict[str, dict[str, float]] = field(
        default_factory=lambda: {"stranded": {}, "blocking": {}}
    )
    queue_sizes: dict[str, dict[str, float]] = field(default_factory=dict)
    free_blocks: dict[str, dict[str, float]] = field(default_factory=dict)
    mig_free: dict[str, float] = field(default_factory=dict)
    mig_fit: dict[str, dict[str, float]] = field(default_factory=dict)

    def compact(self) -> dict[str, Any]:
        """Plain data, rounded and trimmed to the top entries."""
        data = asdict(self)
        data["observed_s"] = round(self.observed_s, 1)
        data["pending"] = _top(self.pending)
        for key in ("blocked", "stranded_gpus", "stranded_slices", "queues"):
            data[key] = {k: _top(v) for k, v in getattr(self, key).items()}
        kept = {q for part in data["queues"].values() for q in part}
        data["queue_sizes"] = {
            q: _top(v, TOP_SIZES) for q, v in self.queue_sizes.items() if q in kept
        }
        data["free_blocks"] = {t: _top(v) for t, v in self.free_blocks.items()}
        data["mig_free"] = _top(self.mig_free)
        data["mig_fit"] = {t: _top(v) for t, v in self.mig_fit.items()}
        return data

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> Day:
        """Read one day back (unknown keys are ignored: a newer writer may add some)."""
        day = cls()
        day.observed_s = float(data.get("observed_s", 0.0))
        day.pending = {str(k): float(v) for k, v in (data.get("pending") or {}).items()}
        day.peak = {str(k): int(v) for k, v in (data.get("peak") or {}).items()}
        for key in ("blocked", "stranded_gpus", "stranded_slices"):
            raw = data.get(key) or {}
            setattr(
                day,
                key,
                {
                    part: {str(k): float(v) for k, v in (raw.get(part) or {}).items()}
                    for part in ("ns", "size")
                },
            )
        # Written since queues were traced; an older day has none.
        raw_queues = data.get("queues") or {}
        day.queues = {
            part: {str(k): float(v) for k, v in (raw_queues.get(part) or {}).items()}
            for part in ("stranded", "blocking")
        }
        day.queue_sizes = {
            str(q): {str(k): float(v) for k, v in sizes.items()}
            for q, sizes in (data.get("queue_sizes") or {}).items()
        }
        day.free_blocks = {
            str(t): {str(k): float(v) for k, v in b.items()}
            for t, b in (data.get("free_blocks") or {}).items()
        }
        day.mig_free = {str(k): float(v) for k, v in (data.get("mig_free") or {}).items()}
        day.mig_fit = {
            str(t): {str(k): float(v) for k, v in b.items()}
            for t, b in (data.get("mig_fit") or {}).items()
        }
        return day


def day_of(now_s: float) -> str:
    """The UTC date of a time, as the history's key."""
    return datetime.fromtimestamp(now_s, UTC).strftime("%Y-%m-%d")


class History:
    """Daily aggregates, folded in pass by pass."""

    def __init__(self, days: Mapping[str, Day] | None = None) -> None:
        self.days: dict[str, Day] = dict(days or {})
        self._last_s: float | None = None

    def observe(self, view: ClusterView, result: PassResult, now_s: float) -> None:
        """Fold one pass in; it counts for the time since the previous pass (capped)."""
        step = 0.0 if self._last_s is None else min(max(0.0, now_s - self._last_s), MAX_STEP_S)
        self._last_s = now_s
        day = self.days.setdefault(day_of(now_s), Day())
        counts: dict[str, int] = {}
        for d in result.diagnoses:
            counts[d.reason.value] = counts.get(d.reason.value, 0) + 1
        for reason, n in counts.items():
            day.peak[reason] = max(day.peak.get(reason, 0), n)
        if step <= 0:
            return
        day.observed_s += step
        for reason, n in counts.items():
            _add(day.pending, reason, n * step)
        queues: dict[str, str] | None = None
        for d in result.diagnoses:
            if d.reason in CONTIGUITY:
                resource, units = primary_request(d.request)
                _add(day.blocked["ns"], d.namespace, units * step)
                _add(day.blocked["size"], f"{units} {resource}", units * step)
                if d.unblock is not None and d.unblock.kind == "move-pods" and d.unblock.pods:
                    queues = pod_queues(view) if queues is None else queues
                    self._blocking(view, queues, d.unblock.pods, units * step, day)
        stats = result.stats
        if stats.stranded_by_node:
            queues = pod_queues(view) if queues is None else queues
            self._attribute(view, queues, stats.stranded_by_node, step, day)
        for tier, blocks in stats.free_blocks.items():
            table = day.free_blocks.setdefault(tier, {})
            for size, gpus in blocks.items():
                _add(table, str(size), gpus * step)
        for tier, n in stats.mig_free_slices.items():
            _add(day.mig_free, tier, n * step)
        for (tier, profile), n in stats.mig_fit_slices.items():
            _add(day.mig_fit.setdefault(tier, {}), profile, n * step)
        self.trim(now_s)

    @staticmethod
    def _blocking(
        view: ClusterView, queues: Mapping[str, str], pods: tuple[str, ...], amount: float, day: Day
    ) -> None:
        """Split one blocked request's unit-seconds over the queues of the pods in its way."""
        requests = {p.key: p.requests for p in view.pods if p.key in pods}
        for key in pods:
            queue = queues.get(key, NO_QUEUE)
            _add(day.queues["blocking"], queue, amount / len(pods))
            if requests.get(key):
                resource, units = primary_request(requests[key])
                sizes = day.queue_sizes.setdefault(queue, {})
                _add(sizes, f"{units} {resource}", amount / len(pods))

    @staticmethod
    def _attribute(
        view: ClusterView,
        queues: Mapping[str, str],
        stranded: Mapping[str, tuple[int, int]],
        step: float,
        day: Day,
    ) -> None:
        """Split each node's stranded capacity over its GPU pods by their share of its units."""
        on: dict[str, list[tuple[str, str, str, int]]] = {}
        for pod in view.pods:
            node = pod.node_name
            if node is not None and node in stranded and pod.holds_resources and pod.requests:
                resource, units = primary_request(pod.requests)
                queue = queues.get(pod.key, NO_QUEUE)
                on.setdefault(node, []).append((pod.namespace, queue, f"{units} {resource}", units))
        for node, (gpus, slices) in stranded.items():
            pods = on.get(node, [])
            total = sum(u for *_, u in pods)
            if not total:
                continue
            for ns, queue, size, units in pods:
                share = units / total * step
                for amount, table in ((gpus, day.stranded_gpus), (slices, day.stranded_slices)):
                    _add(table["ns"], ns, amount * share)
                    _add(table["size"], size, amount * share)
                _add(day.queues["stranded"], queue, (gpus + slices) * share)
                _add(day.queue_sizes.setdefault(queue, {}), size, (gpus + slices) * share)

    def trim(self, now_s: float) -> None:
        """Keep the last :data:`KEEP_DAYS` days."""
        keep = sorted(self.days)[-KEEP_DAYS:]
        self.days = {k: self.days[k] for k in keep}

    def window(self, now_s: float, period_s: float) -> list[tuple[str, Day]]:
        """The days that overlap ``period_s`` before ``now_s``, oldest first."""
        first = day_of(now_s - period_s)
        return [(k, d) for k, d in sorted(self.days.items()) if k >= first]

    def to_text(self) -> str:
        """The ConfigMap value."""
        data = {"version": VERSION, "days": {k: d.compact() for k, d in sorted(self.days.items())}}
        return json.dumps(data, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_text(cls, text: str) -> History:
        """Parse the ConfigMap value; an unreadable or newer one starts an empty history."""
        try:
            data = json.loads(text)
            if data.get("version") != VERSION:
                raise ValueError(f"version {data.get('version')!r}")
            return cls({str(k): Day.from_data(v) for k, v in (data.get("days") or {}).items()})
        except (ValueError, TypeError, AttributeError) as exc:
            log.warning("pending-workload history unreadable (%s); starting a new one", exc)
            return cls()


class HistoryStore:
    """The ConfigMap the history lives in (read by anyone, written by the leader)."""

    def __init__(self, kube: Kube, namespace: str, name: str = CONFIG_MAP) -> None:
        self.kube = kube
        self.namespace = namespace
        self.name = name
        self._rv: str | None = None
        self.saved_s: float | None = None

    def load(self) -> History:
        """The stored history (empty when there is none yet)."""
        obj = self.kube.get_config_map(self.namespace, self.name)
        if obj is None:
            self._rv = None
            return History()
        self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        return History.from_text(str((obj.get("data") or {}).get(DATA_KEY, "")))

    def save(self, history: History, now_s: float) -> None:
        """Write it (create, or replace what this replica last read).

        Raises:
            KubeError: the API refused (a 409 means another writer: the next save rereads).
        """
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace, "labels": MANAGED_BY},
            "data": {DATA_KEY: history.to_text()},
        }
        try:
            if self._rv is None:
                written = self.kube.create_config_map(self.namespace, body)
            else:
                body["metadata"]["resourceVersion"] = self._rv
                written = self.kube.replace_config_map(self.namespace, self.name, body)
        except KubeError as exc:
            if exc.status == 409:
                self.load()  # adopt the current version; this pass's data is saved next time
            raise
        self._rv = str((written.get("metadata") or {}).get("resourceVersion") or "") or None
        self.saved_s = now_s

    def due(self, now_s: float) -> bool:
        """Whether a save is due."""
        return self.saved_s is None or now_s - self.saved_s >= SAVE_INTERVAL_S
