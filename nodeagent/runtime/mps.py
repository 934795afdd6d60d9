"""MPS control daemons: one per device shared through MPS, each with its own pipe and log dirs.

Shared by the device plugin (one daemon per GPU it advertises as MPS replicas) and the DRA
driver (one daemon per device of a prepared MPS claim); each feature keeps its own root.

The daemon is ``nvidia-cuda-mps-control -d``; it forks into the background, so it is supervised
through its control interface rather than a child PID: a command piped to
``nvidia-cuda-mps-control`` (same ``CUDA_MPS_PIPE_DIRECTORY``) succeeds only while the daemon
answers. The device plugin advertises a GPU's replicas Healthy only while its daemon answers; a
daemon that stops answering is started again.

Limits are set by control commands, as NVIDIA's plugin does, not by container env: the default
active-thread percentage and the default pinned device memory limit per client. The daemon sees
only its own GPU (``CUDA_VISIBLE_DEVICES=<uuid>``), so the memory limit is set for device 0 of
that view (NVIDIA's plugin found limits set by UUID were ignored).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.config.device_plugin import MpsSection
from nodeagent.config.pool_policy import Sharing

log = logging.getLogger(__name__)

PROBE = "get_default_active_thread_percentage"


@dataclass(frozen=True, slots=True)
class MpsPaths:
    """Where one GPU's MPS daemon talks: host pipe directory and its path in the container."""

    host_pipe_dir: Path
    container_pipe_dir: Path
    host_shm_dir: Path
    host_log_dir: Path


class MpsError(RuntimeError):
    """The control daemon could not be started or did not answer (one-line reason)."""


@dataclass(frozen=True, slots=True)
class MpsTarget:
    """What one device's daemon should look like (``gpu_uuid``: the GPU or MIG device the
    daemon sees as device 0); a limit of None is left at the daemon's own default."""

    gpu_uuid: str
    gpu_index: int
    replicas: int
    active_thread_percentage: int | None  # per client
    pinned_memory_limit_mib: int | None  # per client

    @classmethod
    def for_gpu(cls, gpu_uuid: str, gpu_index: int, sharing: Sharing, memory_mib: int) -> MpsTarget:
        """Per-replica limits: the policy's values, else an equal share of the GPU."""
        replicas = max(sharing.replicas, 1)
        pct = sharing.mps_active_thread_percentage or max(100 // replicas, 1)
        mem = sharing.mps_pinned_memory_limit_mib or max(memory_mib // replicas, 1)
        return cls(gpu_uuid, gpu_index, replicas, pct, mem)


class MpsDaemon:
    """One GPU's control daemon."""

    def __init__(self, target: MpsTarget, section: MpsSection, binary: str | None) -> None:
        self.target = target
        self.section = section
        self.binary = binary
        base = section.root / target.gpu_uuid
        self.pipe_dir = base / "pipe"
        self.log_dir = base / "log"
        self.ready = False
        self.starts = 0
        self.last_error: str | None = None

    @property
    def paths(self) -> MpsPaths:
        """Mounts for containers using this GPU."""
        return MpsPaths(
            host_pipe_dir=self.pipe_dir,
            container_pipe_dir=self.section.container_pipe_root / self.target.gpu_uuid / "pipe",
            host_shm_dir=self.section.shm_dir,
            host_log_dir=self.log_dir,
        )

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.pipe_dir)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.log_dir)
        env["CUDA_VISIBLE_DEVICES"] = self.target.gpu_uuid
        return env

    def control(self, *commands: str, timeout_s: float | None = None) -> str:
        """Pipe commands to the daemon; their output, or MpsError when it does not answer."""
        if self.binary is None:
            raise MpsError(
                f"{self.section.control_binary} not found; install the CUDA MPS tools or set "
                "device_plugin.mps.control_binary"
            )
        try:
            done = subprocess.run(
                [self.binary],
                input="".join(c + "\n" for c in commands),
                env=self._env(),
                capture_output=True,
                text=True,
                timeout=timeout_s or self.section.start_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(f"GPU {self.target.gpu_uuid}: MPS control failed: {exc}") from exc
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()
            raise MpsError(
                f"GPU {self.target.gpu_uuid}: MPS daemon did not answer {commands[0]!r} "
                f"(exit {done.returncode}{': ' + detail[-1] if detail else ''})"
            )
        return done.stdout

    def alive(self) -> bool:
        """Whether the daemon answers its probe command."""
        try:
            self.control(PROBE)
        except MpsError as exc:
            self.last_error = str(exc)
            return False
        return True

    def start(self) -> None:
        """Start the daemon, wait until it answers, then set its limits. Raises MpsError."""
        self.ready = False
        if self.binary is None:
            self.control(PROBE)  # raises the "not found" error
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self.alive():  # a daemon left from an earlier agent is adopted
            # The daemon forks and keeps inherited descriptors: a pipe for its output would never
            # reach EOF, so the launcher's stderr goes to a file in the log directory.
            errors = self.log_dir / "launcher.err"
            try:
                with errors.open("wb") as err:
                    launcher = subprocess.run(
                        [str(self.binary), "-d"],
                        env=self._env(),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=err,
                        timeout=self.section.start_timeout_s,
                        check=False,
                    )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MpsError(f"GPU {self.target.gpu_uuid}: cannot start MPS: {exc}") from exc
            if launcher.returncode != 0:
                detail = errors.read_text(errors="replace").strip().splitlines()
                raise MpsError(
                    f"GPU {self.target.gpu_uuid}: `{self.binary} -d` exited "
                    f"{launcher.returncode}{': ' + detail[-1] if detail else ''}"
                )
            self.starts += 1
            deadline = time.monotonic() + self.section.start_timeout_s
            while not self.alive():
                if time.monotonic() > deadline:
                    raise MpsError(
                        f"GPU {self.target.gpu_uuid}: MPS daemon did not answer within "
                        f"{self.section.start_timeout_s:g}s ({self.last_error})"
                    )
                time.sleep(0.02)
        limits = []
        if self.target.active_thread_percentage is not None:
            limits.append(
                f"set_default_active_thread_percentage {self.target.active_thread_percentage}"
            )
        if self.target.pinned_memory_limit_mib is not None:
            limits.append(
                f"set_default_device_pinned_mem_limit 0 {self.target.pinned_memory_limit_mib}M"
            )
        if limits:
            self.control(*limits)
        self.ready = True
        self.last_error = None

    def stop(self) -> None:
        """Ask the daemon to quit and wait until it stops answering."""
        self.ready = False
        try:
            self.control("quit", timeout_s=2.0)
        except MpsError:
            return
        deadline = time.monotonic() + self.section.start_timeout_s
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.02)


class MpsSupervisor:
    """Keeps one daemon per MPS GPU running with the wanted limits."""

    def __init__(
        self,
        section: MpsSection,
        on_change: Callable[[], None],
        *,
        consequence: str = "its replicas are advertised Unhealthy until it answers",
    ) -> None:
        self.section = section
        self._consequence = consequence
        self._on_change = on_change
        self._daemons: dict[str, MpsDaemon] = {}
        self._lock = threading.RLock()
        self._next_check = 0.0
        binary = str(section.control_binary)
        self._binary = binary if "/" in binary else shutil.which(binary)

    def sync(self, targets: Mapping[str, MpsTarget]) -> None:
        """Start, restart (changed limits) and stop daemons to match ``targets`` (by GPU UUID)."""
        with self._lock:
            for uuid in list(self._daemons):
                daemon = self._daemons[uuid]
                if targets.get(uuid) != daemon.target:
                    daemon.stop()
                    del self._daemons[uuid]
            for uuid, target in targets.items():
                if uuid not in self._daemons:
                    daemon = MpsDaemon(target, self.section, self._binary)
                    self._daemons[uuid] = daemon
                    self._start(daemon)
        self._on_change()

    def _start(self, daemon: MpsDaemon) -> None:
        try:
            daemon.start()
            log.info("MPS daemon for GPU %s answers", daemon.target.gpu_uuid)
        except MpsError as exc:
            daemon.last_error = str(exc)
            log.error("%s; %s", exc, self._consequence)

    def check(self, force: bool = False) -> bool:
        """Restart daemons that stopped answering (at most every check interval)."""
        now = time.monotonic()
        if not force and now < self._next_check:
            return False
        self._next_check = now + self.section.check_interval_s
        changed = False
        with self._lock:
            for daemon in self._daemons.values():
                if daemon.ready and daemon.alive():
                    continue
                was_ready = daemon.ready
                if was_ready:
                    log.warning(
                        "MPS daemon for GPU %s stopped answering; restarting",
                        daemon.target.gpu_uuid,
                    )
                    daemon.ready = False
                    self._on_change()
                self._start(daemon)
                changed = changed or daemon.ready != was_ready or was_ready
        if changed:
            self._on_change()
        return changed

    def ready(self, gpu_uuid: str) -> bool:
        """Whether the GPU's daemon answers."""
        daemon = self._daemons.get(gpu_uuid)
        return daemon is not None and daemon.ready

    def reason(self, gpu_uuid: str) -> str | None:
        """Why the GPU's MPS replicas are unhealthy, or None."""
        daemon = self._daemons.get(gpu_uuid)
        if daemon is None:
            return "MPS daemon not started"
        return None if daemon.ready else f"MPS daemon not answering: {daemon.last_error}"

    def paths(self, gpu_uuid: str) -> MpsPaths | None:
        """Container mounts for an MPS GPU, or None for other GPUs."""
        daemon = self._daemons.get(gpu_uuid)
        return daemon.paths if daemon is not None else None

    def daemon(self, gpu_uuid: str) -> MpsDaemon | None:
        """The daemon object of a GPU (for status and tests)."""
        return self._daemons.get(gpu_uuid)

    def stop_all(self) -> None:
        """Stop every daemon (agent shutdown)."""
        with self._lock:
            for daemon in self._daemons.values():
                daemon.stop()
            self._daemons.clear()
