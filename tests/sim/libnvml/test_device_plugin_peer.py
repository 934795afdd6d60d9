"""NVIDIA's device plugin and nodeagent's on the same simulated node and test kubelet.

Under each MIG strategy (none, single, mixed) and on MIG layouts of both kinds (one profile
everywhere, mixed profiles), both plugins must advertise the same resource names with the same
device counts, or both refuse to start (``single`` on a mixed layout). NVIDIA's runs unmodified
in ``nodeagent sim exec --driver`` over the simulated libnvidia-ml.so.1; its fixed socket
directory (/var/lib/kubelet/device-plugins) is a link to the test kubelet's, made inside the
private namespace. Needs root and ``make nvidia-peers``; with ``CI=true`` their absence fails.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from nodeagent.agent.backend import open_node
from nodeagent.config.schema import load_agent_config
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.kubelet import TestKubelet
from nodeagent_device_plugin.component import build

REPO = Path(__file__).resolve().parents[3]
NODEAGENT = Path(sys.executable).parent / "nodeagent"
REFUSED = "refused"
Advertised = dict[str, int] | str  # resource -> device count, or REFUSED


def _settled(kubelet: TestKubelet, timeout_s: float) -> dict[str, int]:
    """Resource -> device count once every registered plugin has listed its devices."""
    kubelet.wait(
        lambda: bool(kubelet.plugins) and all(v.devices for v in kubelet.plugins.values()),
        timeout_s,
    )
    time.sleep(0.5)  # a plugin registers its resources one after the other
    return {name: len(view.devices) for name, view in kubelet.plugins.items()}


def _nvidias(binary: Path, env: dict[str, str], strategy: str, directory: Path) -> Advertised:
    kubelet = TestKubelet(directory)
    kubelet.start()
    script = (
        f"mount -t tmpfs none /var/lib && mkdir -p /var/lib/kubelet && "
        f"ln -s {directory} /var/lib/kubelet/device-plugins && "
        f"exec {binary} --kubelet-socket {kubelet.socket} --mig-strategy {strategy} "
        f'--driver-root "$NODEAGENT_SIM_DRIVER_ROOT" --fail-on-init-error=true'
    )
    plugin = subprocess.Popen(
        [str(NODEAGENT), "sim", "exec", "--driver", "--", "sh", "-c", script],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and plugin.poll() is None and not kubelet.plugins:
            time.sleep(0.1)
        if plugin.poll() is not None:
            return REFUSED
        return _settled(kubelet, 10)
    finally:
        plugin.terminate()
        plugin.wait(10)
        kubelet.stop()


def _nodeagents(state: Path, preset: str, strategy: str, directory: Path) -> Advertised:
    node = open_node(simulate=preset, state_dir=state)
    snapshots = SnapshotStore()
    snapshots.publish(node.snapshot())
    config = load_agent_config(
        None,
        environ={},
        overrides={"device_plugin": {"mig_strategy": strategy, "kubelet_dir": str(directory)}},
    )
    component = build(config, snapshots, None)
    assert component is not None
    kubelet = TestKubelet(directory)
    kubelet.start()
    stop = threading.Event()
    refusals = _Refusals()
    component_log = logging.getLogger("nodeagent_device_plugin.component")
    component_log.addHandler(refusals)
    thread = threading.Thread(target=component.run, args=(stop,), daemon=True)
    thread.start()
    try:
        kubelet.wait(lambda: bool(kubelet.plugins) or bool(refusals.lines), 15)
        return REFUSED if refusals.lines else _settled(kubelet, 10)
    finally:
        stop.set()
        thread.join(10)
        component_log.removeHandler(refusals)
        kubelet.stop()
        node.close()


class _Refusals(logging.Handler):
    """The component's "refuses to start" lines: it says so once and waits for a new layout."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "refuses to start" in record.getMessage():
            self.lines.append(record.getMessage())


@pytest.mark.parametrize(
    ("preset", "layout"),
    [("dgx-h100", None), ("a30x4", "all-1g"), ("a30x4", "all-balanced")],
)
@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_both_plugins_advertise_the_same_resources(
    preset: str,
    layout: str | None,
    strategy: str,
    device_plugin: Path,
    short_dir: Path,
) -> None:
    state = short_dir / "node"
    env = {**os.environ, "NODEAGENT_SIM_STATE": str(state), "NODEAGENT_SIMULATE": preset}
    if layout is not None:
        subprocess.run(
            [str(NODEAGENT), "mig", "apply", "-c", layout, "--yes"],
            env=env,
            capture_output=True,
            check=True,
        )
    else:
        subprocess.run([str(NODEAGENT), "gpus"], env=env, capture_output=True, check=True)
    theirs = _nvidias(device_plugin, env, strategy, short_dir / "nvidia")
    ours = _nodeagents(state, preset, strategy, short_dir / "nodeagent")
    assert ours == theirs
    if layout is None or strategy != "single" or layout == "all-1g":
        assert theirs != REFUSED
