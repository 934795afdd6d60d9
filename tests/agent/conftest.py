"""Fixtures shared by the agent tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    """A bound unix datagram socket standing in for systemd's NOTIFY_SOCKET."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(20)  # long enough for an agent started as a subprocess to get ready
    yield path, sock
    sock.close()
