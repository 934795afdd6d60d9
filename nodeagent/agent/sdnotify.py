"""systemd's sd_notify protocol: READY, STATUS, WATCHDOG and STOPPING datagrams.

Speaks the protocol directly over the unix datagram socket named by ``NOTIFY_SOCKET`` (an
abstract socket when it starts with ``@``), so there is no dependency on libsystemd.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


class Notifier:
    """Sends sd_notify messages when ``NOTIFY_SOCKET`` is set; does nothing otherwise."""

    def __init__(self, address: str | None = None) -> None:
        self.address = address if address is not None else os.environ.get("NOTIFY_SOCKET")
        self._sock: socket.socket | None = None
        if self.address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        """Whether a notify socket was given."""
        return self._sock is not None

    def watchdog_interval_s(self) -> float | None:
        """Half the watchdog timeout systemd asked for (``WATCHDOG_USEC``), or None."""
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        if not usec or (pid and pid != str(os.getpid())):
            return None
        try:
            return int(usec) / 2_000_000
        except ValueError:
            return None

    def send(self, *fields: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; False when it could not be delivered."""
        if self._sock is None or not self.address:
            return False
        target = self.address
        if target.startswith("@"):
            target = "\0" + target[1:]
        try:
            self._sock.sendto("\n".join(fields).encode(), target)
        except OSError as exc:
            log.warning("sd_notify to %s failed: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str = "") -> bool:
        """Tell systemd start-up finished."""
        return self.send("READY=1", f"STATUS={status}") if status else self.send("READY=1")

    def watchdog(self) -> bool:
        """Keep-alive ping for ``WatchdogSec=``."""
        return self.send("WATCHDOG=1")

    def status(self, text: str) -> bool:
        """Free-form status shown by ``systemctl status``."""
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        """Tell systemd the service is shutting down."""
        return self.send("STOPPING=1")

    def reloading(self) -> bool:
        """Tell systemd a reload started (READY=1 ends it)."""
        return self.send("RELOADING=1")

    def close(self) -> None:
        """Close the socket."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
