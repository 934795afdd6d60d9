"""The MIG reconciler component: applies the pool's MIG layout at start and on policy change."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from nodeagent.atomicfile import write_json_atomic
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.protocols import MigDevices
from nodeagent.holds import HoldSources
from nodeagent.runtime.component import Idle
from nodeagent.runtime.lock import LockHeldError, ProcessLock
from nodeagent.runtime.mig import MigGpuOutcome, MigLayoutStatus
from nodeagent_mig.apply import APPLIED, UNCHANGED, ApplyReport, reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config

log = logging.getLogger(__name__)

STATUS_FILE = "mig-status.json"
RETRY_S = 60.0  # how often a layout that is not fully applied is tried again
LOCK_RETRY_S = 5.0  # how soon a round skipped for another apply holding the lock is tried again
LOCK_WHAT = "the node's MIG layout"
_REASON_CHARS = 200  # the reason a status, a log line and a metric label carry


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class MigReconciler:
    """Applies ``pools.<pool>.mig_layout`` from ``mig.layout_file`` (or the built-in layouts).

    It never destroys a busy instance unless ``mig.force`` is set (busy: processes run on it, or
    a prepared DRA claim or a pod's device-plugin allocation holds it, read from the DRA
    checkpoint and the kubelet at every round); a layout that would need one is reported,
    naming the claim or pod, and left for the operator (with
    ``pools.<pool>.mig_partial_apply`` the other GPUs are applied meanwhile). Every apply holds
    the node's MIG lock, the one ``nodeagent mig apply`` takes: while another apply holds it,
    the round is skipped and tried again soon.

    A layout file that cannot be read or is invalid is reported (log, ``mig-status.json``, the
    metrics) and the reconciler stays ready and idle until the file or the config changes: a
    bad file must not make the agent crash-loop or keep ``/readyz`` failing.
    """

    name = "mig-reconciler"

    def __init__(
        self,
        node: MigDevices,
        config: AgentConfig,
        *,
        lock_file: Path | None = None,
        await_override: bool = False,
    ) -> None:
        self._node = node
        self._config = config
        self._lock = ProcessLock(lock_file or config.state_dir / "mig" / "mig.lock", LOCK_WHAT)
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._applied: tuple[str | None, Path, float] | None = None
        self._retry_s = RETRY_S
        self._outcomes: dict[int, str] = {}  # last logged outcome summary per GPU
        self._logged: str | None = None  # the last error logged (each distinct one once)
        self._status: MigLayoutStatus | None = None
        # A layout chosen on the node itself (the `nvidia.com/mig.config` label), which wins
        # over the pool's `mig_layout` while set (docs/mig.md, "The GPU Operator's label").
        self._override: str | None = None
        self._override_file: Path | None = None  # where to find it (None: the config's file)
        # With a node label to read, the first round waits for its first reading: applying the
        # pool's layout first and the label's a moment later would reshape the GPUs twice.
        self._override_known = threading.Event()
        if not await_override:
            self._override_known.set()
        self.last_round_skipped = False  # the last round left the layout to another apply
        # Rounds finished, so a caller that asked for a layout can wait for its outcome.
        self._rounds = 0
        self._round_done = threading.Condition()
        self.last_report: ApplyReport | None = None
        self.last_error: str | None = None

    @property
    def ready(self) -> bool:
        """True after the first reconcile attempt (a failed one is reported, not fatal)."""
        return self._ready.is_set()

    @property
    def applied_layout(self) -> str | None:
        """The layout name last applied in full, or None."""
        return self._applied[0] if self._applied is not None else None

    def status(self) -> MigLayoutStatus | None:
        """The outcome of the last round, for the metrics; None while no layout is managed."""
        return self._status

    def reload(self, config: AgentConfig) -> None:
        """Re-check the layout after SIGHUP (the pool's layout name or the file may differ)."""
        self._config = config
        self._wake.set()

    @property
    def rounds(self) -> int:
        """How many rounds have finished (see :meth:`wait_round`)."""
        return self._rounds

    def set_override(self, layout: str | None, layout_file: Path | None = None) -> None:
        """Apply ``layout`` instead of the pool's ``mig_layout`` (None: back to the pool's),
        from ``layout_file`` (None: ``mig.layout_file``, else the shipped layouts).

        The next round starts at once; its outcome is :meth:`status` once :meth:`wait_round`
        returns.
        """
        if (layout, layout_file) != (self._override, self._override_file):
            log.info(
                "MIG layout chosen on the node: %s",
                f"{layout!r} from {layout_file or 'the agent config layout file'}"
                if layout is not None
                else "none (the pool's mig_layout again)",
            )
        self._override = layout
        self._override_file = layout_file if layout is not None else None
        self._override_known.set()
        self._wake.set()

    def wait_round(self, after: int, timeout_s: float) -> bool:
        """Wait until a round later than ``after`` (a :attr:`rounds` value) has finished."""
        with self._round_done:
            return self._round_done.wait_for(lambda: self._rounds > after, timeout=timeout_s)

    def _wanted(self) -> tuple[str | None, Path, float]:
        config = self._config
        path = self._override_file or config.mig.layout_file or DEFAULT_CONFIG_FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = -1.0
        layout = self._override if self._override is not None else config.pool.mig_layout
        return layout, path, mtime

    def reconcile_once(self) -> None:
        """Apply the wanted layout if it changed since the last successful apply."""
        wanted = self._wanted()
        layout = wanted[0]
        config = self._config
        self._retry_s = RETRY_S
        self.last_round_skipped = False
        if layout is None or not config.mig.enabled:
            self._status = None
            return
        if wanted == self._applied:
            return
        try:
            self._lock.acquire()
        except LockHeldError as exc:
            # Another apply (the boot unit, an operator's `mig apply`) is at work: never wait
            # on it here (SIGTERM must stay prompt), try again shortly.
            self._retry_s = LOCK_RETRY_S
            self.last_round_skipped = True
            self._fail(layout, f"skipped: {exc}", level=logging.INFO)
            return
        except OSError as exc:
            self._fail(layout, f"cannot take the MIG lock {exc.filename}: {exc.strerror}")
            return
        try:
            self._apply(wanted)
        finally:
            self._lock.release()

    def _apply(self, wanted: tuple[str | None, Path, float]) -> None:
        layout, path, _ = wanted
        assert layout is not None
        config = self._config
        try:
            cfg = load_config(path)
        except ConfigError as exc:
            self._fail(layout, f"layout file {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - operator input must not crash-loop the agent
            # The loader reports every bad file as ConfigError (fuzzed in tests/config); should
            # anything else escape it, that is still a bad file, not a reason to die.
            self._fail(layout, f"layout file {path}: {type(exc).__name__}: {exc}")
            return
        # Read under the MIG lock: the DRA plugin makes its instances under the same lock, so
        # no claim's instance appears between this read and the apply.
        holds = HoldSources.of_agent(
            config.state_dir,
            config.metrics.pod_resources_socket,
            config.device_plugin.kubelet_dir,
        ).read()
        try:
            report = reconcile(
                self._node,
                cfg,
                layout,
                state_dir=config.state_dir / "mig",
                holds=holds,
                force=config.mig.force,
                allow_reset=config.mig.allow_reset,
                partial=config.pool.mig_partial_apply,
            )
        except (ConfigError, GpuError, OSError) as exc:
            self._fail(layout, f"not applied: {exc}")
            return
        self.last_report = report
        self.last_error = None
        self._logged = None
        self._log_outcomes(layout, report)
        # Why the layout does not hold, in one line: the first GPU with a problem of its own,
        # else a node-wide problem (a hook), else a GPU the apply held back.
        troubled = [g.summary() for g in report.gpus if g.outcome not in (APPLIED, UNCHANGED)]
        held = [g.summary() for g in report.gpus if g.held_back]
        reasons = [*troubled, *report.errors, *held]
        reason = "" if report.ok or not reasons else _short(reasons[0])
        self._status = MigLayoutStatus(
            layout,
            report.ok,
            reason,
            tuple(
                MigGpuOutcome(g.index, g.outcome, _short(g.reason), len(g.unrestored))
                for g in report.gpus
            ),
        )
        if report.ok:
            self._applied = wanted
        self._write_status({"layout": layout, **report.to_dict()})

    def _log_outcomes(self, layout: str, report: ApplyReport) -> None:
        """One line per GPU whose outcome changed since the last round (never the whole report)."""
        for g in report.gpus:
            line = g.summary()
            if self._outcomes.get(g.index) == line:
                continue
            self._outcomes[g.index] = line
            if g.outcome == UNCHANGED and g.held_back is None:
                continue  # a GPU that already holds its layout is not news
            level = logging.INFO if g.outcome in (APPLIED, UNCHANGED) else logging.WARNING
            log.log(level, "MIG layout %r on %s", layout, line)
        for error in report.errors:
            log.warning("MIG layout %r: %s", layout, _short(error))
        if report.ok:
            log.info("MIG layout %r applied (%d mutating steps)", layout, report.mutating_steps)

    def _fail(self, layout: str, why: str, level: int = logging.ERROR) -> None:
        """Record a round that applied nothing; log each distinct reason once."""
        self.last_error = f"MIG layout {layout!r}: {why}"
        if self.last_error != self._logged:
            log.log(level, "%s", _short(self.last_error))
            self._logged = self.last_error
        gpus = self._status.gpus if self._status is not None else ()
        self._status = MigLayoutStatus(layout, False, _short(why), gpus)
        self._write_status({"layout": layout, "ok": False, "error": why})

    def _write_status(self, data: dict[str, object]) -> None:
        try:
            write_json_atomic(self._config.state_dir / STATUS_FILE, data, durable=False)
        except OSError as exc:
            log.warning("cannot write %s: %s", STATUS_FILE, exc)

    def run(self, stop: threading.Event) -> None:
        """Reconcile at start, then whenever a reload asks or a failed apply is retried."""
        while not self._override_known.wait(1.0):
            if stop.is_set():
                return
        while not stop.is_set():
            # Cleared before the round, so a request made during it is taken by the next one.
            self._wake.clear()
            self.reconcile_once()
            self._ready.set()
            with self._round_done:
                self._rounds += 1
                self._round_done.notify_all()
            # A layout that is not yet fully applied (reset required, busy instance, a bad file)
            # is retried every RETRY_S, LOCK_RETRY_S after a round skipped for the lock (each
            # distinct failure is logged once); an applied one only on reload or a new file.
            deadline = time.monotonic() + self._retry_s
            while not self._wake.is_set() and time.monotonic() < deadline:
                # One wake-up a second: reload and retry come through _wake, and shutdown is
                # noticed within a second (the agent allows 10 s to stop).
                self._wake.wait(1.0)
                if stop.is_set():
                    return
            self._wake.clear()


class NoMigReconciler(Idle):
    """MIG management turned off: no layout is managed, so none is applied and no round has an
    outcome (no MIG layout label, no MIG series). Idle, so the agent supervises no thread."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(MigReconciler.name)

    @property
    def applied_layout(self) -> str | None:
        """None: no layout is managed."""
        return None

    def status(self) -> MigLayoutStatus | None:
        """None: no layout is managed."""
        return None


def build(
    config: AgentConfig,
    node: MigDevices,
    *,
    lock_file: Path | None = None,
    await_override: bool = False,
) -> MigReconciler | NoMigReconciler:
    """The reconciler, or one that manages nothing when MIG management is off.

    ``await_override``: the node's own choice of layout will be given through
    :meth:`MigReconciler.set_override` (None for none) before the first round.
    """
    if not config.mig.enabled:
        return NoMigReconciler()
    return MigReconciler(node, config, lock_file=lock_file, await_override=await_override)
