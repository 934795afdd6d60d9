"""``nodeagent tiering simulate`` and ``why-pending``: output, filters, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent.testing.kube.controlplane import ControlPlane

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"
POLICY = """\
version: v1
tiers:
  - name: training
    selector: {match_labels: {nvidia.com/gpu.count: "8"}}
"""


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_simulate_prints_the_contiguity_example_as_json() -> None:
    result = run("simulate", "--cluster", str(EXAMPLES / "cluster-contiguity.yaml"), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["actions"] == []
    (entry,) = data["pending"]
    assert set(entry) >= {"pod", "reason", "evidence", "unblock"}
    assert (entry["pod"], entry["reason"]) == ("team-c/pretrain-0", "contiguity-gpus")
    assert entry["unblock"]["pods"] == ["team-a/finetune-0"]


def test_simulate_table_and_the_policy_pass(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    cluster = EXAMPLES / "cluster-mig-placement.yaml"
    result = run("simulate", "--cluster", str(cluster), "--policy", str(policy))
    assert result.exit_code == 0, result.output
    # The service would label the 4-GPU MIG node: it is in no tier of this policy.
    assert "would remove the tier label of node infer-a" in result.output
    lines = result.output.splitlines()
    header = next(line for line in lines if line.startswith("POD"))
    assert header.split() == [
        "POD", "REQUEST", "REASON", "EVIDENCE", "SMALLEST", "UNBLOCKING", "CHANGE",
    ]  # fmt: skip
    assert any("team-b/finetune-0" in line and "contiguity-mig" in line for line in lines)


BAD = [
    pytest.param("version: v2\nnodes: []\n", "cluster.yaml:1: version", id="version"),
    pytest.param("version: v1\nnodes:\n  - name: a\n    preset: t4\n    gpus: 2\n",
                 "cluster.yaml:5: nodes.0.gpus: unknown field", id="unknown-node-field"),
    pytest.param("version: v1\nnodes: []\n", "cluster.yaml:2: nodes", id="no-nodes"),
    pytest.param("version: v1\nnodes:\n  - {name: a, preset: nope}\n",
                 "unknown preset 'nope'", id="unknown-preset"),
    pytest.param("version: v1\nnodes:\n  - {name: A_1, preset: t4}\n",
                 "cluster.yaml:3: nodes.0.name: 'A_1' is not a valid node name", id="node-name"),
    pytest.param(
        "version: v1\nnodes:\n  - {name: a, preset: t4}\npods:\n  - apiVersion: v1\n"
        "    kind: Pod\n    metadata: {name: p}\n    spec:\n      nodeSelectr: {x: y}\n"
        "      containers: [{name: m, image: i}]\n",
        "cluster.yaml:9: pods.0.spec.nodeSelectr: unknown field", id="pod-typo",
    ),
    pytest.param(
        "version: v1\nnodes:\n  - {name: a, preset: t4}\npods:\n  - apiVersion: v1\n"
        "    kind: Pod\n    metadata: {name: p}\n    spec:\n      nodeName: a\n"
        "      containers: [{name: m, image: i, resources: {limits: {nvidia.com/gpu: 2}}}]\n",
        "requests 2 nvidia.com/gpu, but only 1 are free", id="too-many-gpus",
    ),
    pytest.param("version: v1\nnodes:\n  - {name: a, preset: t4\n", "cluster.yaml:", id="yaml"),
    pytest.param(
        "version: v1\nnodes:\n  - {name: a, preset: dgx-h100, mig: {layout: no-such}}\n",
        "MIG layout 'no-such'", id="layout",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "says"), BAD)
def test_bad_cluster_files_fail_in_one_line_with_exit_2(
    tmp_path: Path, text: str, says: str
) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    result = run("simulate", "--cluster", str(path))
    assert result.exit_code == 2, result.output
    error = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(error) == 1, result.output
    assert says in error[0], result.output
    assert "Traceback" not in result.output


def test_why_pending_table_json_and_filters(
    control_plane: ControlPlane, kube_ns: str, fragmented: str
) -> None:
    access = ["--kubeconfig", str(control_plane.admin.path)]
    result = run("why-pending", "-n", kube_ns, "--json", *access)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["pending"]
    assert entry["pod"] == f"{kube_ns}/wide"
    assert entry["reason"] == "contiguity-gpus"
    assert entry["unblock"]["kind"] == "move-pods"
    assert "Insufficient nvidia.com/gpu" in entry["scheduler"]
    table = run("why-pending", "wide", "-n", kube_ns, *access)
    assert table.exit_code == 0, table.output
    assert table.output.startswith("POD")
    assert "contiguity-gpus" in table.output
    other = run("why-pending", "-n", "no-such-namespace", "--json", *access)
    assert json.loads(other.output) == {"pending": []}
    running = run("why-pending", "run-0", "-n", kube_ns, *access)
    assert running.exit_code == 0
    assert "is not a pending GPU pod" in running.output
    missing = run("why-pending", "absent", "-n", kube_ns, *access)
    assert missing.exit_code == 2
    assert f"no pod {kube_ns}/absent" in missing.output


def test_why_pending_without_an_api_server_fails_in_one_line() -> None:
    result = run("why-pending", "--server", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot reach the API server")
