"""The Allocate front: a Go program that answers the kubelet's ``Allocate`` for the agent.

Python's gRPC server costs more per call than the whole of a Go device plugin's ``Allocate``
(docs/benchmarks.md), so with ``device_plugin.allocate_front`` set, each resource's socket in
the kubelet's directory is served by ``nodeagent-device-plugin-front`` (``device_plugin/front``)
instead. It answers ``Allocate`` itself, from a table the agent sends whenever what Allocate
reads changes (devices, health, MPS daemons, config), and passes every other call (ListAndWatch,
GetPreferredAllocation, ...) to the agent's own server on a private socket, unchanged. The
rules stay defined here, in :mod:`nodeagent_device_plugin.allocate`; the table is their input,
and tests/device_plugin/test_front.py holds the Go answers equal to the Python ones.

The agent talks to the program over its stdin and stdout, one JSON line per request and reply.
When the program cannot start, stops, or refuses a request, the agent takes it out of service,
logs why, and serves every socket itself again: Allocate is then answered in Python.
"""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from nodeagent.config.device_plugin import DeviceListStrategy, DevicePluginSection
from nodeagent.config.pool_policy import SharingMode
from nodeagent.runtime.mps import MpsPaths
from nodeagent_device_plugin.cdi import device_names
from nodeagent_device_plugin.resources import PluginDevice, Resource

log = logging.getLogger(__name__)

REPLY_TIMEOUT_S = 5.0  # the program answers at once; longer means it is stuck
STOP_TIMEOUT_S = 2.0

AllocateTable = dict[str, Any]


class FrontError(Exception):
    """The front cannot be used (one line: why)."""


class Front:
    """The running program and its control pipe (one request at a time)."""

    def __init__(self, program: Path) -> None:
        self.program = program
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._failure: str | None = None

    def start(self) -> None:
        """Start the program; FrontError if it is missing or does not run."""
        if not os.access(self.program, os.X_OK) or not self.program.is_file():
            raise FrontError(f"{self.program} is not an executable file")
        try:
            process = subprocess.Popen(
                [str(self.program)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise FrontError(f"{self.program} does not start: {exc.strerror}") from None
        self._process = process
        assert process.stderr is not None
        threading.Thread(
            target=_relay, args=(process.stderr,), name="allocate-front-log", daemon=True
        ).start()
        log.info("Allocate front %s started (pid %d)", self.program, process.pid)

    @property
    def pid(self) -> int | None:
        """The program's process ID while it runs (status and tests)."""
        process = self._process
        return None if process is None or process.poll() is not None else process.pid

    @property
    def broken(self) -> str | None:
        """Why the front is out of service (it stopped, or :meth:`fail`); None while it runs."""
        if self._failure is not None:
            return self._failure
        process = self._process
        if process is None:
            return "it was stopped"
        code = process.poll()
        return None if code is None else f"it exited with status {code}"

    def fail(self, reason: str) -> None:
        """Take the front out of service: stop it and keep ``reason`` for :attr:`broken`."""
        self._failure = reason
        self.stop()

    def serve(self, socket: Path, upstream: Path) -> None:
        """Serve ``socket`` for the kubelet, passing calls it does not answer to ``upstream``."""
        self._call({"op": "serve", "socket": str(socket), "upstream": str(upstream)})

    def table(self, socket: Path, table: AllocateTable) -> None:
        """Answer Allocate on ``socket`` from ``table``."""
        self._call({"op": "table", "socket": str(socket), "table": table})

    def close(self, socket: Path) -> None:
        """Stop serving ``socket`` (its streams end) and remove it."""
        self._call({"op": "close", "socket": str(socket)})

    def stop(self) -> None:
        """End the program: stdin closed (it closes every socket), killed if it lingers."""
        with self._lock:  # a request in flight finishes first
            process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def _call(self, request: dict[str, Any]) -> None:
        line = json.dumps(request, separators=(",", ":")).encode() + b"\n"
        with self._lock:
            process = self._process
            if process is None or process.stdin is None or process.stdout is None:
                raise FrontError("it is not running")
            try:
                process.stdin.write(line)
                process.stdin.flush()
                ready, _, _ = select.select([process.stdout], [], [], REPLY_TIMEOUT_S)
                answer = process.stdout.readline() if ready else b""
            except (OSError, ValueError) as exc:  # ValueError: the pipe was closed
                raise FrontError(f"its control pipe failed: {exc}") from None
        if not ready:
            raise FrontError(f"no answer to {request['op']} within {REPLY_TIMEOUT_S:g} s")
        if not answer:
            raise FrontError(f"it exited (status {process.wait()})")
        try:
            reply = json.loads(answer)
        except ValueError:
            raise FrontError(f"it answered {answer[:200]!r}, not JSON") from None
        if not reply.get("ok"):
            raise FrontError(f"it refused {request['op']}: {reply.get('error')}")


def _relay(stream: IO[bytes]) -> None:
    """The program's own lines (its refusals: ``Allocate refused: ...``) into the agent's log."""
    with stream:
        for line in stream:
            log.warning("%s", line.decode(errors="replace").rstrip())


def allocate_table(
    resource: Resource,
    section: DevicePluginSection,
    unhealthy: Callable[[PluginDevice], str | None],
    mps: Callable[[str], MpsPaths | None],
) -> AllocateTable:
    """Everything Allocate reads, for one resource, as the front takes it (front/allocate.go)."""
    strategies = section.strategies
    not_cdi_only = not all(s.is_cdi for s in strategies)
    uuids = list(dict.fromkeys(d.uuid for d in resource.devices))
    own = DeviceListStrategy.CDI in strategies
    mps_paths = {
        gpu: paths
        for gpu in dict.fromkeys(d.gpu_uuid for d in resource.devices)
        if (paths := mps(gpu)) is not None
    }
    return {
        "resource": resource.name,
        "devices": {
            d.id: {
                "uuid": d.uuid,
                "gpu_uuid": d.gpu_uuid,
                "shared": d.shared,
                "strict": d.shared and d.sharing.fail_requests_greater_than_one,
                "mps": d.sharing.mode is SharingMode.MPS,
                "unhealthy": unhealthy(d),
                "minor": d.minor_number,
            }
            for d in resource.devices
        },
        "visible_devices_env": not_cdi_only and DeviceListStrategy.ENVVAR in strategies,
        "volume_mounts": not_cdi_only and DeviceListStrategy.VOLUME_MOUNTS in strategies,
        "cdi_kind": section.cdi_kind,
        "cdi_annotation_prefix": section.cdi_annotation_prefix
        if DeviceListStrategy.CDI_ANNOTATIONS in strategies
        else None,
        "cdi_cri": DeviceListStrategy.CDI_CRI in strategies,
        "own_cdi_names": dict(zip(uuids, device_names(section, resource.name, uuids), strict=True))
        if own
        else None,
        "dev_root": str(section.dev_root) if section.pass_device_specs else None,
        "mps": {
            gpu: {
                "container_pipe_dir": str(p.container_pipe_dir),
                "host_pipe_dir": str(p.host_pipe_dir),
                "host_shm_dir": str(p.host_shm_dir),
            }
            for gpu, p in mps_paths.items()
        },
    }
