"""GPU indices the config names are checked against the node when the agent starts and reloads."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from nodeagent.agent.daemon import Agent
from nodeagent.cli.main import app
from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import check_gpu_indices, load_agent_config

NAMES_9_AND_12 = """version: v1
pools:
  default:
    gpu_sharing:
      "7": {mode: mps, replicas: 2}
      "9": {mode: mps, replicas: 2}
      GPU-00000000-0000-0000-0000-000000000000: {mode: time-slicing, replicas: 2}
device_plugin:
  sharing:
    timeSlicing:
      resources:
        - name: nvidia.com/gpu
          replicas: 4
          devices: [0, "12", "3:1"]
"""


def test_run_refuses_indices_the_node_lacks_one_line_each(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(NAMES_9_AND_12)
    result = CliRunner().invoke(
        app, ["run", "-c", str(path), "--simulate", "dgx-h100", "--state-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        f"error: {path}:6: pools.default.gpu_sharing.9: no GPU 9 on this node (it has GPUs 0-7)",
        f"error: {path}:14: device_plugin.sharing.timeSlicing.resources[0].devices[1]: "
        "no GPU 12 on this node (it has GPUs 0-7)",
        "hint: name GPUs this node has (`nodeagent gpus` lists them)",
    ]


@pytest.mark.parametrize(
    ("count", "missing"),
    [
        pytest.param(16, [], id="all-present"),
        pytest.param(10, [12], id="twelve-missing"),
        pytest.param(4, [7, 9, 12], id="small-node"),
        pytest.param(0, [7, 9, 0, 12, 3], id="no-gpu"),
    ],
)
def test_only_indices_beyond_the_node_are_named(
    tmp_path: Path, count: int, missing: list[int]
) -> None:
    """UUIDs are not checked (a shared file lists other nodes' GPUs); MIG indices by their GPU."""
    path = tmp_path / "agent.yaml"
    path.write_text(NAMES_9_AND_12)
    config = load_agent_config(path, environ={})
    if not missing:
        check_gpu_indices(config, count, path)
        return
    with pytest.raises(ConfigError) as info:
        check_gpu_indices(config, count, path)
    named = [int(p.message.split()[2]) for p in info.value.problems]
    assert named == missing


def test_other_pools_describe_other_nodes(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "version: v1\nnode: {pool: small}\npools:\n  small: {}\n"
        "  big:\n    gpu_sharing: {'15': {mode: mps, replicas: 2}}\n"
    )
    check_gpu_indices(load_agent_config(path, environ={}), 8, path)


def test_a_reload_naming_a_missing_gpu_keeps_the_running_config(make_node, tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("version: v1\nsampler: {interval_s: 2}\n")
    node = make_node("dgx-h100")
    agent = Agent(load_agent_config(path, environ={}), node, config_path=path)
    path.write_text(
        "version: v1\nsampler: {interval_s: 3}\n"
        "pools:\n  default:\n    gpu_sharing: {'8': {mode: mps, replicas: 2}}\n"
    )
    assert agent.reload() is False
    assert agent.config.sampler.interval_s == 2
    path.write_text("version: v1\nsampler: {interval_s: 3}\n")
    assert agent.reload() is True
    assert agent.config.sampler.interval_s == 3
