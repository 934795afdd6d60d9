"""A stand-in for nvidia-cuda-mps-control that speaks its stdin protocol (tests only).

``-d`` forks a daemon that listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (a unix socket),
writes its PID to ``nvidia-cuda-mps-control.pid`` there and logs commands to
``$CUDA_MPS_LOG_DIRECTORY/control.log``. Without ``-d``, commands read from stdin are sent to
the daemon one per line and the answers printed; exit status 1 when no daemon answers, as the
real client does. ``quit`` stops the daemon.

:func:`install` writes an executable ``nvidia-cuda-mps-control`` that runs it.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULTS = {"active_thread_percentage": "100"}


def _daemon(pipe_dir: str, log_dir: str) -> None:
    path = os.path.join(pipe_dir, "control")
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    with open(os.path.join(pipe_dir, PID_FILE), "w") as f:
        f.write(str(os.getpid()))
    log = open(os.path.join(log_dir, "control.log"), "a", buffering=1)  # noqa: SIM115 - lives as long as the daemon
    while True:
        conn, _ = server.accept()
        with conn:
            command = conn.makefile().readline().strip()
            log.write(command + "\n")
            words = command.split()
            answer = ""
            if words[:1] == ["get_default_active_thread_percentage"]:
                answer = DEFAULTS["active_thread_percentage"]
            elif words[:1] == ["set_default_active_thread_percentage"] and len(words) == 2:
                DEFAULTS["active_thread_percentage"] = words[1]
            elif words[:1] == ["set_default_device_pinned_mem_limit"] and len(words) == 3:
                DEFAULTS["pinned_" + words[1]] = words[2]
            elif words[:1] == ["quit"]:
                conn.sendall(b"\n")
                os.unlink(path)
                os._exit(0)
            else:
                answer = "unknown command"
            conn.sendall((answer + "\n").encode())


def install(directory: Path) -> Path:
    """An executable stand-in ``<directory>/nvidia-cuda-mps-control``; its path."""
    wrapper = directory / "nvidia-cuda-mps-control"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).resolve()} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def daemon_pid(pipe_dir: Path) -> int:
    """The PID of the daemon listening in ``pipe_dir`` (from its PID file)."""
    return int((pipe_dir / PID_FILE).read_text())


def running(pid: int) -> bool:
    """Whether a process ``pid`` exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> int:
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    log_dir = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    if sys.argv[1:] == ["-d"]:
        if os.fork() > 0:
            return 0  # the real binary daemonizes too: the launcher exits at once
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _daemon(pipe_dir, log_dir)
        return 0
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            client.connect(os.path.join(pipe_dir, "control"))
        except OSError:
            print("Cannot find MPS control daemon process", file=sys.stderr)
            return 1
        with client:
            client.sendall(line.encode())
            reply = client.makefile().readline().strip()
        if reply == "unknown command":
            print(reply, file=sys.stderr)
            return 1
        if reply:
            print(reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
