"""The GPU Operator's MIG label protocol: ``nvidia.com/mig.config`` picks this node's layout.

With NVIDIA's GPU Operator, an operator changes a node's MIG layout by setting the node label
``nvidia.com/mig.config=<layout name>``; mig-manager applies it and reports progress in
``nvidia.com/mig.config.state``. This component speaks the same protocol, so dashboards and
automation built on it keep working after the switch (docs/mig.md, "The GPU Operator's label"):

- it reads the label from this node (a GET every ``poll_s``: the agent may not list or watch
  nodes) and, while the label is set, makes it the MIG reconciler's layout, in place of the
  pool's ``mig_layout``; the name is looked up in ``mig.layout_file`` when set, else in
  mig-manager's mount of its ConfigMap (``/mig-parted-config/config.yaml``) when there is one,
  else in the shipped layouts (which use mig-parted's names);
- it sets the state to ``pending``, lets the reconciler apply the layout through the one apply
  path (``nodeagent mig apply``'s: busy and held instances are kept unless ``mig.force``),
  then to ``success`` or ``failed``; the outcome and its reason go to an Event on the node, to
  the log and to ``mig-config-label.json`` in the state directory, which ``nodeagent mig show``
  prints;
- while the layout changes, the device plugin keeps advertising the layout from before the
  change (:class:`HeldSnapshots`) and moves to the new one in one step, from a snapshot taken
  after the apply; it never serves a half-made layout.

A failed layout stays ``failed`` until the label changes or the reconciler's retry (every
minute) succeeds, which turns it to ``success``.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent import labels as lbl
from nodeagent.atomicfile import write_json_atomic
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.types import NodeSnapshot
from nodeagent.kube.events import EventRecorder
from nodeagent.kube.node_label import read_node_label, set_node_labels
from nodeagent.kube.node_patcher import KubeUnavailableError, make_api
from nodeagent.runtime.backoff import Backoff
from nodeagent.runtime.component import Component, Idle
from nodeagent.runtime.mig import MigLayoutStatus
from nodeagent.runtime.snapshots import SnapshotCallback, SnapshotFeed, SnapshotStore
from nodeagent_mig.reconciler import MigReconciler, NoMigReconciler

log = logging.getLogger(__name__)

# mig-manager's names and values, unchanged (label-for-label compatibility).
MIG_CONFIG_LABEL = lbl.MIG_CONFIG
MIG_CONFIG_STATE_LABEL = lbl.MIG_CONFIG_STATE
PENDING = "pending"
SUCCESS = "success"
FAILED = "failed"

# Where mig-manager's DaemonSet mounts the mig-parted ConfigMap (`default-mig-parted-config`,
# key `config.yaml`); ours mounts it there too, optionally.
MIG_PARTED_CONFIG_FILE = Path("/mig-parted-config/config.yaml")
STATUS_FILE = "mig-config-label.json"  # in the agent's state directory; `mig show` reads it
POLL_S = 5.0  # how often the label is read
HOLD_RELEASE_S = 10.0  # longest wait, after an apply, for a snapshot taken after it
EVENT_APPLIED = "MigConfigApplied"
EVENT_FAILED = "MigConfigFailed"


class HeldSnapshots:
    """The snapshot store as the device plugin sees it: frozen while a MIG layout changes.

    While held, ``latest`` and ``generation`` stay what they were when the hold began, so the
    plugin keeps advertising the layout from before the change instead of following each
    created and destroyed instance; :meth:`release` lets it see the newest snapshot again.
    """

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._held: tuple[NodeSnapshot | None, int] | None = None

    @property
    def held(self) -> bool:
        """Whether the view is frozen now."""
        return self._held is not None

    @property
    def latest(self) -> NodeSnapshot | None:
        """The newest snapshot, or the one from when the hold began."""
        held = self._held
        return held[0] if held is not None else self._store.latest

    @property
    def generation(self) -> int:
        """The store's generation, or the one from when the hold began."""
        held = self._held
        return held[1] if held is not None else self._store.generation

    def subscribe(self, callback: SnapshotCallback) -> Any:
        """Follow new snapshots; none are passed on while held."""

        def gated(snapshot: NodeSnapshot) -> None:
            if self._held is None:
                callback(snapshot)

        return self._store.subscribe(gated)

    def wait_newer(self, generation: int, timeout_s: float) -> NodeSnapshot | None:
        """As the store's, except that nothing is newer while held."""
        if self._held is not None:
            time.sleep(timeout_s)
            return None
        return self._store.wait_newer(generation, timeout_s)

    def hold(self) -> None:
        """Freeze the view at the store's current snapshot."""
        with self._lock:
            if self._held is None:
                self._held = (self._store.latest, self._store.generation)

    def release(self) -> None:
        """Follow the store again."""
        with self._lock:
            self._held = None


@dataclass(frozen=True, slots=True)
class LabelState:
    """What the node's label asks for and how far the agent got (``mig-config-label.json``)."""

    layout: str | None  # the label's value; None when the node has no label
    state: str | None  # pending, success, failed; None without a label
    reason: str  # why it failed ("" otherwise)


class MigConfigLabel:
    """Follows this node's ``nvidia.com/mig.config`` label (see the module docstring)."""

    name = "mig-config-label"

    def __init__(
        self,
        *,
        api: Any,
        node_name: str,
        reconciler: MigReconciler,
        snapshots: SnapshotStore,
        held: HeldSnapshots | None,
        state_dir: Path,
        request_timeout_s: float = 5.0,
        poll_s: float | None = None,
        retry: Backoff | None = None,
        layout_file: Path | None = None,
        mig_parted_file: Path = MIG_PARTED_CONFIG_FILE,
    ) -> None:
        self._api = api
        self._node = node_name
        self._reconciler = reconciler
        self._snapshots = snapshots
        self._held = held
        self._state_dir = state_dir
        self._timeout_s = request_timeout_s
        self._poll_s = POLL_S if poll_s is None else poll_s
        self._retry = retry or Backoff(0.5, 30.0)
        self._layout_file = layout_file
        self._mig_parted_file = mig_parted_file
        self._events = EventRecorder(api, node_name, request_timeout_s=request_timeout_s)
        self._ready = threading.Event()
        self._label: str | None = None
        self._read_once = False
        self.state: LabelState = LabelState(None, None, "")
        self._unreachable: str | None = None  # the last API error logged (each one once)

    @property
    def ready(self) -> bool:
        """True once the label has been read (or the first read failed: the pool's layout then
        applies, and the label is taken when the API server answers)."""
        return self._ready.is_set()

    def reload(self, config: AgentConfig) -> None:
        """Take a new ``mig.layout_file`` (SIGHUP); used from the next label change on."""
        self._layout_file = config.mig.layout_file

    def file_for_label(self) -> Path | None:
        """Where the label's layout is looked up: ``mig.layout_file`` when set, else the
        mounted mig-parted ConfigMap when there is one (None: the shipped layouts)."""
        if self._layout_file is None and self._mig_parted_file.is_file():
            return self._mig_parted_file
        return None

    def run(self, stop: threading.Event) -> None:
        """Read the label every ``poll_s`` and act on each change, until ``stop``."""
        try:
            self._run(stop)
        finally:
            if not self._read_once:
                # Whatever ended this before a first reading (the supervisor restarts it), the
                # reconciler must not wait for it: the pool's layout applies meanwhile.
                self._reconciler.set_override(None)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                value = read_node_label(
                    self._api, self._node, MIG_CONFIG_LABEL, timeout_s=self._timeout_s
                )
            except KubeUnavailableError as exc:
                if str(exc) != self._unreachable:
                    log.warning("cannot read label %s: %s", MIG_CONFIG_LABEL, exc)
                    self._unreachable = str(exc)
                if not self._read_once:
                    # Let the reconciler start with the pool's layout rather than wait.
                    self._reconciler.set_override(None)
                self._ready.set()
                stop.wait(self._retry.fail())
                continue
            if self._unreachable is not None:
                log.info("label %s readable again", MIG_CONFIG_LABEL)
                self._unreachable = None
            self._retry.succeed()
            if not self._read_once or value != self._label:
                self._read_once = True
                self._label = value
                self._follow(value, stop)
            elif value is not None and self.state.state == FAILED:
                self._recheck(value)
            self._ready.set()
            stop.wait(self._poll_s)

    def _follow(self, value: str | None, stop: threading.Event) -> None:
        """Act on a new label value: apply its layout and report the outcome."""
        if value is None:
            log.info("label %s is not set: the pool's mig_layout decides", MIG_CONFIG_LABEL)
            self._reconciler.set_override(None)
            self._record(LabelState(None, None, ""))
            return
        log.info("label %s=%s: applying that layout", MIG_CONFIG_LABEL, value)
        self._record(LabelState(value, PENDING, ""))
        self._set_state(PENDING)
        status = self._apply(value, stop)
        if status is None:
            return  # stopping: the state stays pending and the next start takes it up
        self._report(value, status)

    def _apply(self, layout: str, stop: threading.Event) -> MigLayoutStatus | None:
        """Have the reconciler apply ``layout`` with the device plugin held; its outcome."""
        reconciler = self._reconciler
        if self._held is not None:
            self._held.hold()
            log.info("device plugin advertisement held while MIG layout %r is applied", layout)
        try:
            after = reconciler.rounds
            reconciler.set_override(layout, self.file_for_label())
            while not stop.is_set():
                if not reconciler.wait_round(after, 1.0):
                    continue
                status = reconciler.status()
                # A round that began before the request, or one that found the lock taken by
                # another apply, says nothing of this layout: wait for the next.
                if (
                    status is not None
                    and status.layout == layout
                    and not reconciler.last_round_skipped
                ):
                    return status
                after = reconciler.rounds
            return None
        finally:
            if self._held is not None:
                self._release_hold(stop)

    def _release_hold(self, stop: threading.Event) -> None:
        """Let the device plugin follow again, from a snapshot taken after the apply."""
        assert self._held is not None
        generation = self._snapshots.generation
        # Not while stopping: the sampler may be gone, and the agent has 10 s to stop.
        if not stop.is_set() and self._snapshots.wait_newer(generation, HOLD_RELEASE_S) is None:
            log.warning("no new snapshot %.0f s after the MIG change", HOLD_RELEASE_S)
        self._held.release()
        log.info("device plugin advertisement follows the GPUs again")

    def _recheck(self, layout: str) -> None:
        """A failed layout the reconciler's own retry has since applied is a success."""
        status = self._reconciler.status()
        if status is not None and status.layout == layout and status.applied:
            self._report(layout, status)

    def _report(self, layout: str, status: MigLayoutStatus) -> None:
        if status.applied:
            log.info("label %s=%s: layout applied", MIG_CONFIG_LABEL, layout)
            self._record(LabelState(layout, SUCCESS, ""))
            self._set_state(SUCCESS)
            self._event(EVENT_APPLIED, f"MIG layout {layout!r} applied", warning=False)
            return
        reason = status.reason or "not applied"
        log.warning("label %s=%s: failed: %s", MIG_CONFIG_LABEL, layout, reason)
        self._record(LabelState(layout, FAILED, reason))
        self._set_state(FAILED)
        self._event(EVENT_FAILED, f"MIG layout {layout!r} not applied: {reason}", warning=True)

    def _set_state(self, state: str) -> None:
        try:
            set_node_labels(
                self._api, self._node, {MIG_CONFIG_STATE_LABEL: state}, timeout_s=self._timeout_s
            )
        except KubeUnavailableError as exc:
            # The state file and the log still say it; the next change sets the label again.
            log.warning("cannot set %s=%s: %s", MIG_CONFIG_STATE_LABEL, state, exc)
            return
        log.info("node %s: %s=%s", self._node, MIG_CONFIG_STATE_LABEL, state)

    def _event(self, reason: str, message: str, *, warning: bool) -> None:
        try:
            self._events.node_event(reason, message, warning=warning)
        except KubeUnavailableError as exc:
            log.warning("cannot record Event %s: %s", reason, exc)

    def _record(self, state: LabelState) -> None:
        self.state = state
        data: dict[str, str | None] = {
            "label": MIG_CONFIG_LABEL,
            "layout": state.layout,
            "state": state.state,
        }
        if state.reason:
            data["reason"] = state.reason
        try:
            write_json_atomic(self._state_dir / STATUS_FILE, data, durable=False)
        except OSError as exc:
            log.warning("cannot write %s: %s", STATUS_FILE, exc)


def build(
    config: AgentConfig, reconciler: MigReconciler | NoMigReconciler, snapshots: SnapshotStore
) -> tuple[Component, SnapshotFeed]:
    """The `nvidia.com/mig.config` label's component, and the device plugin's snapshot feed
    (held while a layout the label chose is applied); (idle, the store) without Kubernetes or
    MIG management."""
    idle = Idle(MigConfigLabel.name)
    # The label chooses among layouts only where the agent manages them, and is read only
    # where the API server is at hand.
    if isinstance(reconciler, NoMigReconciler) or not config.kubernetes.enabled:
        return idle, snapshots
    kube = config.kubernetes
    try:
        api = make_api(kube)
    except KubeUnavailableError as exc:
        log.warning("label %s is not read: %s", MIG_CONFIG_LABEL, exc)
        reconciler.set_override(None)
        return idle, snapshots
    held = HeldSnapshots(snapshots) if config.device_plugin.enabled else None
    component = MigConfigLabel(
        api=api,
        node_name=config.node_name,
        reconciler=reconciler,
        snapshots=snapshots,
        held=held,
        state_dir=config.state_dir,
        request_timeout_s=kube.request_timeout_s,
        layout_file=config.mig.layout_file,
    )
    return component, (held if held is not None else snapshots)
