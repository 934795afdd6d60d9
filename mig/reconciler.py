"""The MIG reconciler component: applies the pool's MIG layout at start and on policy change."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from nodeagent.atomicfile import write_json_atomic
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.errors import GpuError
from nodeagent.gpu.protocols import MigDevices
from nodeagent_mig.apply import ApplyReport, reconcile
from nodeagent_mig.config import DEFAULT_CONFIG_FILE, load_config

log = logging.getLogger(__name__)

STATUS_FILE = "mig-status.json"
RETRY_S = 60.0  # how often a layout that is not fully applied is tried again


class MigReconciler:
    """Applies ``pools.<pool>.mig_layout`` from ``mig.layout_file`` (or the built-in layouts).

    It never destroys a busy instance unless ``mig.force`` is set; a layout that would need one
    is reported and left for the operator. The last outcome is written to ``mig-status.json``
    in the agent's state directory.
    """

    name = "mig-reconciler"

    def __init__(self, node: MigDevices, config: AgentConfig) -> None:
        self._node = node
        self._config = config
        self._wake = threading.Event()
        self._ready = threading.Event()
        self._applied: tuple[str | None, Path, float] | None = None
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

    def reload(self, config: AgentConfig) -> None:
        """Re-check the layout after SIGHUP (the pool's layout name or the file may differ)."""
        self._config = config
        self._wake.set()

    def _wanted(self) -> tuple[str | None, Path, float]:
        config = self._config
        path = config.mig.layout_file or DEFAULT_CONFIG_FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            mtime = -1.0
        return config.pool.mig_layout, path, mtime

    def reconcile_once(self) -> None:
        """Apply the wanted layout if it changed since the last successful apply."""
        wanted = self._wanted()
        layout, path, _ = wanted
        config = self._config
        if layout is None or not config.mig.enabled or wanted == self._applied:
            return
        state_dir = config.state_dir / "mig"
        try:
            report = reconcile(
                self._node,
                load_config(path),
                layout,
                state_dir=state_dir,
                force=config.mig.force,
                allow_reset=config.mig.allow_reset,
            )
        except (ConfigError, GpuError, OSError) as exc:
            self.last_error = f"MIG layout {layout!r} from {path} not applied: {exc}"
            log.error("%s", self.last_error)
            self._write_status({"layout": layout, "ok": False, "error": str(exc)})
            return
        self.last_report = report
        self.last_error = None
        if report.ok:
            self._applied = wanted
            log.info("MIG layout %r applied (%d mutating steps)", layout, report.mutating_steps)
        else:
            log.warning("MIG layout %r not fully applied: %s", layout, json.dumps(report.to_dict()))
        self._write_status({"layout": layout, **report.to_dict()})

    def _write_status(self, data: dict[str, object]) -> None:
        write_json_atomic(self._config.state_dir / STATUS_FILE, data, durable=False)

    def run(self, stop: threading.Event) -> None:
        """Reconcile at start, then whenever a reload asks or a failed apply is retried."""
        while not stop.is_set():
            self.reconcile_once()
            self._ready.set()
            # A layout that is not yet fully applied (reset required, busy instance) is retried
            # every RETRY_S; an applied one only on reload.
            deadline = time.monotonic() + RETRY_S
            while not self._wake.is_set() and time.monotonic() < deadline:
                # One wake-up a second: reload and retry come through _wake, and shutdown is
                # noticed within a second (the agent allows 10 s to stop).
                self._wake.wait(1.0)
                if stop.is_set():
                    return
            self._wake.clear()


def build(config: AgentConfig, node: MigDevices) -> MigReconciler | None:
    """The reconciler, or None when MIG management is off."""
    return MigReconciler(node, config) if config.mig.enabled else None
