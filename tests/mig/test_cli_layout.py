"""Which layout `nodeagent mig plan|apply|assert` works on: -c, else the agent config's pool.

The boot unit passes only `--agent-config`, so these cases are what a node does at boot: the
pool's layout is applied, a pool that leaves MIG alone is left alone (exit 0), and a command
line that names nothing fails in one line naming both ways to name a layout.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner, Result

from nodeagent.agent.backend import open_node
from nodeagent.cli.mig import app
from nodeagent_mig.config import DEFAULT_CONFIG_FILE

PRESET = "dgx-a100"

# Every variable that could name a layout, a file, a pool or a node from the test's own
# environment; each case sets what it needs.
ISOLATED = (
    "NODEAGENT_CONFIG",
    "NODEAGENT_MIG_CONFIG",
    "NODEAGENT_MIG_CONFIG_FILE",
    "NODEAGENT_MIG_LAYOUT_FILE",
    "NODEAGENT_MIG_ENABLED",
    "NODEAGENT_MIG_STATE_DIR",
    "NODEAGENT_NODE_POOL",
    "NODEAGENT_SIMULATE",
    "NODEAGENT_SIM_STATE",
)

# A file of our own, with a name the built-in layouts lack, to tell which file was read.
CUSTOM_LAYOUTS = """\
version: v1
mig-configs:
  two-halves:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.20gb": 2}
"""


def agent_config(
    tmp_path: Path, layout: str | None = "all-1g", enabled: bool = True, layout_file: bool = False
) -> Path:
    """Write an agent config whose node is in pool ``inference``, which wants ``layout``."""
    mig: dict[str, object] = {"enabled": enabled}
    if layout_file:
        mig["layout_file"] = str(tmp_path / "layouts.yaml")
    (tmp_path / "layouts.yaml").write_text(CUSTOM_LAYOUTS)
    data = {
        "version": "v1",
        "node": {"pool": "inference"},
        "mig": mig,
        "pools": {
            "default": {},
            "inference": {"mig_layout": layout},
            "experiments": {"mig_layout": "all-3g"},
        },
    }
    path = tmp_path / "nodeagent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    """Run `nodeagent mig ...` on the test's simulated node with a clean environment."""
    clean: dict[str, str | None] = dict.fromkeys(ISOLATED)
    clean.update(env or {})
    base = ["--simulate", PRESET, "--state-dir", str(tmp_path / "sim")]
    return CliRunner().invoke(app, [*args, *base], env=clean)


def profiles(tmp_path: Path) -> Counter[str]:
    """Every MIG instance on the simulated node, by profile."""
    node = open_node(simulate=PRESET, state_dir=tmp_path / "sim")
    try:
        return Counter(
            g.profile
            for i in range(node.count())
            if node.info(i).mig_enabled
            for g in node.mig_instances(i)
        )
    finally:
        node.close()


def test_apply_takes_the_layout_from_the_agent_config_pool(tmp_path: Path) -> None:
    """The boot unit's command line: only --agent-config names the layout."""
    config = agent_config(tmp_path, layout="all-1g")
    result = invoke(tmp_path, "apply", "--yes", "--allow-reset", "--agent-config", str(config))
    assert result.exit_code == 0, result.output
    assert profiles(tmp_path) == Counter({"1g.5gb": 7 * 8})
    # The intent record is kept where the agent keeps its own, so either finishes the other's
    # interrupted apply (a completed apply leaves the directory, not the file).
    assert (tmp_path / "sim" / "agent" / "mig").is_dir()
    assert not (tmp_path / "sim" / "mig").exists()


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param(["--agent-config", "CONFIG"], {}, "all-1g", id="pool-layout"),
        pytest.param([], {"NODEAGENT_CONFIG": "CONFIG"}, "all-1g", id="pool-layout-from-env"),
        pytest.param(
            ["--agent-config", "CONFIG"],
            {"NODEAGENT_NODE_POOL": "experiments"},
            "all-3g",
            id="pool-picked-by-env",
        ),
        pytest.param(["--agent-config", "CONFIG", "-c", "all-7g"], {}, "all-7g", id="c-wins"),
        pytest.param(
            ["--agent-config", "CONFIG"],
            {"NODEAGENT_MIG_CONFIG": "all-2g"},
            "all-2g",
            id="env-c-wins",
        ),
        pytest.param(["-c", "all-4g"], {}, "all-4g", id="c-without-agent-config"),
    ],
)
def test_layout_name_resolution(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    config = str(agent_config(tmp_path, layout="all-1g"))
    args = [config if a == "CONFIG" else a for a in args]
    env = {k: config if v == "CONFIG" else v for k, v in env.items()}
    result = invoke(tmp_path, "assert", "--json", *args, env=env)
    assert result.exit_code == 1, result.output  # nothing applied yet: drift, not an error
    assert json.loads(result.stdout)["config"] == expected


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param([], Counter({"3g.20gb": 2 * 8}), id="layout-file-from-agent-config"),
        pytest.param(["-f", "BUILTIN", "-c", "all-7g"], Counter({"7g.40gb": 8}), id="f-wins"),
    ],
)
def test_layout_file_resolution(tmp_path: Path, args: list[str], expected: Counter[str]) -> None:
    config = agent_config(tmp_path, layout="two-halves", layout_file=True)
    args = [str(DEFAULT_CONFIG_FILE) if a == "BUILTIN" else a for a in args]
    result = invoke(
        tmp_path, "apply", "--yes", "--allow-reset", "--agent-config", str(config), *args
    )
    assert result.exit_code == 0, result.output
    assert profiles(tmp_path) == expected


@pytest.mark.parametrize("command", ["plan", "apply", "assert"])
def test_no_layout_anywhere_is_one_line_naming_both_ways(tmp_path: Path, command: str) -> None:
    result = invoke(tmp_path, command, "--yes" if command == "apply" else "--json")
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "-c NAME" in errors[0]
    assert "pools.<pool>.mig_layout" in errors[0]
    assert "--agent-config" in errors[0]
    assert "Traceback" not in result.stderr
    assert profiles(tmp_path) == Counter()


@pytest.mark.parametrize(
    ("layout", "enabled", "reason"),
    [
        pytest.param(None, True, "sets no mig_layout", id="pool-without-mig-layout"),
        pytest.param("all-1g", False, "mig.enabled is false", id="mig-disabled"),
    ],
)
@pytest.mark.parametrize("command", ["plan", "apply", "assert"])
def test_pool_that_leaves_mig_alone_does_nothing(
    tmp_path: Path, command: str, layout: str | None, enabled: bool, reason: str
) -> None:
    # GPUs already partitioned by someone else must stay exactly as they are.
    first = invoke(tmp_path, "apply", "-c", "all-balanced", "--yes", "--allow-reset")
    assert first.exit_code == 0, first.output
    before = profiles(tmp_path)
    config = agent_config(tmp_path, layout=layout, enabled=enabled)
    extra = ["--yes", "--allow-reset"] if command == "apply" else []
    result = invoke(tmp_path, command, *extra, "--agent-config", str(config))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("nothing to do: ")
    assert reason in result.stdout
    assert profiles(tmp_path) == before
    as_json = invoke(tmp_path, command, *extra, "--json", "--agent-config", str(config))
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)["config"] is None


def test_explicit_c_applies_even_where_the_pool_leaves_mig_alone(tmp_path: Path) -> None:
    config = agent_config(tmp_path, layout=None)
    result = invoke(
        tmp_path, "apply", "-c", "all-7g", "--yes", "--allow-reset", "--agent-config", str(config)
    )
    assert result.exit_code == 0, result.output
    assert profiles(tmp_path) == Counter({"7g.40gb": 8})
