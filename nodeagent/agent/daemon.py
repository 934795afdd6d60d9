"""``nodeagent run``: compose the components, supervise them, handle signals and systemd."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

from nodeagent.agent import wiring
from nodeagent.agent.sdnotify import Notifier
from nodeagent.agent.supervisor import Supervisor
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import AgentConfig, check_gpu_indices, load_agent_config
from nodeagent.gpu.node import GpuNode
from nodeagent.runtime.component import Component, Reloadable
from nodeagent.runtime.snapshots import SnapshotStore

log = logging.getLogger(__name__)

# SIGTERM must finish well inside systemd's default TimeoutStopSec (90 s) and a pod's default
# terminationGracePeriodSeconds (30 s), leaving time for the process to exit after the threads.
STOP_TIMEOUT_S = 10.0


def describe_config(config: AgentConfig) -> str:
    """The effective config as one line of JSON, for the start-up log."""
    return config.describe()


class Agent:
    """The agent process: components on supervised threads, reload on SIGHUP, stop on SIGTERM."""

    def __init__(
        self,
        config: AgentConfig,
        node: GpuNode,
        *,
        config_path: Path | None = None,
        config_overrides: dict[str, Any] | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config_path = config_path
        self.config_overrides = config_overrides or {}
        self.notifier = notifier or Notifier()
        self.config = config
        self.node = node
        self.snapshots = SnapshotStore()
        self.restarts: dict[str, int] = {}  # component name -> restarts (a metric)
        self._started_at = time.monotonic()
        self.supervisor = Supervisor(self.restarts)
        self.components: list[Component] = []
        self._reloadables: tuple[Reloadable, ...] = ()
        self._reload_requested = threading.Event()
        self._stop_requested = threading.Event()

    def start(self) -> None:
        """Create the state directory, log the effective config and start every component."""
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        log.info("effective config: %s", describe_config(self.config))
        wired = wiring.build(
            self.config,
            self.node,
            self.snapshots,
            restarts=self.restarts,
            # /readyz and READY=1 mean the same thing: every component is up; /healthz and the
            # systemd watchdog use the same liveness rule.
            ready=lambda: self.ready,
            alive=self.alive,
        )
        self.components = list(wired.components)
        self._reloadables = wired.reloadables
        for component in self.components:
            self.supervisor.start(component)
        log.info("started components: %s", ", ".join(c.name for c in self.components))

    @property
    def ready(self) -> bool:
        """Whether every component reports ready."""
        return all(c.ready for c in self.components)

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait until every component is ready; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready:
                return True
            if self._stop_requested.wait(0.02):
                return False
        return self.ready

    def request_reload(self) -> None:
        """Ask the main loop to reload the config (what SIGHUP does)."""
        self._reload_requested.set()

    def request_stop(self) -> None:
        """Ask the main loop to stop (what SIGTERM and SIGINT do)."""
        self._stop_requested.set()

    def reload(self) -> bool:
        """Re-read the config file; on error keep the running config and say why."""
        self.notifier.reloading()
        try:
            config = load_agent_config(self.config_path, overrides=self.config_overrides)
            check_gpu_indices(config, self.node.count(), self.config_path)
        except ConfigError as exc:
            log.error(
                "reload failed, keeping the running config: %s", "; ".join(map(str, exc.problems))
            )
            self.notifier.ready("reload failed; running the previous config")
            return False
        self.config = config
        log.info("reloaded config: %s", describe_config(config))
        for reloadable in self._reloadables:
            try:
                reloadable.reload(config)
            except Exception:
                log.exception("%s failed to reload", getattr(reloadable, "name", reloadable))
        self.notifier.ready("reloaded")
        return True

    def alive(self) -> bool:
        """Threads running and the snapshot fresh (or the first one still due).

        A snapshot older than max(3 intervals, 10 s) means sampling is wedged, typically a hung
        NVML call; the watchdog and ``/healthz`` then fail so the agent gets restarted.
        """
        if not self.supervisor.alive():
            return False
        max_age = max(3 * self.config.sampler.interval_s, 10.0)
        latest = self.snapshots.latest
        if latest is None:
            return time.monotonic() - self._started_at < max_age
        return time.time() - latest.timestamp_s < max_age

    def serve(self, ready_timeout_s: float = 60.0) -> int:
        """Run until stopped: READY once components are up, WATCHDOG while healthy."""
        self._install_signal_handlers()
        self.start()
        if self.wait_ready(ready_timeout_s):
            self.notifier.ready(f"{len(self.components)} components running")
            log.info("agent ready")
        elif not self._stop_requested.is_set():
            not_ready = [c.name for c in self.components if not c.ready]
            log.error("components not ready after %.0fs: %s", ready_timeout_s, not_ready)
        watchdog_s = self.notifier.watchdog_interval_s()
        tick = min(watchdog_s, 1.0) if watchdog_s else 1.0
        while not self._stop_requested.is_set():
            self._stop_requested.wait(tick)
            if self._reload_requested.is_set():
                self._reload_requested.clear()
                self.reload()
            # Withhold the keep-alive when a thread died or sampling wedged (NVML hang), so
            # systemd's watchdog restarts the agent instead of it silently serving stale data.
            if watchdog_s and self.alive():
                self.notifier.watchdog()
        return self.shutdown()

    def shutdown(self) -> int:
        """Stop every component within STOP_TIMEOUT_S; 0 when all stopped in time."""
        self.notifier.stopping()
        log.info("stopping")
        stragglers = self.supervisor.stop(STOP_TIMEOUT_S)
        try:
            self.node.close()
        except Exception:
            log.exception("closing NVML failed")
        self.notifier.close()
        return 1 if stragglers else 0

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_stop(signum: int, frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            self.request_stop()

        def on_hup(signum: int, frame: FrameType | None) -> None:
            self.request_reload()

        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGHUP, on_hup)
