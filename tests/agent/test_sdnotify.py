"""sd_notify against a real unix datagram socket."""

from __future__ import annotations

import pytest

from nodeagent.agent.sdnotify import Notifier


def test_messages_arrive_as_datagrams(notify_socket) -> None:
    path, sock = notify_socket
    notifier = Notifier(str(path))
    assert notifier.ready("3 components running")
    assert sock.recv(4096) == b"READY=1\nSTATUS=3 components running"
    assert notifier.watchdog()
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    notifier.close()


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    assert notifier.ready() is False


def test_watchdog_interval_is_half_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "20000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert Notifier("").watchdog_interval_s() == 10.0
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process
    assert Notifier("").watchdog_interval_s() is None
