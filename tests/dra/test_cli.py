"""``nodeagent dra slices``: the objects the publisher sends, as YAML or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from nodeagent.agent.backend import open_node
from nodeagent.cli.main import app
from nodeagent_dra.slices import SliceSpec, build_slices
from tests.dra.conftest import shape


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_json_and_yaml_print_exactly_what_the_builder_sends(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    node = open_node(simulate="dgx-h100", state_dir=sim)
    shape(node, "dynamic")
    expected = build_slices(node.snapshot(), SliceSpec("n1", dynamic_mig=True)).slices
    node.close()
    # Health off: the builder's bare spec (health input: tests/dra/test_cli_health.py).
    config = tmp_path / "agent.yaml"
    config.write_text(f"version: v1\nstate_dir: {tmp_path / 'state'}\nhealth:\n  enabled: false\n")
    common = ["dra", "slices", "--simulate", "dgx-h100", "--state-dir", str(sim), "-c", str(config)]
    as_json = run(*common, "--node-name", "n1", "--dynamic-mig", "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == list(expected)
    as_yaml = run(*common, "--node-name", "n1", "--dynamic-mig")
    assert list(yaml.safe_load_all(as_yaml.stdout)) == list(expected)
    static = json.loads(run(*common, "--node-name", "n1", "--json").stdout)
    assert [d for s in static for d in s["spec"].get("devices", [])], "no devices published"
    assert not any(s["spec"].get("sharedCounters") for s in static)


def test_dynamic_mig_on_gpus_without_mig_says_so(tmp_path: Path) -> None:
    result = run(
        "dra", "slices", "--simulate", "dgx-a100", "--state-dir", str(tmp_path), "--dynamic-mig"
    )
    assert result.exit_code == 0
    assert "MIG is off on GPU 0, 1, 2, 3, 4, 5, 6, 7" in result.stderr


def test_an_unknown_preset_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run("dra", "slices", "--simulate", "h900", "--state-dir", str(tmp_path))
    assert result.exit_code == 2
    assert "unknown simulator preset 'h900'" in result.stderr
    assert "Traceback" not in result.output


def test_a_dynamic_mig_pool_with_a_mig_layout_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.yaml"
    config.write_text(
        "version: v1\npools:\n  default:\n    mig_layout: all-1g.10gb\n    dra:\n"
        "      dynamic_mig: true\n"
    )
    result = run(
        "dra", "slices", "--simulate", "t4", "--state-dir", str(tmp_path), "-c", str(config)
    )
    assert result.exit_code == 2
    assert "pools.default.dra.dynamic_mig" in result.stderr
    assert "unset mig_layout" in result.stderr
    assert "Traceback" not in result.output


def test_instances_the_driver_made_are_shown_as_it_publishes_them(tmp_path: Path) -> None:
    from nodeagent.gpu.types import Placement
    from nodeagent_dra.checkpoint import (
        Checkpoint,
        ClaimRecord,
        MigIntent,
        PreparedDevice,
        checkpoint_path,
    )

    sim, state = tmp_path / "sim", tmp_path / "state"
    node = open_node(simulate="dgx-h100", state_dir=sim)
    shape(node, "dynamic")
    node.create_gpu_instance(0, "2g.20gb", Placement(2, 2))
    node.close()
    mig = MigIntent(0, "2g.20gb", 2, 2, instance_id=1)
    device = PreparedDevice(("r",), "n1", "gpu-0-mig-2g20gb-14-2", mig=mig)
    Checkpoint.load(checkpoint_path(state)).put(ClaimRecord("u", "ns", "c", (device,), True))
    config = tmp_path / "agent.yaml"
    config.write_text(f"version: v1\nstate_dir: {state}\n")
    common = ["dra", "slices", "--simulate", "dgx-h100", "--state-dir", str(sim), "--json"]
    out = json.loads(run(*common, "-c", str(config), "--dynamic-mig", "--node-name", "n1").stdout)
    gpu0 = [d["name"] for s in out for d in s["spec"].get("devices", [])]
    assert "gpu-0" in gpu0, "the driver's own instance leaves the whole GPU listed"
    assert "gpu-0-mig-2g20gb-14-2" in gpu0
