"""The canary probe: real commands, their environment, timeouts and failures."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from nodeagent.config.errors import ConfigError
from nodeagent.config.metrics import ProbeSection
from nodeagent.config.schema import load_agent_config
from nodeagent.workloads import Device
from nodeagent_exporters.probe import ProbeRunner

GPU = Device(2, "GPU-two")
MIG = Device(3, "GPU-three", "MIG-three-a", "1g.10gb", 9)


def _section(code: str, timeout_s: float = 10.0) -> ProbeSection:
    return ProbeSection(enabled=True, command=(sys.executable, "-c", code), timeout_s=timeout_s)


def test_runs_on_each_shared_device_with_its_uuid(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    code = (
        "import os, pathlib\n"
        f"p = pathlib.Path({str(out)!r})\n"
        "old = p.read_text() if p.exists() else ''\n"
        "env = os.environ\n"
        "line = env['CUDA_VISIBLE_DEVICES'] + ' ' + env['NODEAGENT_PROBE_GPU']\n"
        "p.write_text(old + line + '\\n')\n"
    )
    targets = [GPU, MIG]
    runner = ProbeRunner(_section(code), lambda: targets)
    results = runner.round()
    assert [r.ok for r in results] == [True, True]
    assert out.read_text().splitlines() == ["GPU-two 2", "MIG-three-a 3"]
    assert all(r.duration_s > 0 for r in results)
    targets = [MIG]  # GPU 2 is no longer shared: its last result goes
    runner.round()
    assert set(runner.results()) == {MIG}
    assert runner.failures() == {}


@pytest.mark.parametrize(
    ("code", "timeout_s", "detail"),
    [
        pytest.param("print('bad'); raise SystemExit(4)", 10.0, "exit 4: bad", id="exit"),
        pytest.param("import time; time.sleep(5)", 1.0, "timed out after 1s", id="timeout"),
    ],
)
def test_failures_are_counted_with_their_detail(code: str, timeout_s: float, detail: str) -> None:
    runner = ProbeRunner(_section(code, timeout_s), lambda: [GPU])
    (result,) = runner.round()
    assert not result.ok
    assert result.detail == detail
    runner.round()
    assert runner.failures() == {GPU: 2}


def test_a_command_that_cannot_start_fails() -> None:
    section = ProbeSection(enabled=True, command=("/nonexistent/probe",))
    (result,) = ProbeRunner(section, lambda: [GPU]).round()
    assert not result.ok
    assert result.detail.startswith("could not start")


def test_enabled_without_command_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("version: v1\nmetrics:\n  probe:\n    enabled: true\n")
    with pytest.raises(ConfigError, match=r"probe\.command"):
        load_agent_config(path)
