"""NVIDIA's programs the fidelity tests run as peers (built by `make nvidia-peers`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _peer(program: str) -> Path:
    """The built program, or a failure under CI and a skip elsewhere; root is needed too."""
    built = subprocess.run(
        ["bash", str(REPO / "hack/nvidia/build.sh"), "--dir"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    found = Path(built) / "bin" / program
    if not found.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{program} is missing in CI: .ci/run runs `make nvidia-peers`")
        pytest.skip(f"{program} is not built: make nvidia-peers")
    if os.geteuid() != 0:
        pytest.skip("a simulated driver needs root (private mount namespace, mknod)")
    return found


@pytest.fixture(scope="module")
def nvidia_ctk() -> Path:
    return _peer("nvidia-ctk")


@pytest.fixture(scope="module")
def device_plugin() -> Path:
    return _peer("nvidia-device-plugin")
