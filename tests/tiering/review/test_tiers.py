"""The pool review on a mixed cluster, in all three formats, through the CLI.

It reads every node and every node Event of the cluster, so it runs on the session's second,
private control plane, where no other test leaves drains behind. The tiering controller under
its ServiceAccount labels and drains the nodes first; the review runs as the operator (admin).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from xml.etree import ElementTree

import pytest
import yaml
from kubernetes import client
from typer.testing import CliRunner

from nodeagent import labels as lbl
from nodeagent.cli.tiering import app
from nodeagent.labels import FRAGMENTATION_ANNOTATION, STRANDED_GPUS_ANNOTATION
from nodeagent.published import PublishedGpu, PublishedNode, encode
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.deploy import Identities, install_identities
from nodeagent.testing.kube.nodes import KubeletStandIn, NodeSet, pod_manifest
from nodeagent_tiering.cluster.cluster_api import Kube, api_client
from nodeagent_tiering.cluster.informer import NodeCache
from nodeagent_tiering.cluster.nodes import Node
from nodeagent_tiering.cluster.tier_policy import parse_policy
from nodeagent_tiering.drain.controller import Controller
from nodeagent_tiering.review.render import render_html
from nodeagent_tiering.review.tiers import MIG_CONFIG_LABEL, build_review
from tests.tiering.conftest import POLICY, gpu_labels

NAMESPACE = "review"


@pytest.fixture(scope="module")
def review_plane(private_control_plane: ControlPlane) -> Iterator[tuple[ControlPlane, Identities]]:
    plane = private_control_plane
    identities = install_identities(plane)
    plane.create_namespace(NAMESPACE)
    with KubeletStandIn(plane.api_client()) as kubelets:  # finishes the drain's eviction
        kubelets.synced.wait(30)
        yield plane, identities
    plane.delete_namespace(NAMESPACE)


def controller(plane: ControlPlane, identities: Identities, nodes: NodeSet) -> Controller:
    kube = Kube(api_client(kubeconfig=identities.tiering.kubeconfig.path))
    cache = NodeCache(kube)
    cache.relist()
    policy = parse_policy({**POLICY, "nodes": nodes.selector()})
    # The review counts drains of the last --period-days by their Events' time: the wall clock.
    return Controller(kube, cache, policy, clock=FakeClock(time.time()))


@pytest.fixture(scope="module")
def mixed_cluster(review_plane, tmp_path_factory) -> Iterator[list[str]]:
    """H100 training nodes (one on an old driver, one failing), A100 MIG nodes, L40S, T4."""
    plane, identities = review_plane
    nodes = NodeSet(plane.api_client(), "review")
    spec = {
        "h100-a": gpu_labels(),
        "h100-b": gpu_labels(),
        "h100-c": {**gpu_labels(), lbl.DRIVER_VERSION: "535.104.05"},
        "h100-d": gpu_labels(),
        "a100-a": {**gpu_labels("NVIDIA-A100-SXM4-80GB"), MIG_CONFIG_LABEL: "all-1g.10gb"},
        "a100-b": {**gpu_labels("NVIDIA-A100-SXM4-80GB"), MIG_CONFIG_LABEL: "all-3g.40gb"},
        "l40s-a": gpu_labels("NVIDIA-L40S", nvlink=1),
        "t4-a": gpu_labels("Tesla-T4", count=1, nvlink=1),
        "t4-b": {**gpu_labels("Tesla-T4", count=1, nvlink=1), lbl.STABILITY: "degraded"},
    }
    for suffix, labels in spec.items():
        nodes.create(suffix, labels)
    try:
        for suffix, fragmentation, stranded in (("a100-a", "0.5", "1"), ("a100-b", "0.25", "0")):
            annotations = {
                FRAGMENTATION_ANNOTATION: fragmentation,
                STRANDED_GPUS_ANNOTATION: stranded,
            }
            nodes.patch(suffix, {"metadata": {"annotations": annotations}})
        # l40s-a's agent publishes two shared GPUs: GPU 2 noisy, GPU 5 quiet.
        shared = encode(
            PublishedNode(
                tuple(
                    PublishedGpu(
                        i,
                        "NVIDIA L40S",
                        pods=("team-a/infer-0", "team-b/infer-1") if i in (2, 5) else (),
                        interference={2: 0.8, 5: 0.1}.get(i),
                        shared_workloads=2 if i in (2, 5) else 0,
                    )
                    for i in range(8)
                ),
                allocations_known=True,
            )
        )
        nodes.patch("l40s-a", {"metadata": {"annotations": {lbl.GPU_STATE_ANNOTATION: shared}}})
        core = client.CoreV1Api(plane.api_client())
        core.create_namespaced_pod(NAMESPACE, pod_manifest("train", node_name=nodes.name("h100-d")))
        ctl = controller(plane, identities, nodes)
        ctl.reconcile_once()
        nodes.patch("h100-d", {"metadata": {"labels": {lbl.STABILITY: "unstable"}}})
        condition = {
            "type": "GPUHealthy",
            "status": "False",
            "reason": "Xid79",
            "message": "xid 79",
        }
        core.patch_node_status(
            nodes.name("h100-d"),
            {"status": {"conditions": [condition]}},
            _content_type="application/strategic-merge-patch+json",
        )
        for _ in range(2):  # cordon, evict
            ctl.cache.relist()
            ctl.reconcile_once()
        waiting.pods(
            plane.api_client(),
            NAMESPACE,
            lambda pods: "train" not in pods,
            what="kubelet stand-in: evicted pod train deleted",
        )
        ctl.clock.advance(2)  # the next drain step (a FakeClock on the wall time)
        ctl.cache.relist()
        ctl.reconcile_once()  # drained
        policy = tmp_path_factory.mktemp("review") / "policy.yaml"
        policy.write_text(yaml.safe_dump(POLICY))
        yield ["--kubeconfig", str(plane.admin.path), "--policy", str(policy)]
    finally:
        nodes.delete_all()


def test_report_json(mixed_cluster):
    result = CliRunner().invoke(app, ["report", *mixed_cluster, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    tiers = {t["tier"]: t for t in data["tiers"]}
    assert [t["tier"] for t in data["tiers"]][:4] == ["training", "general", "shared", "quarantine"]
    training = tiers["training"]
    assert (training["nodes"], training["gpus"], training["healthy"]) == (3, 24, 3)
    assert training["driver_drift"] == 1
    assert training["drivers"] == {"550.54.15": 2, "535.104.05": 1}
    general = tiers["general"]
    assert general["mig_layouts"] == {"all-1g.10gb": 1, "all-3g.40gb": 1, "none": 1}
    assert general["fragmentation_ratio"] == pytest.approx(0.375)
    assert general["stranded_gpus"] == 1
    assert tiers["shared"]["degraded"] == 1
    assert tiers["quarantine"]["quarantined"] == 1
    assert training["drains"] == 1, "the drain counts against the tier the node left"
    assert training["drain_causes"] == {"Xid79": 1}
    assert data["capacity_source"] == "annotations"
    sharing = data["shared_gpus"]
    assert (sharing["shared_gpus"], sharing["noisy_gpus"]) == (2, 1)
    assert [(g["gpu"], g["interference_ratio"]) for g in sharing["gpus"]] == [(2, 0.8), (5, 0.1)]
    assert sharing["gpus"][0]["pods"] == ["team-a/infer-0", "team-b/infer-1"]


def test_report_table(mixed_cluster):
    result = CliRunner().invoke(app, ["report", *mixed_cluster])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["TIER", "NODES", "GPUS"]
    training = next(line for line in lines if line.startswith("training"))
    assert re.match(r"training\s+3\s+24\s+3\s+0\s+0\s+0\s+1 \(", training)
    assert "Xid79 x1" in training
    at = lines.index("Shared GPUs by interference")
    assert lines[at + 1].split() == [
        *("NODE", "TIER", "GPU", "WORKLOADS", "INTERFERENCE", "SM", "DRAM", "JUDGED", "PODS")
    ]
    assert lines[at + 2].split()[2:5] == ["2", "2", "0.80"]


def test_report_html_is_self_contained_with_charts(mixed_cluster, tmp_path):
    page = tmp_path / "review.html"
    result = CliRunner().invoke(app, ["report", *mixed_cluster, "--html", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert "<script" not in text
    assert not re.search(r'(src|href)="(https?:)?//', text), "no external resources"
    svgs = re.findall(r"<svg .*?</svg>", text, flags=re.S)
    assert len(svgs) == 4
    for svg in svgs:
        ElementTree.fromstring(svg)  # each chart is well-formed SVG
    assert "<title>quarantined: 1</title>" in text
    assert "<td>training</td><td>3</td><td>24</td>" in text


def test_report_bad_prometheus_url_is_one_line_error(mixed_cluster):
    result = CliRunner().invoke(app, ["report", *mixed_cluster, "--prometheus", "ftp://x"])
    assert result.exit_code == 2
    assert "not an http(s) URL" in result.stderr
    assert "Traceback" not in result.output


def test_policy_error_names_file_and_line(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: v1\ntiers:\n  - name: training\n    min_healty: 2\n")
    args = ["run", "--policy", str(bad), "--server", "https://127.0.0.1:1", "--once"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert f"{bad}:4: tiers[0].min_healty: unknown field" in result.stderr


def test_dry_run_once_prints_and_changes_nothing(review_plane, tmp_path):
    plane, identities = review_plane
    nodes = NodeSet(plane.api_client(), "dry")
    try:
        a = nodes.create("a", gpu_labels())
        b = nodes.create("b", {**gpu_labels(), lbl.STABILITY: "unstable"})
        policy = tmp_path / "policy.yaml"
        policy.write_text(yaml.safe_dump({**POLICY, "nodes": nodes.selector()}))
        before = {s: nodes.get(s)["metadata"]["resourceVersion"] for s in ("a", "b")}
        mark = plane.audit_mark()
        kubeconfig = str(identities.tiering.kubeconfig.path)
        result = CliRunner().invoke(
            app,
            ["run", "--policy", str(policy), "--kubeconfig", kubeconfig, "--dry-run", "--once"],
        )
        assert result.exit_code == 0, result.output
        assert f"would set tier training on node {a}" in result.stdout
        assert "would cordon, taint and start draining" in result.stdout
        assert f"node {b}" in result.stdout
        assert {s: nodes.get(s)["metadata"]["resourceVersion"] for s in ("a", "b")} == before
        audited = plane.audited(mark, user=identities.tiering.user)
        asked = {(r.verb, r.resource) for r in audited if r.resource}  # not discovery
        assert asked == {("list", "nodes")}, "a dry run reads the nodes, nothing else"
    finally:
        nodes.delete_all()


def test_html_charts_with_nothing_to_draw_say_none() -> None:
    # Two tiers, no drain Events: the drain charts say "none", the node chart still draws.
    nodes = [
        Node(f"n{i}", labels={lbl.TIER: tier}, allocatable={"nvidia.com/gpu": 8})
        for i, tier in enumerate(("training", "inference"))
    ]
    review = build_review(nodes, [], policy=None, now_s=time.time(), period_s=86400.0)
    page = render_html(review, generated="now")
    for title in ("Drains per tier", "Drain causes"):
        after = page.split(f"<h2>{title}</h2>", 1)[1].lstrip()
        assert after.startswith("<p>none</p>"), f"{title}: {after[:80]}"
    # Nodes by health draws; GPUs per tier counts what agents published, none here: "none".
    assert len(re.findall(r"<svg ", page)) == 1
    empty = render_html(
        build_review([], [], policy=None, now_s=0.0, period_s=86400.0), generated="now"
    )
    assert "<svg" not in empty
    assert empty.count("<p>none</p>") >= 4
