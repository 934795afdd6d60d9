"""`nodeagent gpus` and `nodeagent topo` as a user runs them: real processes, real exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nodeagent.sim.control import SimControl

GIB = 1024**3


def nodeagent(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "nodeagent.cli.main", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
        check=False,
    )


def test_gpus_json_lists_eight_h100_with_their_memory(tmp_path: Path) -> None:
    env = {"NODEAGENT_SIMULATE": "dgx-h100", "NODEAGENT_SIM_STATE": str(tmp_path)}
    result = nodeagent("gpus", "--json", env=env)
    assert result.returncode == 0, result.stderr
    gpus = json.loads(result.stdout)
    assert [g["index"] for g in gpus] == list(range(8))
    assert {g["name"] for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {g["memory_total_bytes"] for g in gpus} == {81559 * 1024 * 1024}
    required = {"uuid", "mig_capable", "mig_enabled", "mig_pending", "numa_node", "driver_version"}
    assert required <= set(gpus[0])
    assert len({g["uuid"] for g in gpus}) == 8


@pytest.mark.parametrize(
    ("preset", "expect_nvlink"),
    [
        pytest.param("dgx-h100", {"NV18"}, id="NVSwitch: NV18 between all pairs"),
        pytest.param("pcie-l40s", set(), id="PCIe only: no NVLink"),
    ],
)
def test_topo_json(tmp_path: Path, preset: str, expect_nvlink: set[str]) -> None:
    result = nodeagent("topo", "--json", "--simulate", preset, "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["gpus"] == 8
    assert len(data["links"]) == 28  # every unordered pair once
    labels = {link["label"] for link in data["links"]}
    nvlink = {label for label in labels if label.startswith("NV")}
    assert nvlink == expect_nvlink
    if not expect_nvlink:
        assert labels <= {"PIX", "PXB", "PHB", "NODE", "SYS"}


def test_a_lost_gpu_is_shown_and_fails_the_command(tmp_path: Path) -> None:
    SimControl(tmp_path).reset("dgx-h100")
    SimControl(tmp_path).inject("lost", 5)
    env = {"NODEAGENT_SIMULATE": "dgx-h100", "NODEAGENT_SIM_STATE": str(tmp_path)}
    result = nodeagent("gpus", "--json", env=env)
    assert result.returncode == 1
    gpus = json.loads(result.stdout)
    assert len(gpus) == 8
    assert gpus[5]["lost"] is True
    assert "GPU is lost" in gpus[5]["error"]
    assert all(g["lost"] is False for i, g in enumerate(gpus) if i != 5)
    table = nodeagent("topo", env=env)
    assert table.returncode == 0, table.stderr
    assert "?" in table.stdout.splitlines()[6]  # GPU5's row: links unknown


def test_without_driver_or_simulate_one_line_names_the_fix() -> None:
    result = nodeagent("gpus")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--simulate" in lines[0]
    assert "dgx-h100" in lines[0]
    assert "Traceback" not in result.stderr


def test_unknown_preset_names_the_presets(tmp_path: Path) -> None:
    result = nodeagent("gpus", "--simulate", "dgx-z900", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    assert "dgx-z900" in result.stderr
    assert "dgx-h100" in result.stderr
    assert "Traceback" not in result.stderr


def test_health_once_reports_a_gpu_lost_before_it_was_ever_read(tmp_path: Path) -> None:
    SimControl(tmp_path).reset("dgx-h100")
    SimControl(tmp_path).inject("lost", 5)
    result = nodeagent("health", "--json", "--simulate", "dgx-h100", "--state-dir", str(tmp_path))
    assert result.returncode == 1, result.stderr  # a lost GPU is a failure found
    data = json.loads(result.stdout)
    assert data["health"] == "lost"
    gpu5 = next(d for d in data["devices"] if d["gpu"] == 5)
    assert gpu5["state"] == "lost"
    assert gpu5["uuid"] == "GPU-unknown-index-5"
    assert len([d for d in data["devices"] if d["parent"] is None]) == 8
