"""One agent per node: a second one, a taken port or an unusable state directory end the start
in one line with exit 2, and never touch what the first agent serves."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodeagent.agent.daemon import Agent, restart_needed
from nodeagent.config.schema import load_agent_config
from nodeagent.testing.waiting import wait_until

TIMEOUT_S = 30  # a second agent that does not exit is the bug: the test must not hang on it


def write_config(
    path: Path, state: Path, kubelet: Path, *, metrics: str | None = None, plugin: bool = True
) -> Path:
    metrics_line = (
        f"metrics: {{pod_attribution: false, address: '{metrics}'}}\n"
        if metrics
        else "metrics: {enabled: false}\n"
    )
    path.write_text(
        f"version: v1\nstate_dir: {state}\nsampler: {{interval_s: 0.1}}\n"
        f"device_plugin: {{enabled: {str(plugin).lower()}, kubelet_dir: '{kubelet}'}}\n"
        f"{metrics_line}health: {{enabled: false}}\nmig: {{enabled: false}}\n"
    )
    return path


def run_agent(config: Path, sim: Path, state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    where = ["--simulate", "t4", "--state-dir", str(sim), "--agent-state-dir", str(state)]
    return subprocess.run(
        [sys.executable, "-m", "nodeagent.cli.main", "run", "-c", str(config), *where],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def first_agent(make_node, sim_state_dir: Path, tmp_path: Path):
    """An agent serving the device plugin in ``tmp_path/kubelet`` from ``tmp_path/state``."""
    config = write_config(tmp_path / "a.yaml", tmp_path / "state", tmp_path / "kubelet")
    agent = Agent(load_agent_config(config, environ={}), make_node("t4"), config_path=config)
    agent.start()
    assert agent.wait_ready(20)
    yield agent
    assert agent.shutdown() == 0


def sockets(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in directory.iterdir() if p.is_socket()}


@pytest.mark.parametrize(
    "same",
    [pytest.param("state", id="same-state-dir"), pytest.param("kubelet", id="same-kubelet-dir")],
)
def test_a_second_agent_exits_2_naming_the_first_and_leaves_its_sockets(
    first_agent: Agent, sim_state_dir: Path, tmp_path: Path, same: str
) -> None:
    kubelet = tmp_path / "kubelet"
    served = sockets(kubelet)
    assert served, "the first agent serves no socket"
    state = tmp_path / "state" if same == "state" else tmp_path / "other-state"
    other_kubelet = kubelet if same == "kubelet" else tmp_path / "other-kubelet"
    config = write_config(tmp_path / "b.yaml", state, other_kubelet)
    result = run_agent(config, sim_state_dir, state)
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert f"process {os.getpid()}" in line
    time.sleep(0.5)  # the first agent's watch loop would have re-served a deleted socket by now
    assert sockets(kubelet) == served


def test_a_taken_metrics_port_ends_the_start_in_one_line(
    sim_state_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(
            tmp_path / "a.yaml",
            tmp_path / "state",
            tmp_path / "kubelet",
            metrics=f"127.0.0.1:{port}",
        )
        started = time.monotonic()
        result = run_agent(config, sim_state_dir, tmp_path / "state")
    assert result.returncode == 2
    assert time.monotonic() - started < TIMEOUT_S
    line = one_error_line(result.stderr)
    assert "metrics" in line
    assert "in use" in line.lower()
    assert "crashed" not in result.stderr  # no component ever started
    assert not (tmp_path / "kubelet").exists() or not sockets(tmp_path / "kubelet")


def unwritable(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        return Path("/sys/nodeagent-test-state")  # root writes through mode bits, not sysfs
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o500)
    return parent / "state"


@pytest.mark.parametrize("kind", ["under-a-file", "not-writable"])
def test_an_unusable_state_dir_is_one_line_and_exit_2(
    sim_state_dir: Path, tmp_path: Path, kind: str
) -> None:
    if kind == "under-a-file":
        (tmp_path / "file").write_text("x")
        state = tmp_path / "file" / "state"
    else:
        state = unwritable(tmp_path)
    config = write_config(tmp_path / "a.yaml", state, tmp_path / "kubelet", plugin=False)
    result = run_agent(config, sim_state_dir, state)
    assert result.returncode == 2, result.stderr
    assert str(state) in one_error_line(result.stderr)


def test_stale_temporary_files_of_a_killed_agent_are_removed_at_start(
    make_node, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    (state / "health").mkdir(parents=True)
    stale = state / "health" / ".status.json.abc123.tmp"
    stale.write_text("{")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = state / ".mig-status.json.def456.tmp"
    fresh.write_text("{")  # a write in progress elsewhere: too young to be stale
    config = write_config(tmp_path / "a.yaml", state, tmp_path / "kubelet", plugin=False)
    agent = Agent(load_agent_config(config, environ={}), make_node("t4"), config_path=config)
    agent.start()
    try:
        assert not stale.exists()
        assert fresh.exists()
    finally:
        agent.shutdown()


def test_sighup_names_the_changes_that_need_a_restart(
    make_node, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(
        tmp_path / "a.yaml", tmp_path / "state", tmp_path / "k", metrics="127.0.0.1:0"
    )
    old = load_agent_config(path, environ={})
    text = path.read_text().replace("interval_s: 0.1", "interval_s: 0.2")
    path.write_text(text.replace("127.0.0.1:0", "127.0.0.1:1"))
    new = load_agent_config(path, environ={})
    ignored = restart_needed(old, new)
    assert ignored == ["metrics.address ('127.0.0.1:0' -> '127.0.0.1:1')"]
    agent = Agent(old, make_node("t4"), config_path=path)
    with caplog.at_level(logging.WARNING, logger="nodeagent.agent.daemon"):
        assert agent.reload()
    assert any("metrics.address" in r.getMessage() for r in caplog.records)
    assert agent.config.sampler.interval_s == 0.2


def test_a_bad_layout_file_leaves_the_agent_ready(make_node, tmp_path: Path) -> None:
    import urllib.request

    bad = tmp_path / "layouts.yaml"
    bad.write_bytes(b"version: v1\nmig-configs:\n  all-1g\xff: []\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "a.yaml"
    config.write_text(
        f"version: v1\nstate_dir: {tmp_path / 'state'}\nsampler: {{interval_s: 0.1}}\n"
        f"mig: {{layout_file: '{bad}'}}\npools:\n  default: {{mig_layout: all-1g}}\n"
        f"metrics: {{pod_attribution: false, address: '127.0.0.1:{port}'}}\n"
        "device_plugin: {enabled: false}\nhealth: {enabled: false}\n"
    )
    agent = Agent(
        load_agent_config(config, environ={}),
        make_node("dgx-a100"),
        config_path=config,
        mig_lock_file=tmp_path / "mig.lock",
    )
    agent.start()
    try:
        assert agent.wait_ready(20), [c.name for c in agent.components if not c.ready]
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz").status == 200
        series = 'nodeagent_mig_layout_applied{layout="all-1g"'

        def exported() -> bool:  # rendered with the next snapshot after the reconciler's round
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            return series in metrics

        assert wait_until(exported, 10.0)
        assert agent.restarts["mig-reconciler"] == 0  # reported, not crash-looping
    finally:
        agent.shutdown()


def test_kubernetes_on_without_usable_credentials_is_one_line(tmp_path: Path) -> None:
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("garbage\n")
    config = tmp_path / "agent.yaml"
    config.write_text(
        "version: v1\nmetrics: {enabled: false}\nmig: {enabled: false}\n"
        f"device_plugin: {{kubelet_dir: '{tmp_path / 'kubelet'}'}}\n"
        f"kubernetes: {{enabled: true, kubeconfig: '{garbage}'}}\n"
    )
    result = run_agent(config, tmp_path / "sim", tmp_path / "state")
    assert result.returncode == 2, result.stderr
    assert one_error_line(result.stderr) == (
        f"error: kubeconfig {garbage} cannot be used: not a kubeconfig (TypeError); "
        "set kubernetes.kubeconfig or kubernetes.api_server"
    )
    assert "hint: or set kubernetes.enabled: false" in result.stderr


@pytest.mark.parametrize(
    ("section", "says"),
    [
        (
            "dra: {enabled: true, registry_dir: /proc/no-such/registry}",
            "error: dra: /proc/no-such: No such file or directory",
        ),
        (
            "metrics: {address: '127.0.0.1:0', tls_cert_file: CERT, tls_key_file: CERT}",
            "error: metrics: CERT: no such file",
        ),
    ],
)
def test_a_path_a_component_cannot_use_is_one_line_naming_it(
    tmp_path: Path, section: str, says: str
) -> None:
    cert = str(tmp_path / "missing.pem")
    config = tmp_path / "agent.yaml"
    config.write_text(
        "version: v1\nmig: {enabled: false}\nhealth: {enabled: false}\n"
        f"device_plugin: {{kubelet_dir: '{tmp_path / 'kubelet'}'}}\n"
        + ("" if section.startswith("metrics") else "metrics: {enabled: false}\n")
        + section.replace("CERT", cert)
        + "\n"
    )
    result = run_agent(config, tmp_path / "sim", tmp_path / "state")
    assert result.returncode == 2, result.stderr
    assert one_error_line(result.stderr) == says.replace("CERT", cert)
    assert "hint: fix that path in the config" in result.stderr
