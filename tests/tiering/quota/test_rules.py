"""The tiering service's quota alerts and dashboard: only metrics the service registers,
promtool-clean, and the alert fires when guaranteed quota outgrows healthy capacity."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeagent_tiering.metrics import TieringMetrics
from tests.deploy.tools import require_tool

REPO = Path(__file__).resolve().parents[3]
RULES = REPO / "deploy" / "prometheus" / "nodeagent-tiering-quota-rules.yaml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tests" / "nodeagent-tiering-quota-rules.test.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "nodeagent-tiering-quota.json"
METRIC = re.compile(r"(?<![:\w])(nodeagent_[a-z0-9_]+)")
RECORDED = re.compile(r"\b(tier:[a-z0-9_]+:[a-z0-9_]+)")


def registered() -> set[str]:
    names = set()
    for family in TieringMetrics().registry.collect():
        names.add(family.name)
        if family.type == "counter":  # a labelled counter has no samples yet to name it
            names.add(family.name + "_total")
    return names


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return exprs + [v["definition"] for v in dash["templating"]["list"] if "definition" in v]


@pytest.mark.parametrize("exprs", [rule_exprs, dashboard_exprs], ids=["rules", "dashboard"])
def test_only_metrics_the_service_registers(exprs):
    used = {m for e in exprs() for m in METRIC.findall(e)}
    assert used
    assert used - registered() == set()


def test_the_dashboard_reads_only_recorded_tier_series_and_is_laid_out():
    recorded = {
        r["record"]
        for g in yaml.safe_load(RULES.read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    used = {m for e in dashboard_exprs() for m in RECORDED.findall(e)}
    assert used
    assert used <= recorded
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]],
    ids=["check rules", "test rules"],
)
def test_promtool(args):
    result = subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
