"""The agent process: components start, READY, reload on request, bounded stop."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from nodeagent.agent.daemon import Agent
from nodeagent.config.schema import load_agent_config


def minimal_config(tmp_path: Path, interval_s: float = 0.05):
    path = tmp_path / "agent.yaml"
    path.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nsampler: {{interval_s: {interval_s}}}\n"
        "metrics: {enabled: false}\ndevice_plugin: {enabled: false}\n"
        "health: {enabled: false}\n"
    )
    return path


def test_sampler_publishes_snapshots_and_reload_keeps_a_good_config(make_node, tmp_path: Path):
    path = minimal_config(tmp_path)
    agent = Agent(load_agent_config(path, environ={}), make_node("dgx-h100"), config_path=path)
    agent.start()
    try:
        assert agent.wait_ready(5)
        first = agent.snapshots.generation
        snapshot = agent.snapshots.wait_newer(first, timeout_s=5)
        assert snapshot is not None
        assert len(snapshot.gpus) == 8

        path.write_text(path.read_text().replace("interval_s: 0.05", "interval_s: 0.2"))
        assert agent.reload()
        assert agent.config.sampler.interval_s == 0.2

        path.write_text("version: v1\nsampler: {interval: 1}\n")  # broken: unknown field
        assert not agent.reload()
        assert agent.config.sampler.interval_s == 0.2  # the running config stays
    finally:
        assert agent.shutdown() == 0


def test_run_reports_ready_and_watchdog_then_stops_on_sigterm(tmp_path: Path, notify_socket):
    path, sock = notify_socket
    env = dict(os.environ)
    env.update(
        NOTIFY_SOCKET=str(path),
        WATCHDOG_USEC="400000",  # ping every 0.2 s
        NODEAGENT_METRICS_ENABLED="false",
        NODEAGENT_DEVICE_PLUGIN_ENABLED="false",
        NODEAGENT_HEALTH_ENABLED="false",
    )
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodeagent.cli.main",
            "run",
            "--simulate",
            "t4",
            "--state-dir",
            str(tmp_path / "sim"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        messages = [sock.recv(4096).decode()]
        assert messages[0].startswith("READY=1")
        deadline = time.monotonic() + 10
        while "WATCHDOG=1" not in messages and time.monotonic() < deadline:
            messages.append(sock.recv(4096).decode())
        assert "WATCHDOG=1" in messages
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        rest = []
        sock.settimeout(1)
        try:
            while True:
                rest.append(sock.recv(4096).decode())
        except TimeoutError:
            pass
        assert "STOPPING=1" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_alive_turns_false_when_sampling_wedges(make_node, tmp_path: Path) -> None:
    path = minimal_config(tmp_path, interval_s=0.05)
    node = make_node("t4")
    agent = Agent(load_agent_config(path, environ={}), node, config_path=path)
    agent.start()
    release = threading.Event()
    try:
        assert agent.wait_ready(5)
        assert agent.alive()
        # NVML hangs: the sampler's next call never returns, its thread stays alive.
        real_snapshot = node.snapshot
        wedged = threading.Event()

        def hang():
            wedged.set()
            release.wait(30)
            return real_snapshot()

        node.snapshot = hang
        assert wedged.wait(5)
        latest = agent.snapshots.latest
        assert latest is not None
        # Time passes: the newest snapshot is now 30 s old.
        agent.snapshots.publish(dataclasses.replace(latest, timestamp_s=time.time() - 30))
        assert agent.supervisor.alive()  # every thread still runs...
        assert not agent.alive()  # ...but the agent is wedged
    finally:
        release.set()
        agent.shutdown()
