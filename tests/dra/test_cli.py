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
    common = ["dra", "slices", "--simulate", "dgx-h100", "--state-dir", str(sim)]
    as_json = run(*common, "--node-name", "n1", "--dynamic-mig", "--json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout) == list(expected)
    as_yaml = run(*common, "--node-name", "n1", "--dynamic-mig")
    assert list(yaml.safe_load_all(as_yaml.stdout)) == list(expected)
    static = json.loads(run(*common, "--node-name", "n1", "--json").stdout)
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
