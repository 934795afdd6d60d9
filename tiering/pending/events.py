"""Events on diagnosed pods, at most one per reason change and per 10 minutes per pod.

Each pending pod's Events form one series per reason, the way client-go's recorder aggregates:
a new reason creates an Event (``GPUFragmentation``, ``GPUCapacity``, ``GPUTier``, ``GPUQuota``,
``GPUPendingOther``; the message starts with the diagnosis word, e.g. ``contiguity-mig:``); the
same reason 10 minutes later patches that Event (``count`` + 1, ``lastTimestamp``, message).
The state this needs is the Events themselves: after a restart or a failover the recorder reads
its own Events back (:meth:`PodEvents.seed`), so a new leader neither repeats nor forgets them.
The series' ``firstTimestamp`` also says since when a pod has been blocked for its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nodeagent_tiering.cluster.cluster_api import Kube, KubeError
from nodeagent_tiering.cluster.units import micro_time, parse_time
from nodeagent_tiering.pending.results import EVENT_REASONS, Diagnosis, Reason

log = logging.getLogger(__name__)

COMPONENT = "nodeagent-tiering"
REPEAT_S = 600.0  # the same reason is recorded again (as the series' count) at most this often


@dataclass(frozen=True, slots=True)
class Series:
    """The Event series of one pod's current reason."""

    reason: Reason
    since_s: float  # first recorded (firstTimestamp)
    last_s: float  # last recorded (lastTimestamp)
    event: str = ""  # the Event's name ("" in a dry run, where none was written)
    namespace: str = ""
    count: int = 1


def _reason_of(event: Mapping[str, Any]) -> Reason | None:
    word = str(event.get("message") or "").split(":", 1)[0].strip()
    try:
        return Reason(word)
    except ValueError:
        return None


def series_from_events(events: Iterable[Mapping[str, Any]]) -> dict[str, Series]:
    """Pod UID -> the latest series among this component's Events on it."""
    out: dict[str, Series] = {}
    for event in events:
        obj = event.get("involvedObject") or {}
        uid = str(obj.get("uid") or "")
        reason = _reason_of(event)
        first = parse_time(event.get("firstTimestamp")) or parse_time(event.get("eventTime"))
        last = parse_time(event.get("lastTimestamp")) or first
        if not uid or reason is None or first is None or last is None:
            continue
        meta = event.get("metadata") or {}
        found = Series(
            reason,
            first,
            last,
            str(meta.get("name", "")),
            str(meta.get("namespace", "")),
            int(event.get("count") or 1),
        )
        if uid not in out or found.last_s > out[uid].last_s:
            out[uid] = found
    return out


def message(d: Diagnosis) -> str:
    """The Event message: reason word, evidence, and the suggested change."""
    text = f"{d.reason.value}: {d.evidence}"
    if d.unblock is not None:
        text += f". Smallest change that unblocks it: {d.unblock.text}"
    return text[:1024]


class PodEvents:
    """Decides and writes the Events of a pass (``kube=None``: decide only, as a dry run)."""

    def __init__(self, kube: Kube | None, *, instance: str = "") -> None:
        self.kube = kube
        self.instance = instance
        self.series: dict[str, Series] = {}
        self.seeded = False
        self.recorded = 0  # Events created or patched since start

    def seed(self) -> None:
        """Read this component's Events back (at start and when leadership is gained)."""
        if self.kube is None:
            self.seeded = True
            return
        self.series = series_from_events(self.kube.list_component_events(COMPONENT))
        self.seeded = True

    def observe(self, diagnoses: Iterable[Diagnosis], now_s: float) -> list[tuple[str, Diagnosis]]:
        """Record what is due for this pass; returns (``created``/``updated``, diagnosis) pairs.

        Pods that are no longer pending are forgotten (their Events expire with the API
        server's Event TTL).
        """
        done: list[tuple[str, Diagnosis]] = []
        current: dict[str, Series] = {}
        for d in diagnoses:
            key = d.uid or d.pod
            old = self.series.get(key)
            if old is not None and old.reason is d.reason and now_s - old.last_s < REPEAT_S:
                current[key] = old
                continue
            if old is not None and old.reason is d.reason:
                updated = self._update(old, d, now_s)
                current[key] = updated
                if updated.last_s == now_s:
                    done.append(("updated", d))
                continue
            created = self._create(d, now_s)
            if created is None:  # not written: keep what was, so the next pass tries again
                if old is not None:
                    current[key] = old
                continue
            current[key] = created
            done.append(("created", d))
        self.series = current
        return done

    def since(self, d: Diagnosis) -> float | None:
        """Since when the pod has been pending for its current reason, as far as recorded."""
        found = self.series.get(d.uid or d.pod)
        return found.since_s if found is not None and found.reason is d.reason else None

    def _create(self, d: Diagnosis, now_s: float) -> Series | None:
        """The new series; ``None`` when the API refused it (logged)."""
        if self.kube is None:
            return Series(d.reason, now_s, now_s)
        stamp = micro_time(now_s)[:19] + "Z"
        body = {
            "metadata": {"generateName": f"{d.name}.", "namespace": d.namespace},
            "involvedObject": {
                "kind": d.kind,
                "apiVersion": d.api_version,
                "name": d.name,
                "namespace": d.namespace,
                "uid": d.uid,
            },
            "reason": EVENT_REASONS[d.reason],
            "message": message(d),
            "type": "Normal" if d.reason is Reason.QUOTA else "Warning",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            made = self.kube.create_event(d.namespace, body)
        except KubeError as exc:
            log.warning("cannot record %s on pod %s: %s", body["reason"], d.pod, exc)
            return None
        self.recorded += 1
        name = str((made.get("metadata") or {}).get("name", ""))
        return Series(d.reason, now_s, now_s, name, d.namespace, 1)

    def _update(self, old: Series, d: Diagnosis, now_s: float) -> Series:
        if self.kube is None or not old.event:
            return replace(old, last_s=now_s)
        patch = {
            "count": old.count + 1,
            "lastTimestamp": micro_time(now_s)[:19] + "Z",
            "message": message(d),
        }
        try:
            self.kube.patch_event(old.namespace or d.namespace, old.event, patch)
        except KubeError as exc:
            if exc.status == 404:  # expired (Event TTL): start a new series
                return self._create(d, now_s) or replace(old, last_s=now_s)
            log.warning("cannot update event %s on pod %s: %s", old.event, d.pod, exc)
            return old
        self.recorded += 1
        return replace(old, last_s=now_s, count=old.count + 1)
