"""sd_notify end to end: ``nodeagent run`` on a simulated node talks to a real notify socket.

What systemd relies on for ``Type=notify`` with ``WatchdogSec=``: READY=1 once the components are
up, WATCHDOG=1 keep-alives while healthy (and only to the process systemd meant), STOPPING=1 and
exit status 0 on SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.notify import NotifyListener, free_port

NODEAGENT = str(Path(sys.executable).parent / "nodeagent")


def start_agent(
    tmp_path: Path, listener: NotifyListener, extra_env: dict[str, str]
) -> subprocess.Popen[bytes]:
    (tmp_path / "kubelet").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODEAGENT_", "WATCHDOG_"))}
    # No kubelet here: the device plugin is off so READY means "sampler and health are up".
    env.update(
        {
            "NOTIFY_SOCKET": listener.address,
            "NODEAGENT_DEVICE_PLUGIN_ENABLED": "false",
            **extra_env,
        }
    )
    return subprocess.Popen(
        [
            NODEAGENT,
            "run",
            "--simulate",
            "dgx-h100",
            "--state-dir",
            str(tmp_path / "sim"),
            "--kubelet-dir",
            str(tmp_path / "kubelet"),
            "--metrics-address",
            f"127.0.0.1:{free_port()}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError("agent did not stop within 20 s of SIGTERM") from None
    return proc.returncode, err.decode(errors="replace")


@pytest.mark.parametrize(
    "abstract", [pytest.param(False, id="path-socket"), pytest.param(True, id="abstract-socket")]
)
def test_ready_watchdog_and_stopping_over_a_real_socket(tmp_path: Path, abstract: bool) -> None:
    with NotifyListener(abstract=abstract) as listener:
        proc = start_agent(tmp_path, listener, {"WATCHDOG_USEC": "1000000"})
        try:
            listener.wait_for("READY", "1", timeout_s=60, proc=proc)
            # Keep-alives follow READY while the sampler runs (every WATCHDOG_USEC / 2).
            listener.wait_for("WATCHDOG", "1", timeout_s=10, proc=proc)
            listener.wait_for("WATCHDOG", "1", timeout_s=10, proc=proc)
        finally:
            code, err = stop(proc)
        listener.wait_for("STOPPING", "1", timeout_s=5)
    assert code == 0, err


def test_no_watchdog_for_another_process(tmp_path: Path) -> None:
    # WATCHDOG_PID names the process systemd watches; a child that inherited the variables
    # (a hook, the MPS daemon's parent shell) must not ping on its behalf.
    with NotifyListener() as listener:
        proc = start_agent(tmp_path, listener, {"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"})
        try:
            listener.wait_for("READY", "1", timeout_s=60, proc=proc)
            with pytest.raises(AssertionError, match="no WATCHDOG=1"):
                listener.wait_for("WATCHDOG", "1", timeout_s=1.5, proc=proc)
        finally:
            code, err = stop(proc)
    assert code == 0, err
