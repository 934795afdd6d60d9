"""Application XIDs attributed to the pods that ran on the device at the time.

An XID of the catalog's application class (13, 31, 43, 45, 68) is the program's fault, not the
GPU's: the team whose pod ran there needs to see it. On such an XID the attributor takes the
processes of the latest snapshot on that device (the MIG device the event names, else the
whole GPU), counts the XID per pod and container (exported as
``nodeagent_workload_gpu_xid_errors_total``) and records a Warning Event ``GPUApplicationXID``
on each pod, at most one per pod and XID code per :data:`EVENT_INTERVAL_S` (a storm of the
same fault is one Event, counted in the metric). Events go out from a worker thread, so a slow
API server never delays the event thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field

from nodeagent.gpu.types import EventKind, GpuEvent
from nodeagent.health.xids import CATALOG, XidCategory
from nodeagent.kube.events import EventRecorder, PodRef
from nodeagent.kube.node_patcher import KubeUnavailableError
from nodeagent.workloads import AttributedProcess, Device, Workload

log = logging.getLogger(__name__)

EVENT_REASON = "GPUApplicationXID"
EVENT_INTERVAL_S = 60.0
QUEUE_LIMIT = 1000  # Events waiting beyond this are dropped (and logged): a storm, not news


@dataclass(frozen=True, slots=True)
class XidHit:
    """One application XID as one pod saw it."""

    device: Device
    workload: Workload
    xid: int
    shared_with: int  # other workloads on the device at the time


@dataclass(eq=False)
class XidAttributor:
    """Counts application XIDs per workload and records Events on the pods."""

    processes: Callable[[], Sequence[AttributedProcess]]
    recorder: EventRecorder | None = None
    _: KW_ONLY
    clock: Callable[[], float] = time.monotonic
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _counts: dict[tuple[Device, Workload, int], int] = field(default_factory=dict, init=False)
    _last_event: dict[tuple[str, str, int], float] = field(default_factory=dict, init=False)
    _queue: queue.Queue[XidHit] = field(
        default_factory=lambda: queue.Queue(QUEUE_LIMIT), init=False
    )
    unattributed: int = field(default=0, init=False)  # application XIDs with no named pod

    def counts(self) -> Mapping[tuple[Device, Workload, int], int]:
        """Application XIDs by (device, workload, code) since the agent started."""
        with self._lock:
            return dict(self._counts)

    def on_event(self, event: GpuEvent) -> list[XidHit]:
        """Attribute one NVML event; returns the hits (none for other events)."""
        if event.kind is not EventKind.XID:
            return []
        info = CATALOG.get(event.data)
        if info is None or info.category is not XidCategory.APPLICATION:
            return []
        on_device = [
            p
            for p in self.processes()
            if p.device.gpu_index == event.gpu_index
            and (event.gpu_instance_id is None or p.device.mig_instance == event.gpu_instance_id)
        ]
        workloads: dict[Workload, Device] = {}
        for p in on_device:
            if p.workload is not None and p.workload.named:
                workloads.setdefault(p.workload, p.device)
        if not workloads:
            self.unattributed += 1
            log.info(
                "XID %d (%s) on GPU %d: no pod runs there to attribute it to",
                event.data,
                info.meaning,
                event.gpu_index,
            )
            return []
        hits = [XidHit(d, w, event.data, len(workloads) - 1) for w, d in workloads.items()]
        now = self.clock()
        with self._lock:
            for hit in hits:
                bare = Workload(hit.workload.namespace, hit.workload.pod, hit.workload.container)
                key = (hit.device, bare, hit.xid)
                self._counts[key] = self._counts.get(key, 0) + 1
        for hit in hits:
            log.warning(
                "XID %d (%s) on GPU %d%s attributed to pod %s/%s container %s",
                hit.xid,
                info.meaning,
                event.gpu_index,
                f" MIG {hit.device.mig_profile}" if hit.device.mig_profile else "",
                hit.workload.namespace,
                hit.workload.pod,
                hit.workload.container,
            )
            ekey = (hit.workload.namespace, hit.workload.pod, hit.xid)
            with self._lock:
                last = self._last_event.get(ekey)
                due = last is None or now - last >= EVENT_INTERVAL_S
                if due:
                    self._last_event[ekey] = now
            if due and self.recorder is not None:
                try:
                    self._queue.put_nowait(hit)
                except queue.Full:
                    log.warning("too many XID Events waiting; dropped the one for %s", ekey)
        return hits

    def message(self, hit: XidHit) -> str:
        """The Event's text: the fault, where, what to do, and whether the GPU was shared."""
        info = CATALOG[hit.xid]
        where = f"GPU {hit.device.gpu_index} ({hit.device.gpu_uuid})"
        if hit.device.mig_profile:
            where += f" MIG {hit.device.mig_profile} instance {hit.device.mig_instance}"
        shared = (
            f"; {hit.shared_with} other workload(s) shared the device" if hit.shared_with else ""
        )
        return (
            f"XID {hit.xid} ({info.mnemonic}: {info.meaning}) on {where} while container "
            f"{hit.workload.container or '?'} ran there{shared}. The application caused it, "
            f"not the GPU: {info.action.value}."
        )

    def send_pending(self, timeout_s: float = 0.5) -> int:
        """Send the Events waiting (blocking up to ``timeout_s`` for the first); returns sent."""
        if self.recorder is None:
            return 0
        sent = 0
        try:
            hit = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            return 0
        while True:
            pod = PodRef(hit.workload.namespace, hit.workload.pod, hit.workload.pod_uid)
            try:
                self.recorder.pod_event(pod, EVENT_REASON, self.message(hit))
                sent += 1
            except KubeUnavailableError as exc:
                log.warning("could not record the XID Event: %s", exc)
            try:
                hit = self._queue.get_nowait()
            except queue.Empty:
                return sent

    def run(self, stop: threading.Event) -> None:
        """Send Events until ``stop`` is set."""
        while not stop.is_set():
            self.send_pending()
