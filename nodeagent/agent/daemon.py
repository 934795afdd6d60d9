"""``nodeagent run``: compose the components, supervise them, handle signals and systemd."""

from __future__ import annotations

import errno
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
from nodeagent.kube.node_patcher import KubeUnavailableError
from nodeagent.runtime.component import Component, Preparable, Reloadable
from nodeagent.runtime.lock import AGENT_LOCK_FILE, LockHeldError, ProcessLock
from nodeagent.runtime.snapshots import SnapshotStore

log = logging.getLogger(__name__)

# SIGTERM must finish well inside systemd's default TimeoutStopSec (90 s) and a pod's default
# terminationGracePeriodSeconds (30 s), leaving time for the process to exit after the threads.
STOP_TIMEOUT_S = 10.0
# The lock files that make the agent the only one on its state directory and on the kubelet's
# device-plugin directory (docs/operations.md, "One agent per node").
STATE_LOCK = AGENT_LOCK_FILE
KUBELET_LOCK = "nodeagent.lock"
# `nodeagent status` probes the state lock for a moment to tell whether an agent runs; an agent
# starting at that moment waits this long rather than take the probe for a second agent.
LOCK_GRACE_S = 1.0
# Temporary files of atomic writes left by a killed agent are removed at start; only files this
# old, so a write of another process (there is none while we hold the lock) is never touched.
STALE_TMP_S = 60.0

# Config fields a SIGHUP cannot change in a running agent: what they configure is built once at
# start (the health model, the node patcher, the HTTP listener, the lock on the kubelet's
# directory). Dotted paths; "x.*" covers a whole section.
RESTART_FIELDS = (
    "state_dir",
    "node.name",
    "health.*",
    "kubernetes.*",
    "metrics.*",
    "device_plugin.enabled",
    "device_plugin.kubelet_dir",
    "mig.enabled",
)


class StartupError(Exception):
    """The agent cannot start (one line of cause); ``hint`` says what to do about it."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.hint = hint


def describe_config(config: AgentConfig) -> str:
    """The effective config as one line of JSON, for the start-up log."""
    return config.describe()


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): value}


def restart_needed(old: AgentConfig, new: AgentConfig) -> list[str]:
    """The changed fields a running agent ignores until it restarts, as ``field (a -> b)``.

    The node's pool's ``expected_driver_version`` is among them: the health checks compare
    against the value they were built with.
    """
    before = _flatten(old.model_dump(mode="json", by_alias=True))
    after = _flatten(new.model_dump(mode="json", by_alias=True))
    fixed = [f.removesuffix("*") for f in RESTART_FIELDS]
    fixed.append(f"pools.{old.node.pool}.expected_driver_version")
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) == after.get(key):
            continue
        if any(key == f or (f.endswith(".") and key.startswith(f)) for f in fixed):
            out.append(f"{key} ({before.get(key)!r} -> {after.get(key)!r})")
    return out


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
        mig_lock_file: Path | None = None,
        host_root: Path = Path("/"),
    ) -> None:
        self.config_path = config_path
        # The node-wide MIG lock `nodeagent mig apply` takes too (`nodeagent run` passes the
        # node's; an embedding without one serialises applies within this state directory).
        self.mig_lock_file = mig_lock_file or config.state_dir / "mig" / "mig.lock"
        self.host_root = host_root
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
        self._locks: list[ProcessLock] = []
        self.started_at_s = time.time()

    def start(self) -> None:
        """Claim the node (locks, the metrics port), log the effective config, start components.

        Everything that can refuse the start is checked before any component runs, so a second
        agent or a taken port ends the process at once instead of a restart loop.

        Raises:
            StartupError: the state directory is unusable, another agent holds this node's
                state or kubelet directory, or a component cannot claim what it needs (the
                metrics port); nothing is left running.
        """
        self._claim()
        log.info("effective config: %s", describe_config(self.config))
        try:
            wired = wiring.build(
                self.config,
                self.node,
                self.snapshots,
                restarts=self.restarts,
                # /readyz and READY=1 mean the same thing: every component is up; /healthz and
                # the systemd watchdog use the same liveness rule.
                ready=lambda: self.ready,
                alive=self.alive,
                mig_lock_file=self.mig_lock_file,
                host_root=self.host_root,
                started_at_s=self.started_at_s,
            )
            self.components = list(wired.components)
            self._reloadables = wired.reloadables
            self._prepare()
        except KubeUnavailableError as exc:  # kubernetes.enabled, and no usable credentials
            self._release()
            raise StartupError(
                str(exc), "or set kubernetes.enabled: false to run without the API server"
            ) from None
        except BaseException:
            self._release()
            raise
        for component in self.components:
            self.supervisor.start(component)
        log.info("started components: %s", ", ".join(c.name for c in self.components))

    def _claim(self) -> None:
        """The state directory (usable, and ours alone), the kubelet directory, stale files."""
        state_dir = self.config.state_dir
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(
                f"state directory {state_dir} cannot be created: {exc.strerror}",
                "point state_dir (or --agent-state-dir) at a writable directory",
            ) from None
        locks = [ProcessLock(state_dir / STATE_LOCK, f"the agent state directory {state_dir}")]
        plugin = self.config.device_plugin
        if plugin.enabled:
            kubelet_dir = plugin.kubelet_dir.absolute()
            what = f"the device-plugin directory {kubelet_dir}"
            locks.append(ProcessLock(kubelet_dir / KUBELET_LOCK, what))
        try:
            for lock in locks:
                lock.acquire(LOCK_GRACE_S)
                self._locks.append(lock)
        except LockHeldError as exc:
            self._release()
            raise StartupError(
                f"another agent runs on this node: {exc}",
                f"stop it first (kill {exc.pid})" if exc.pid else "stop the other agent first",
            ) from None
        except OSError as exc:
            self._release()
            raise StartupError(
                f"cannot lock {exc.filename or state_dir}: {exc.strerror}",
                "point state_dir (or --agent-state-dir) at a writable directory",
            ) from None
        _remove_stale_tmp(state_dir)

    def _prepare(self) -> None:
        """Let components claim exclusive resources (the metrics port) before any starts."""
        for component in self.components:
            if not isinstance(component, Preparable):
                continue
            try:
                component.prepare()
            except OSError as exc:
                for other in self.components:
                    if isinstance(other, Preparable):
                        other.unprepare()
                what = exc.strerror or str(exc)
                if isinstance(exc, FileExistsError):
                    what = "a file is in its place"
                if exc.filename is not None:
                    what = f"{exc.filename}: {what}"
                hint = (
                    "another program holds it; stop it or choose another address"
                    if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL)
                    else "fix that path in the config"
                )
                raise StartupError(f"{component.name}: {what}", hint) from None

    def _release(self) -> None:
        for lock in reversed(self._locks):
            lock.release()
        self._locks.clear()

    def _check_locks(self) -> None:
        """Re-take a lock whose file someone deleted; stop if another agent got in meanwhile."""
        for lock in self._locks:
            try:
                lock.renew()
            except LockHeldError as exc:
                log.error("stopping: %s", exc)
                self.request_stop()

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
        ignored = restart_needed(self.config, config)
        self.config = config
        log.info("reloaded config: %s", describe_config(config))
        if ignored:
            # Say it: an operator who changed metrics.address and sent SIGHUP expects the move.
            log.warning(
                "reload: these changes take effect only after a restart: %s", "; ".join(ignored)
            )
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
            self._check_locks()
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
        self._release()
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


def _remove_stale_tmp(directory: Path) -> None:
    """Remove temporary files of atomic writes a killed agent left (``.name.xxxx.tmp``)."""
    cutoff = time.time() - STALE_TMP_S
    for path in directory.rglob(".*.tmp"):
        try:
            if path.is_file() and path.stat().st_mtime < cutoff:
                path.unlink()
                log.info("removed a temporary file left by an earlier run: %s", path)
        except OSError:
            continue
