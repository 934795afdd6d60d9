"""The process lock: refuses a second holder naming the first, survives kill -9 and deletion."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodeagent.runtime.lock import LockHeldError, ProcessLock, is_held, read_holder

HOLD = """
import sys, time
from pathlib import Path
from nodeagent.runtime.lock import ProcessLock
lock = ProcessLock(Path(sys.argv[1]), "the test")
lock.acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "x.lock"
    first = ProcessLock(path, "the thing")
    first.acquire()
    assert read_holder(path) == os.getpid()
    assert is_held(path)
    second = ProcessLock(path, "the thing")
    with pytest.raises(LockHeldError) as caught:
        second.acquire(timeout_s=0.1)
    assert caught.value.pid == os.getpid()
    assert f"process {os.getpid()}" in str(caught.value)
    assert "the thing" in str(caught.value)
    assert read_holder(path) == os.getpid(), "a refused try must not erase the holder's PID"
    first.release()
    assert not is_held(path)
    second.acquire()
    assert second.held


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(LockHeldError) as caught:
            ProcessLock(path, "x").acquire()
        assert caught.value.pid == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        lock = ProcessLock(path, "x")
        lock.acquire(timeout_s=2)
        assert read_holder(path) == os.getpid()
        lock.release()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_deleted_lock_file_is_locked_again_by_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    lock = ProcessLock(path, "x")
    lock.acquire()
    path.unlink()  # what a kubelet cleaning its directory does
    assert not lock.intact()
    lock.renew()
    assert lock.intact()
    with pytest.raises(LockHeldError):
        ProcessLock(path, "x").acquire()


def test_waiting_acquire_gets_the_lock_when_released(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    first = ProcessLock(path, "x")
    first.acquire()
    waited: list[float] = []
    second = ProcessLock(path, "x")

    def sleep(seconds: float) -> None:
        waited.append(seconds)
        first.release()  # the holder lets go while the second waits

    second.acquire(timeout_s=5, sleep=sleep, clock=time.monotonic)
    assert second.held
    assert waited
