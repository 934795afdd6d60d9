"""nodeagent's own hardware suite through the real ``pynvml`` path, on a simulated node.

``pytest -m nvml tests/hardware`` and ``tests/hardware/record.py`` run with nvidia-ml-py loading
the simulated ``libnvidia-ml.so.1`` (``LD_LIBRARY_PATH``), as they would on a lent GPU: the
ctypes path of a real node (structs, versioned symbols, error codes) runs before any GPU does.
The record taken through the C library must equal the one the Python simulator gives for the
same node. With ``CI=true`` a missing compiler or Go fails instead of skipping.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.sim.libnvml import builder
from nodeagent.sim.libnvml.bridge import ENV_STATE

REPO = Path(__file__).resolve().parents[3]
NODEAGENT = Path(sys.executable).parent / "nodeagent"

_PYTHON_RECORD = """
import json, sys
from pathlib import Path
from nodeagent.agent.backend import open_node
from tests.hardware.record import collect
node = open_node(simulate=sys.argv[1], state_dir=Path(sys.argv[2]))
try:
    print(json.dumps(collect(node)))
finally:
    node.close()
"""


@pytest.fixture(scope="module")
def libdir() -> Path:
    if shutil.which("gcc") is None or shutil.which("go") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("gcc or go is missing in CI: .ci/run needs both for `make libnvml`")
        pytest.skip("gcc or go is not installed")
    return builder.build()


def _node(tmp_path: Path, preset: str) -> Path:
    state = tmp_path / "node"
    env = {**os.environ, "NODEAGENT_SIM_STATE": str(state), "NODEAGENT_SIMULATE": preset}
    run = [str(NODEAGENT), "mig", "apply", "--yes"]
    subprocess.run([*run, "-c", "all-enabled"], env=env, check=True, capture_output=True)
    # One instance of the largest profile per GPU: every MIG check of the suite has an
    # instance to look at.
    shown = json.loads(
        subprocess.run(
            [str(NODEAGENT), "mig", "show", "--json"], env=env, check=True, capture_output=True
        ).stdout
    )
    largest = shown["gpus"][0]["profiles"][0]
    layout = tmp_path / "layout.yaml"
    layout.write_text(
        "version: v1\nmig-configs:\n  one:\n    - devices: all\n      mig-enabled: true\n"
        f"      mig-devices:\n        {largest}: 1\n"
    )
    subprocess.run([*run, "-f", str(layout), "-c", "one"], env=env, check=True, capture_output=True)
    return state


def _through_the_library(libdir: Path, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_SIM")}
    return env | {ENV_STATE: str(state), "LD_LIBRARY_PATH": str(libdir), "PYTHONPATH": str(REPO)}


# gh200: one MIG GPU of the Hopper generation (GPM too). a30x4: several MIG GPUs of one model,
# each rebuilt on a scratch node of its own by the remaining-capacity check.
@pytest.mark.parametrize("preset", ["gh200", "a30x4"])
def test_hardware_suite_passes_through_the_c_library(
    preset: str, libdir: Path, tmp_path: Path
) -> None:
    state = _node(tmp_path, preset)
    env = _through_the_library(libdir, state)
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "nvml",
            str(REPO / "tests" / "hardware"),
        ],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    summary = suite.stdout.strip().splitlines()[-1]
    assert suite.returncode == 0, suite.stdout[-3000:]
    assert "passed" in summary
    assert "failed" not in summary

    record = subprocess.run(
        [sys.executable, str(REPO / "tests" / "hardware" / "record.py")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    python = subprocess.run(
        [sys.executable, "-c", _PYTHON_RECORD, preset, str(state)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    through_c = json.loads(record.stdout)
    assert through_c["gpus"]
    assert through_c["gpus"][0]["mig"]["instances"]
    assert through_c == json.loads(python.stdout)
