"""The shipped Prometheus rules and Grafana dashboard: cataloged metrics only, promtool-clean."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from nodeagent_exporters.catalog import CATALOG

ROOT = Path(__file__).parents[2]
RULES = ROOT / "deploy" / "prometheus" / "nodeagent-rules.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "tests" / "nodeagent-rules.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "nodeagent-pools.json"
# Series Prometheus itself makes: allowed in rules without being ours.
BUILTIN = {"up"}
METRIC = re.compile(r"(?<![:\w])(nodeagent_[a-z0-9_]+)")
RECORDED = re.compile(r"\b(pool:[a-z0-9_]+:[a-z0-9_]+)")


def rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


def recorded_names() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    return exprs


@pytest.mark.parametrize(
    "exprs",
    [pytest.param(rule_exprs, id="rules"), pytest.param(dashboard_exprs, id="dashboard")],
)
def test_only_cataloged_metrics_are_used(exprs: object) -> None:
    used = {m for e in exprs() for m in METRIC.findall(e)}  # type: ignore[operator]
    assert used, "no nodeagent metric found: the regex or the file is broken"
    assert used - set(CATALOG) == set()


def test_dashboard_uses_only_recorded_pool_series() -> None:
    used = {m for e in dashboard_exprs() for m in RECORDED.findall(e)}
    assert used
    assert used - recorded_names() == set()


def test_rules_use_no_unknown_bare_series() -> None:
    # `up` is Prometheus' own; anything else un-prefixed would be a typo of ours.
    for expr in rule_exprs():
        for name in re.findall(r"(?<![\w:\"])([a-z_]+)\{", expr):
            assert name in BUILTIN or name.startswith("nodeagent_"), (name, expr)


def test_dashboard_panels_are_laid_out() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in dash["panels"] if p["type"] == "row"}
    assert titles == {"Pool health", "Fragmentation", "MIG layout", "Driver drift", "Shared GPUs"}
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool is missing in CI: apt-get install prometheus")
        pytest.skip("promtool not installed (Debian package prometheus)")
    return path


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["check", "rules", str(RULES)], id="check rules"),
        pytest.param(["test", "rules", str(RULE_TESTS)], id="test rules"),
    ],
)
def test_promtool(args: list[str]) -> None:
    result = subprocess.run(
        [_promtool(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr
