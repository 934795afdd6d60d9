"""``nodeagent tiering simulate`` and ``why-pending``: output, filters, and bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
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


WAITING_JOB = """
version: v1
nodes:
  - {name: a, preset: dgx-h100}
kueue:
  - apiVersion: kueue.x-k8s.io/v1beta2
    kind: ClusterQueue
    metadata: {name: team-a}
    spec:
      resourceGroups:
        - coveredResources: [nvidia.com/gpu]
          flavors: [{name: h100, resources: [{name: nvidia.com/gpu, nominalQuota: 8}]}]
    status:
      flavorsUsage: [{name: h100, resources: [{name: nvidia.com/gpu, total: "6"}]}]
  - apiVersion: kueue.x-k8s.io/v1beta2
    kind: LocalQueue
    metadata: {name: q, namespace: team-a}
    spec: {clusterQueue: team-a}
  - apiVersion: kueue.x-k8s.io/v1beta2
    kind: Workload
    metadata:
      name: job-train-1a2b3
      namespace: team-a
      ownerReferences: [{apiVersion: batch/v1, kind: Job, name: train, uid: u1}]
    spec:
      queueName: q
      podSets:
        - name: main
          count: 2
          template:
            spec:
              containers: [{name: m, resources: {requests: {nvidia.com/gpu: 4}}}]
    status:
      conditions: [{type: QuotaReserved, status: "False", reason: Pending, message: wait}]
"""


def test_simulate_diagnoses_a_job_waiting_in_kueue_from_the_files_queues(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(WAITING_JOB)
    result = run("simulate", "--cluster", str(path), "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["pending"]
    assert (entry["pod"], entry["kind"], entry["reason"]) == ("team-a/train", "Job", "quota")
    assert (
        "ClusterQueue team-a: nvidia.com/gpu in flavor h100: 8 guaranteed, 6 in use"
        in (entry["evidence"])
    )
    assert "short 6 of the 8 asked" in entry["evidence"]
    table = run("simulate", "--cluster", str(path))
    assert "Job/team-a/train" in table.output, table.output


def test_simulate_makes_kueues_workload_for_a_suspended_job_and_answers_the_same(
    tmp_path: Path,
) -> None:
    # The shipped example: a suspended Job naming a LocalQueue, no Workload in the file.
    example = EXAMPLES / "cluster-kueue-job.yaml"
    result = run("simulate", "--cluster", str(example), "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["pending"]
    assert (entry["pod"], entry["kind"], entry["reason"]) == ("team-a/pretrain", "Job", "quota")
    assert "16 guaranteed, 12 in use" in entry["evidence"]
    assert "short 12 of the 16 asked" in entry["evidence"]
    # The same cluster with the Workload Kueue made written out gives the same diagnosis.
    data = yaml.safe_load(example.read_text())
    job = data.pop("jobs")[0]
    data["kueue"].append(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": "job-pretrain",
                "namespace": "team-a",
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain", "uid": "u1"}
                ],
            },
            "spec": {
                "queueName": "training",
                "podSets": [{"name": "main", "count": 2, "template": job["spec"]["template"]}],
            },
        }
    )
    written = tmp_path / "with-workload.yaml"
    written.write_text(yaml.safe_dump(data))
    again = run("simulate", "--cluster", str(written), "--json")
    assert again.exit_code == 0, again.output
    (same,) = json.loads(again.output)["pending"]
    assert {k: v for k, v in same.items() if k != "workload"} == {
        k: v for k, v in entry.items() if k != "workload"
    }


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
        "version: v1\nnodes:\n  - {name: a, preset: t4}\njobs:\n  - apiVersion: batch/v1\n"
        "    kind: Job\n    metadata: {name: j, namespace: ml}\n    spec:\n      template:\n"
        "        spec:\n          containers: [{name: m, image: i, resources: {limits: "
        "{nvidia.com/gpu: -1}}}]\n",
        "cluster.yaml:11: jobs.0.spec.template.spec.containers.0.resources.limits.nvidia.com/gpu",
        id="job-quantity",
    ),
    pytest.param(
        "version: v1\nnodes:\n  - {name: a, preset: t4}\njobs:\n  - apiVersion: batch/v1\n"
        "    kind: Job\n    metadata: {name: j}\n    spec:\n      parallelism: many\n"
        "      template: {spec: {containers: [{name: m, image: i}]}}\n",
        "cluster.yaml:9: jobs.0.spec.parallelism", id="job-parallelism",
    ),
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
    assert f"no pod and no job waiting in Kueue called {kube_ns}/absent" in missing.output


def test_why_pending_without_an_api_server_fails_in_one_line() -> None:
    result = run("why-pending", "--server", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert result.output.startswith("error: cannot reach the API server")
