"""A real sd_notify listener: the unix datagram socket systemd would hold for a Type=notify unit."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType


class NotifyListener:
    """Binds a datagram socket (a path, or an abstract name) and records every message."""

    def __init__(self, abstract: bool = False) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._dir: str | None = None
        if abstract:
            name = f"nodeagent-test-{os.getpid()}-{id(self)}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            # A short directory: socket paths are limited to 107 bytes.
            self._dir = tempfile.mkdtemp(prefix="na-notify-", dir="/tmp")
            path = str(Path(self._dir) / "notify")
            self.sock.bind(path)
            self.address = path
        self.messages: list[dict[str, str]] = []

    def wait_for(
        self, key: str, value: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None
    ) -> dict[str, str]:
        """Receive until a message sets ``key=value``; fail with what arrived on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in self.messages:
                if message.get(key) == value:
                    self.messages.remove(message)
                    return message
            if proc is not None and proc.poll() is not None:
                self._drain(0.2)
                if any(m.get(key) == value for m in self.messages):
                    continue
                raise AssertionError(
                    f"agent exited with {proc.returncode} before {key}={value}; "
                    f"received {self.messages}"
                )
            self._drain(min(0.5, max(deadline - time.monotonic(), 0.01)))
        raise AssertionError(f"no {key}={value} within {timeout_s}s; received {self.messages}")

    def _drain(self, timeout_s: float) -> None:
        self.sock.settimeout(timeout_s)
        try:
            while True:
                data = self.sock.recv(4096)
                fields = dict(
                    line.split("=", 1) for line in data.decode().splitlines() if "=" in line
                )
                self.messages.append(fields)
                self.sock.settimeout(0.0)
        except (TimeoutError, BlockingIOError):
            return

    def close(self) -> None:
        """Close the socket and remove its directory."""
        self.sock.close()
        if self._dir:
            for child in Path(self._dir).iterdir():
                child.unlink()
            os.rmdir(self._dir)

    def __enter__(self) -> NotifyListener:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
