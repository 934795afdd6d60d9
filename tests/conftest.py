"""Shared fixtures: simulated GPU nodes on private state directories.

Every test runs with ``NODEAGENT_SIMULATE`` unset and ``NODEAGENT_SIM_STATE`` pointing into its
own temporary directory, so no test reads the developer's environment or touches the user's real
simulator state.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nodeagent.agent.backend import open_node
from nodeagent.gpu.node import GpuNode

# The real control plane (fixtures control_plane, kube_ns, kubelets; marker kube).
pytest_plugins = ["nodeagent.testing.kube.pytest_plugin"]


@pytest.fixture(autouse=True)
def _isolated_gpu_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NODEAGENT_SIMULATE", raising=False)
    monkeypatch.setenv("NODEAGENT_SIM_STATE", str(tmp_path / "default-sim-state"))


@pytest.fixture(scope="session")
def front_program() -> Path:
    """nodeagent-device-plugin-front (`make device-plugin-front`); CI fails without it."""
    built = subprocess.run(
        ["bash", str(Path(__file__).parents[1] / "device_plugin/front/build.sh"), "--path"],
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(built.stdout.strip())
    if not path.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("the device plugin front is missing in CI: .ci/run builds it")
        pytest.skip("the device plugin front is not built: make device-plugin-front")
    return path


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for unix sockets: their paths are limited to 107 bytes, and pytest's
    tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="na-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sim_state_dir(tmp_path: Path) -> Path:
    """The state directory ``make_node`` uses by default (one preset per directory)."""
    return tmp_path / "sim-state"


@pytest.fixture
def make_node(sim_state_dir: Path) -> Iterator[Callable[..., GpuNode]]:
    """Factory: ``make_node("dgx-h100")`` opens a simulated node on ``sim_state_dir``.

    Pass ``state_dir=`` to open a second preset (or a second handle) in the same test. Every
    node made is closed at the end of the test.
    """
    opened: list[GpuNode] = []

    def make(preset: str, state_dir: Path | None = None) -> GpuNode:
        node = open_node(simulate=preset, state_dir=state_dir or sim_state_dir)
        opened.append(node)
        return node

    yield make
    for node in opened:
        node.close()
