"""The agent config: defaults, strictness, line-numbered errors and precedence."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from nodeagent.config.loader import ConfigError, env_names
from nodeagent.config.pool_policy import SharingMode
from nodeagent.config.schema import AgentConfig, load_agent_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_defaults_without_a_file_start_every_component() -> None:
    config = load_agent_config(None, environ={})
    assert config.sampler.interval_s == 1.0
    assert config.metrics.enabled
    assert config.device_plugin.enabled
    assert config.health.enabled
    assert config.node.pool == "default"
    assert config.pool.sharing.mode is SharingMode.EXCLUSIVE


def test_a_full_file_is_read(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        version: v1
        node: {pool: inference}
        sampler: {interval_s: 2.5}
        pools:
          inference:
            mig_layout: all-1g.10gb
            expected_driver_version: "570.124.06"
            sharing: {mode: time-slicing, replicas: 4}
            gpu_sharing:
              "3": {mode: mps, replicas: 2}
        """,
    )
    config = load_agent_config(path, environ={})
    assert config.sampler.interval_s == 2.5
    assert config.pool.mig_layout == "all-1g.10gb"
    assert config.pool.sharing_for(0, "GPU-a").replicas == 4
    assert config.pool.sharing_for(3, "GPU-b").mode is SharingMode.MPS


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("version: v2\n", "unsupported version 'v2'", id="unknown version"),
        pytest.param("sampler: {}\n", "missing; add `version: v1`", id="no version"),
        pytest.param(
            "version: v1\nsampler:\n  interval: 3\n",
            "agent.yaml:3: sampler.interval: unknown field "
            "(known: interval_s, nvlink_counters_interval_s, profiling, profiling_interval_s)",
            id="unknown field names file line and field",
        ),
        pytest.param(
            "version: v1\nsampler:\n  interval_s: fast\n",
            "agent.yaml:3: sampler.interval_s: expected a number, got 'fast'",
            id="wrong type",
        ),
        pytest.param(
            "version: v1\npools:\n  a:\n    sharing: {mode: share}\n",
            "pools.a.sharing.mode: 'share' is not one of exclusive, time-slicing, mps",
            id="bad enum lists the choices",
        ),
        pytest.param(
            "version: v1\nnode: {pool: gone}\n",
            "agent.yaml:2: node.pool: 'gone' is not in pools (known: default)",
            id="pool must exist",
        ),
        pytest.param(
            "version: v1\npools:\n  default:\n    sharing: {replicas: 3}\n",
            "replicas > 1 needs mode time-slicing or mps",
            id="replicas need a sharing mode",
        ),
        pytest.param("version: v1\nsampler: [\n", "not valid YAML", id="broken yaml"),
    ],
)
def test_bad_files_are_rejected_with_the_place(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(write(tmp_path, text), environ={})
    assert expected in str(info.value)


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\nsampler: {interval: 1}\nmetrics: {port: 1}\n")
    with pytest.raises(ConfigError) as info:
        load_agent_config(path, environ={})
    lines = str(info.value).splitlines()
    assert len(lines) == 2
    assert "sampler.interval" in lines[0]
    assert "metrics.port" in lines[1]


def test_precedence_is_command_line_then_environment_then_file(tmp_path: Path) -> None:
    path = write(tmp_path, "version: v1\nsampler: {interval_s: 5}\nmetrics: {address: ':1'}\n")
    env = {"NODEAGENT_SAMPLER_INTERVAL_S": "7", "NODEAGENT_METRICS_ADDRESS": "127.0.0.1:2"}
    config = load_agent_config(path, environ=env, overrides={"metrics": {"address": ":3"}})
    assert config.sampler.interval_s == 7.0  # env beats file
    assert config.metrics.address == ":3"  # command line beats env


def test_every_scalar_field_has_one_env_name_and_the_reference_is_current() -> None:
    from nodeagent.config.reference import embed

    names = env_names(AgentConfig)
    assert len(names) == len(set(names))
    assert "NODEAGENT_SAMPLER_INTERVAL_S" in names
    document = (Path(__file__).parents[2] / "docs" / "config.md").read_text()
    assert embed(document) == document, (
        "docs/config.md is out of date: run python -m nodeagent.config.reference --write "
        "docs/config.md"
    )
    missing = [name for name in names if f"`{name}`" not in document]
    assert not missing, f"env names missing from docs/config.md: {missing}"
