"""The tiering service's input files (issue 32): what the API server would refuse, and files
built to exhaust the reader, end in one line naming the file, the problem and the fix, exit 2.

Through the commands that read them: ``tiering simulate --cluster`` and ``tiering quota render
-f``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent.config.yamlfile import MAX_ALIAS_VALUES, MAX_DEPTH
from nodeagent_tiering.cluster import units
from nodeagent_tiering.cluster.clusterfile import LIMITS

NODES = "version: v1\nnodes:\n  - {name: a, preset: t4}\n"


def pod_with(value: str, field: str = "requests") -> str:
    """A cluster file with one pending pod asking for ``value`` (YAML) GPUs."""
    return (
        NODES + "pods:\n  - apiVersion: v1\n    kind: Pod\n"
        "    metadata: {name: train, namespace: ml}\n    spec:\n      containers:\n"
        f"        - name: m\n          image: i\n          resources:\n            {field}:\n"
        f"              nvidia.com/gpu: {value}\n"
    )


def alias_bomb(key: str, head: str) -> str:
    """``key: *h``, where each of 9 levels of anchors holds 9 aliases of the previous one."""
    lines = [head, "x: &a [x, x, x, x, x, x, x, x, x]"]
    previous = "a"
    for level in "bcdefgh":
        lines.append(f"{level}: &{level} [{', '.join([f'*{previous}'] * 9)}]")
        previous = level
    lines.append(f"{key}: *h")
    return "\n".join(lines) + "\n"


def run(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def one_error(result: Any) -> str:
    """The command failed with exit 2 and exactly one error line, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.output
    return errors[0]


def simulate(tmp_path: Path, content: str | bytes) -> Any:
    path = tmp_path / "cluster.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return run("simulate", "--cluster", str(path), "--json")


CLUSTER_FILES = [
    pytest.param(
        b"version: v1\nnodes:\n  - {name: caf\xe9, preset: t4}\n",
        "cluster.yaml:3: byte 0xe9 is not UTF-8 text; save the file as UTF-8",
        id="not-utf8",
    ),
    pytest.param(
        "version: v1\nnodes: " + "[" * 5000 + "]" * 5000 + "\n",
        f"cluster.yaml:2: nested deeper than {MAX_DEPTH} levels (the depth limit)",
        id="5000-nested-lists",
    ),
    pytest.param(
        alias_bomb("nodes", "version: v1"),
        f"cluster.yaml: YAML aliases expand to more than {LIMITS.max_alias_values} values "
        "(the alias limit",
        id="alias-bomb",
    ),
    pytest.param(
        NODES.replace("preset: t4}", "preset: t4, labels: {'!!bad key': x}}"),
        "cluster.yaml:3: nodes.0.labels: '!!bad key' is not a valid label key",
        id="node-label-key",
    ),
    pytest.param(
        NODES.replace("preset: t4}", "preset: t4, labels: {nodeagent.io/tier: Bad Tier}}"),
        "cluster.yaml:3: nodes.0.labels: 'Bad Tier' is not a valid label value",
        id="node-label-value",
    ),
    pytest.param(
        NODES.replace("preset: t4}", "preset: t4, taints: [{key: a b, effect: NoSchedule}]}"),
        "nodes.0.taints.0.key: 'a b' is not a valid label key",
        id="taint-key",
    ),
]
_FIELD = "cluster.yaml:14: pods.0.spec.containers.0.resources.requests.nvidia.com/gpu"
for value, says in [
    ("-4", "-4 is negative; a count is 0 or more"),
    ("lots", "'lots' is not a quantity"),
    ("true", "True is not a quantity"),
    (str(10**30), f"{10**30} is larger than Kubernetes holds"),
    ("'1e400'", "'1e400' is larger than Kubernetes holds"),
    ("'500m'", "'500m' is not a whole number"),
]:
    CLUSTER_FILES.append(pytest.param(pod_with(value), f"{_FIELD}: {says}", id=f"request-{value}"))
CLUSTER_FILES += [
    pytest.param(
        pod_with("2", field="limits").replace("nvidia.com/gpu", "'bad resource!'"),
        "limits.bad resource!: 'bad resource!' is not a valid resource name (pod ml/train)",
        id="resource-name",
    ),
    pytest.param(
        pod_with("1").replace("namespace: ml}", "namespace: ml, annotations: {'a b': c}}"),
        "pods.0.metadata.annotations: 'a b' is not a valid label key",
        id="annotation-key",
    ),
    pytest.param(
        pod_with("1").replace("namespace: ml}", "namespace: ML}"),
        "pods.0.metadata.namespace: 'ML' is not a valid namespace",
        id="namespace",
    ),
    pytest.param(
        pod_with("1").replace("name: train", "name: Train_1"),
        "pods.0.metadata.name: 'Train_1' is not a valid pod name",
        id="pod-name",
    ),
    pytest.param(
        pod_with("1").replace(
            "      containers:", "      nodeSelector: {'!!bad key': x}\n      containers:"
        ),
        "pods.0.spec.nodeSelector: '!!bad key' is not a valid label key",
        id="node-selector",
    ),
    pytest.param(
        pod_with("1").replace(
            "      containers:", "      affinity: {nodeAffinity: x}\n      containers:"
        ),
        "pods.0.spec.affinity.nodeAffinity: Input should be a valid dictionary",
        id="node-affinity",
    ),
]
_QUEUE = (
    NODES + "kueue:\n  - apiVersion: kueue.x-k8s.io/v1beta2\n    kind: ClusterQueue\n"
    "    metadata: {name: q}\n    spec:\n      resourceGroups:\n"
    "        - coveredResources: [nvidia.com/gpu]\n          flavors: FLAVORS\n"
)
_QUOTA = "[{name: f, resources: [{name: nvidia.com/gpu, nominalQuota: QUOTA}]}]"
_FLAVORS = "cluster.yaml:11: kueue.0.spec.resourceGroups.0.flavors"
for flavors, says in [
    ("x", f"{_FLAVORS}: Input should be a valid list"),
    (_QUOTA.replace("QUOTA", "-5"), "nominalQuota: -5 is negative; a quantity is 0 or more"),
    (_QUOTA.replace("QUOTA", "lots"), "nominalQuota: 'lots' is not a quantity"),
]:
    CLUSTER_FILES.append(
        pytest.param(
            _QUEUE.replace("FLAVORS", flavors),
            f"{says} (ClusterQueue q)" if flavors == "x" else f"{_FLAVORS}.0.resources.0.{says}",
            id=f"cluster-queue-{flavors[:8]}",
        )
    )


@pytest.mark.parametrize(("content", "says"), CLUSTER_FILES)
def test_a_bad_cluster_file_is_one_line_and_exit_2(
    tmp_path: Path, content: str | bytes, says: str
) -> None:
    started = time.monotonic()
    error = one_error(simulate(tmp_path, content))
    assert says in error, error
    if "pods.0." in says:
        assert error.endswith(("(pod ml/train)", "(pod ml/Train_1)", "(pod ML/train)")), error
    assert time.monotonic() - started < 5  # the bomb and the nesting stop at once


def test_a_request_of_2k_gpus_is_2000_not_0(tmp_path: Path) -> None:
    """'2k' was read as 0 GPUs, so the pod vanished from the diagnosis."""
    result = simulate(tmp_path, pod_with("'2k'"))
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)["pending"]
    assert entry["pod"] == "ml/train"
    assert entry["request"] == {"nvidia.com/gpu": 2000}


def test_ten_thousand_pending_pods_on_four_nodes(tmp_path: Path) -> None:
    """The diagnosis scales with what a real cluster holds (bench/tiering_pending.py
    --cluster-file measures it: under 5 s); the bound here leaves room for a loaded CI host."""
    pods = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i}", "namespace": "team"},
            "spec": {
                "containers": [
                    {"name": "m", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}}}
                ]
            },
        }
        for i in range(10_000)
    ]
    nodes = [{"name": f"gpu-{i}", "preset": "dgx-h100"} for i in range(4)]
    path = tmp_path / "cluster.yaml"
    # JSON is YAML, and the stdlib writes it in a blink.
    path.write_text(json.dumps({"version": "v1", "nodes": nodes, "pods": pods}, indent=1))
    started = time.monotonic()
    result = run("simulate", "--cluster", str(path), "--json")
    elapsed = time.monotonic() - started
    assert result.exit_code == 0, result.output[-2000:]
    pending = json.loads(result.output)["pending"]
    assert len(pending) == 10_000
    assert {p["pod"] for p in pending} == {f"team/p-{i}" for i in range(10_000)}
    assert elapsed < 30, elapsed


# --- the quota policy ----------------------------------------------------------------------------

QUOTA = (
    "version: v1\nteams:\n  - name: ml\n    namespaces: [ml]\n    tiers:\n"
    "      t: {resources: {nvidia.com/gpu: {guaranteed: 1}}}\n"
)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        pytest.param(
            QUOTA.encode().replace(b"namespaces: [ml]", b"namespaces: [ml\xff]"),
            "quota.yaml:4: byte 0xff is not UTF-8 text",
            id="not-utf8",
        ),
        pytest.param(
            QUOTA + "x: " + "[" * 3000 + "]" * 3000 + "\n",
            f"quota.yaml:7: nested deeper than {MAX_DEPTH} levels (the depth limit)",
            id="3000-nested-lists",
        ),
        pytest.param(
            alias_bomb("teams", "version: v1"),
            f"quota.yaml: YAML aliases expand to more than {MAX_ALIAS_VALUES} values",
            id="alias-bomb",
        ),
        pytest.param(
            QUOTA.replace("      t:", "      Bad Tier:"),
            "quota.yaml:6: teams.0.tiers.Bad Tier: tier name: 'Bad Tier' must be a valid label "
            "value",
            id="bad-tier",
        ),
        pytest.param(
            QUOTA.replace("guaranteed: 1", f"guaranteed: {10**30}"),
            "teams.0.tiers.t.resources.nvidia.com/gpu.guaranteed: Input should be less than or "
            f"equal to {2**63 - 1}",
            id="nominal-quota-beyond-int64",
        ),
    ],
)
def test_a_bad_quota_policy_is_one_line_and_exit_2(
    tmp_path: Path, content: str | bytes, says: str
) -> None:
    path = tmp_path / "quota.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    started = time.monotonic()
    result = run("quota", "render", "-f", str(path))
    error = one_error(result)
    assert says in error, error
    assert time.monotonic() - started < 5


def test_a_tier_policy_selector_with_a_bad_label_key_is_one_line(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "version: v1\ntiers:\n  - name: training\n    selector:\n"
        "      match_labels: {'!!bad key': x}\n"
    )
    result = run("simulate", "--cluster", str(_write(tmp_path, NODES)), "--policy", str(policy))
    error = one_error(result)
    assert "'!!bad key' is not a valid label key" in error, error
    assert f"{policy}:5:" in error, error


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return path


def test_api_objects_are_read_with_the_one_quantity_parser() -> None:
    """Objects from the API server went through its validation; one made by hand with a value
    it would refuse must not crash the service ('1e400' raised OverflowError) nor read a
    suffix as 0 ('2k')."""
    from nodeagent_tiering.cluster.units import count as quantity
    from nodeagent_tiering.cluster.view import pod_requests

    assert quantity("2k") == 2000
    assert quantity("1e400") == 0
    assert pod_requests({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2k"}}}]}) == {
        "nvidia.com/gpu": 2000
    }
    assert units.amount("1.5Gi") == 1.5 * 2**30
    with pytest.raises(ValueError, match="larger than Kubernetes holds"):
        units.amount("1e400")


def test_match_fields_take_node_names_longer_than_a_label_value() -> None:
    """Label expressions now refuse values no label can hold; matchFields compares node names
    (up to 253 characters), which must keep constraining the pod."""
    from nodeagent_tiering.cluster.nodes import Node
    from nodeagent_tiering.cluster.view import pod_from_object

    name = "gpu-" + "a" * 96
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}  # fmt: skip
    pod = pod_from_object({"metadata": {"name": "p"}, "spec": {"affinity": affinity}})
    (only,) = pod.affinity
    assert only.matches(Node(name=name, labels={}))
    assert not only.matches(Node(name="gpu-b", labels={}))
