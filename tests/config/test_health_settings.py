"""The one-shot health check's shortcut through the agent config gives exactly what the whole
config gives: with no file and no override, and with either."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import HealthSettings, load_agent_config, load_health_settings


def full(path: Path | None, environ: dict[str, str]) -> HealthSettings:
    cfg = load_agent_config(path, environ=environ)
    return HealthSettings(cfg.health, cfg.pool.expected_driver_version, cfg.node_name)


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"NODEAGENT_HEALTH_RECOVERY_QUIET_S": "42"}, id="health override"),
        pytest.param({"NODEAGENT_NODE_NAME": "gpu-9"}, id="node override"),
        pytest.param({"NODEAGENT_STATE_DIR": "/tmp/elsewhere"}, id="another section"),
    ],
)
def test_without_a_file(environ: dict[str, str]) -> None:
    assert load_health_settings(None, environ=environ) == full(None, environ)


def test_the_env_override_is_seen() -> None:
    settings = load_health_settings(None, environ={"NODEAGENT_HEALTH_RECOVERY_QUIET_S": "42"})
    assert settings.health.recovery_quiet_s == 42


def test_with_a_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "version: v1\nnode: {name: gpu-7, pool: train}\nhealth: {recovery_quiet_s: 30}\n"
        "pools:\n  train: {expected_driver_version: '570.124.06'}\n"
    )
    settings = load_health_settings(path, environ={})
    assert settings == full(path, {})
    assert (settings.node_name, settings.expected_driver_version) == ("gpu-7", "570.124.06")
    assert settings.health.recovery_quiet_s == 30


def test_a_bad_file_is_the_loaders_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("version: v1\nhealth: {recovery_quiet_s: -1}\n")
    with pytest.raises(ConfigError):
        load_health_settings(path, environ={})
