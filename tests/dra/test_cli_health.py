"""``nodeagent dra slices`` takes the health input the live driver takes: a GPU the agent's
health holds as lost is tainted in the command's output exactly as the driver publishes it."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from nodeagent.agent.backend import open_node
from nodeagent.cli.main import app
from nodeagent.config.schema import load_agent_config
from nodeagent.health.component import build_model
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent_dra.component import DraComponent
from nodeagent_dra.slices import UNHEALTHY_TAINT, build_slices


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "version: v1\n"
        f"state_dir: {tmp_path / 'state'}\n"
        "node:\n  name: n1\n"
        "dra:\n  enabled: true\n"
        f"  registry_dir: {tmp_path / 'registry'}\n"
        f"  plugin_dir: {tmp_path / 'plugins'}\n"
        f"  cdi_spec_dir: {tmp_path / 'cdi'}\n"
    )
    return path


def _taints(slices: list[dict]) -> dict[str, list[str]]:  # type: ignore[type-arg]
    return {
        d["name"]: [t["key"].rsplit("/", 1)[-1] for t in d.get("taints", [])]
        for s in slices
        for d in s["spec"].get("devices", [])
    }


def test_an_xid_79_gpu_is_tainted_in_the_output_as_the_driver_publishes_it(
    tmp_path: Path,
) -> None:
    sim = tmp_path / "sim"
    config_file = _config(tmp_path)
    config = load_agent_config(config_file, environ={})
    node = open_node(simulate="dgx-h100", state_dir=sim)
    control = SimControl(sim)
    # The live agent's health model: it knew GPU 3, saw it fall off the bus (XID 79) and still
    # holds it lost after it answers again; its history is in the agent's state directory.
    model = build_model(config)
    assert model is not None
    model.on_snapshot(node.snapshot())
    control.inject("xid", 3, code=79)
    model.on_snapshot(node.snapshot())
    control.clear(3)
    snapshot = node.snapshot()
    model.on_snapshot(snapshot)
    model.save()
    driver = DraComponent(config, node, SnapshotStore(), model, mig_lock_file=tmp_path / "mig.lock")
    published = list(build_slices(snapshot, driver.spec(1)).slices)
    node.close()
    assert _taints(published)["gpu-3"] == [UNHEALTHY_TAINT]  # the GPU answers, health holds it
    assert _taints(published)["gpu-2"] == []

    result = CliRunner().invoke(
        app,
        ["dra", "slices", "--simulate", "dgx-h100", "--state-dir", str(sim), "-c",
         str(config_file), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == published


def test_without_a_health_model_no_device_is_tainted(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    config_file = _config(tmp_path)
    config_file.write_text(config_file.read_text() + "health:\n  enabled: false\n")
    open_node(simulate="dgx-h100", state_dir=sim).close()
    SimControl(sim).inject("xid", 3, code=79)
    result = CliRunner().invoke(
        app,
        ["dra", "slices", "--simulate", "dgx-h100", "--state-dir", str(sim), "-c",
         str(config_file), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not any(_taints(json.loads(result.stdout)).values())
