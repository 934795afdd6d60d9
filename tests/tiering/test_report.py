"""The pool review on a mixed simulated cluster, in all three formats, through the CLI."""

from __future__ import annotations

import json
import re
from xml.etree import ElementTree

import pytest
import yaml
from typer.testing import CliRunner

from nodeagent import labels as lbl
from nodeagent.cli.tiering import app
from nodeagent.labels import FRAGMENTATION_ANNOTATION, STRANDED_GPUS_ANNOTATION
from nodeagent_tiering.report import MIG_CONFIG_LABEL
from tests.support.kubeapi import make_pod
from tests.tiering.conftest import POLICY, add_nodes, gpu_labels


@pytest.fixture
def mixed_cluster(api, make_controller, tmp_path):
    """H100 training nodes (one on an old driver, one failing), A100 MIG nodes, L40S, T4."""
    add_nodes(
        api,
        {
            "h100-a": gpu_labels(),
            "h100-b": gpu_labels(),
            "h100-c": {**gpu_labels(), lbl.DRIVER_VERSION: "535.104.05"},
            "h100-d": gpu_labels(),
            "a100-a": {**gpu_labels("NVIDIA-A100-SXM4-80GB"), MIG_CONFIG_LABEL: "all-1g.10gb"},
            "a100-b": {**gpu_labels("NVIDIA-A100-SXM4-80GB"), MIG_CONFIG_LABEL: "all-3g.40gb"},
            "l40s-a": gpu_labels("NVIDIA-L40S", nvlink=1),
            "t4-a": gpu_labels("Tesla-T4", count=1, nvlink=1),
            "t4-b": {**gpu_labels("Tesla-T4", count=1, nvlink=1), lbl.STABILITY: "degraded"},
        },
    )
    api.patch_direct(
        "nodes",
        "a100-a",
        {
            "metadata": {
                "annotations": {FRAGMENTATION_ANNOTATION: "0.5", STRANDED_GPUS_ANNOTATION: "1"}
            }
        },
    )
    api.patch_direct(
        "nodes",
        "a100-b",
        {
            "metadata": {
                "annotations": {FRAGMENTATION_ANNOTATION: "0.25", STRANDED_GPUS_ANNOTATION: "0"}
            }
        },
    )
    api.put("pods", make_pod("train", "h100-d"))
    ctl = make_controller()
    ctl.cache.relist()
    ctl.reconcile_once()
    api.patch_direct(
        "nodes",
        "h100-d",
        {
            "metadata": {"labels": {lbl.STABILITY: "unstable"}},
            "status": {
                "conditions": [
                    {
                        "type": "GPUHealthy",
                        "status": "False",
                        "reason": "Xid79",
                        "message": "xid 79",
                    }
                ]
            },
        },
    )
    ctl.cache.relist()
    ctl.reconcile_once()
    ctl.cache.relist()
    ctl.reconcile_once()
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    return ["--server", api.url, "--policy", str(policy)]


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


def test_report_table(mixed_cluster):
    result = CliRunner().invoke(app, ["report", *mixed_cluster])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["TIER", "NODES", "GPUS"]
    training = next(line for line in lines if line.startswith("training"))
    assert re.match(r"training\s+3\s+24\s+3\s+0\s+0\s+0\s+1 \(", training)
    assert "Xid79 x1" in training


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


def test_policy_error_names_file_and_line(api, tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: v1\ntiers:\n  - name: training\n    min_healty: 2\n")
    result = CliRunner().invoke(app, ["run", "--policy", str(bad), "--server", api.url, "--once"])
    assert result.exit_code == 2
    assert f"{bad}:4: tiers[0].min_healty: unknown field" in result.stderr


def test_dry_run_once_prints_and_changes_nothing(api, tmp_path):
    add_nodes(api, {"a": gpu_labels(), "b": {**gpu_labels(), lbl.STABILITY: "unstable"}})
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    rv = api.resource_version
    result = CliRunner().invoke(
        app, ["run", "--policy", str(policy), "--server", api.url, "--dry-run", "--once"]
    )
    assert result.exit_code == 0, result.output
    assert "would set tier training on node a" in result.stdout
    assert "would cordon, taint and start draining" in result.stdout
    assert api.resource_version == rv
