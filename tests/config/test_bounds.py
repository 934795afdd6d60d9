"""Values that hurt are refused with their place and bound; every number has a documented range."""

from __future__ import annotations

import json
import textwrap
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from nodeagent.config.errors import ConfigError
from nodeagent.config.loader import is_model, key_of, unwrap
from nodeagent.config.reference import render_reference
from nodeagent.config.schema import AgentConfig, load_agent_config
from nodeagent_tiering.cluster.tier_policy import TierPolicy


def load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> AgentConfig:
    path = tmp_path / "agent.yaml"
    path.write_text("version: v1\n" + textwrap.dedent(text).lstrip())
    return load_agent_config(path, environ=environ or {})


def problems(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, environ)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "pools:\n  default:\n    sharing: {mode: time-slicing, replicas: 1000000}\n",
            "agent.yaml:4: pools.default.sharing.replicas: must be at most 128, got 1000000",
            id="replicas",
        ),
        pytest.param(
            "pools:\n  default:\n    sharing: {mode: mps, replicas: 49}\n",
            "pools.default.sharing.replicas: at most 48 with mode mps",
            id="mps-replicas",
        ),
        pytest.param(
            "health: {report_interval_s: 1e-9}\n",
            "agent.yaml:2: health.report_interval_s: must be at least 1, got '1e-9'",
            id="report-interval",
        ),
        pytest.param(
            "health: {fatal_hold_s: .nan}\n",
            "health.fatal_hold_s: must be a finite number, got nan",
            id="nan-hold",
        ),
        pytest.param(
            "health: {recovery_quiet_s: .inf}\n",
            "health.recovery_quiet_s: must be a finite number, got inf",
            id="infinite-hold",
        ),
        pytest.param(
            "health: {recovery_quiet_s: -1}\n",
            "health.recovery_quiet_s: must be at least 0, got -1",
            id="negative-hold",
        ),
        pytest.param(
            "pools:\n  default:\n    sharing: {mode: mps, replicas: 2, "
            "mps_pinned_memory_limit_mib: -512}\n",
            "pools.default.sharing.mps_pinned_memory_limit_mib: must be at least 1, got -512",
            id="negative-mps-memory",
        ),
        pytest.param(
            "pools:\n  default:\n    sharing: {mode: mps, replicas: 2, "
            "mps_active_thread_percentage: -5}\n",
            "pools.default.sharing.mps_active_thread_percentage: must be at least 1, got -5",
            id="negative-mps-threads",
        ),
        pytest.param(
            "node: {name: GPU_Node_1}\n",
            "agent.yaml:2: node.name: 'GPU_Node_1' is not a valid Kubernetes node name",
            id="node-name",
        ),
        pytest.param(
            "node: {name: " + "a" * 254 + "}\n",
            "node.name: '" + "a" * 254 + "' is not a valid Kubernetes node name",
            id="node-name-too-long",
        ),
        pytest.param(
            "pools:\n  default:\n    gpu_sharing:\n      first: {mode: mps, replicas: 2}\n",
            "agent.yaml:5: pools.default.gpu_sharing.first: 'first' names no GPU",
            id="gpu-key",
        ),
        pytest.param(
            "device_plugin:\n  sharing:\n    timeSlicing:\n      resources:\n"
            "        - {name: nvidia.com/gpu, replicas: 4, devices: [0, gpu-one]}\n",
            "device_plugin.sharing.timeSlicing.resources[0].devices: 'gpu-one' is not a GPU index",
            id="nvidia-devices",
        ),
        pytest.param(
            "device_plugin:\n  sharing:\n    mps:\n      resources:\n"
            "        - {name: nvidia.com/gpu, replicas: 64}\n",
            "device_plugin.sharing.mps.resources[0].replicas: at most 48 under mps",
            id="nvidia-mps-replicas",
        ),
        pytest.param(
            "sampler: {interval_s: 0}\n",
            "sampler.interval_s: must be at least 0.05, got 0",
            id="sampler-interval",
        ),
        pytest.param(
            "metrics: {address: '127.0.0.1:70000'}\n",
            "metrics.address: '127.0.0.1:70000' is not HOST:PORT",
            id="port",
        ),
        pytest.param(
            "health: {ignore_xids: [79, 0]}\n",
            "health.ignore_xids[1]: must be at least 1, got 0",
            id="xid",
        ),
        pytest.param(
            "health: {degraded_exit: 5}\nkubernetes: {retry_initial_s: 50, retry_max_s: 10}\n",
            "agent.yaml:3: kubernetes.retry_initial_s: must not exceed retry_max_s",
            id="crossed-pair",
        ),
        pytest.param(
            "pools:\n  'my pool': {}\nnode: {pool: 'my pool'}\n",
            "agent.yaml:3: pools.my pool: 'my pool' must be a valid label value",
            id="pool-name",
        ),
    ],
)
def test_values_that_hurt_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    found = problems(tmp_path, text)
    assert any(expected in p for p in found), found


def test_every_problem_in_a_file_at_once(tmp_path: Path) -> None:
    """The issue's list in one file: each is its own line, in file order."""
    found = problems(
        tmp_path,
        """
        node: {name: Bad_Name}
        health:
          report_interval_s: 1e-9
          fatal_hold_s: .nan
          recovery_quiet_s: .inf
        pools:
          default:
            sharing: {mode: time-slicing, replicas: 1000000}
            gpu_sharing:
              "3": {mode: mps, replicas: 2, mps_pinned_memory_limit_mib: -1}
        """,
    )
    fields = [p.split(": ", 2)[1] for p in found]
    assert fields == [
        "node.name",
        "health.report_interval_s",
        "health.fatal_hold_s",
        "health.recovery_quiet_s",
        "pools.default.sharing.replicas",
        "pools.default.gpu_sharing.3.mps_pinned_memory_limit_mib",
    ]
    lines = [int(p.split(":")[1]) for p in found]
    assert lines == sorted(lines) == [2, 4, 5, 6, 9, 11]


def test_an_environment_value_is_named_by_its_variable(tmp_path: Path) -> None:
    found = problems(tmp_path, "sampler: {interval_s: 2}\n", {"NODEAGENT_SAMPLER_INTERVAL_S": "0"})
    assert found == [
        "env NODEAGENT_SAMPLER_INTERVAL_S: sampler.interval_s: must be at least 0.05, got '0'"
    ]


def test_a_command_line_value_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_agent_config(None, environ={}, overrides={"metrics": {"address": "9475"}})
    assert [str(p) for p in info.value.problems] == [
        "command line: metrics.address: '9475' is not HOST:PORT; use e.g. 0.0.0.0:9475 or "
        "[::1]:9475"
    ]


def _numbers(model: type[BaseModel], path: str = "") -> list[tuple[str, list[object]]]:
    """Every int and float field of a model tree, with its declared constraints."""
    out = []
    for name, info in model.model_fields.items():
        full = f"{path}{key_of(name, info)}"
        inner, _ = unwrap(info.annotation)
        args = typing.get_args(inner)
        if is_model(inner):
            out += _numbers(inner, f"{full}.")
        elif typing.get_origin(inner) in (dict, tuple) and args and is_model(unwrap(args[-1])[0]):
            out += _numbers(unwrap(args[-1] if typing.get_origin(inner) is dict else args[0])[0],
                            f"{full}.")  # fmt: skip
        elif inner in (int, float):
            out.append((full, list(info.metadata)))
    return out


@pytest.mark.parametrize("model", [AgentConfig, TierPolicy], ids=["agent-config", "tier-policy"])
def test_every_number_has_a_lower_and_an_upper_bound(model: type[BaseModel]) -> None:
    numbers = _numbers(model)
    assert numbers
    unbounded = [
        name
        for name, metadata in numbers
        if not any(hasattr(m, "ge") or hasattr(m, "gt") for m in metadata)
        or not any(hasattr(m, "le") or hasattr(m, "lt") for m in metadata)
    ]
    assert not unbounded, f"numeric fields without a range: {unbounded}"


def test_the_reference_shows_each_range() -> None:
    reference = render_reference()
    rows = {line.split(" | ")[0].strip("| `"): line for line in reference.splitlines()}
    assert "| 1..128 |" in rows["pools.<pool>.sharing.replicas"]
    assert "| 1..3600 |" in rows["health.report_interval_s"]
    assert "| 0.05..3600 |" in rows["sampler.interval_s"]
    assert "| each 1..65535 |" in rows["health.ignore_xids"]


def test_the_effective_config_line_reads_back_as_the_same_config(tmp_path: Path) -> None:
    """The start-up log line is the whole config in the file's own keys."""
    config = load(
        tmp_path,
        """
        node: {pool: infer}
        device_plugin:
          device_list_strategy: cdi-cri
          sharing:
            timeSlicing:
              renameByDefault: true
              resources: [{name: nvidia.com/gpu, replicas: 4, devices: [0, 1]}]
        pools:
          infer:
            sharing: {mode: time-slicing, replicas: 4}
            gpu_sharing: {"3": {mode: mps, replicas: 2}}
        """,
    )
    line = config.describe()
    assert "\n" not in line
    data = json.loads(line)
    assert data["device_plugin"]["sharing"]["timeSlicing"]["renameByDefault"] is True
    assert AgentConfig.model_validate(data) == config
