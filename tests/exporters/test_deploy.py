"""The shipped Prometheus rules and Grafana dashboard: cataloged metrics only (promtool runs
over every rule file in tests/deploy/test_prometheus_rules.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeagent_exporters.catalog import CATALOG
from tests.deploy.monitoring import (
    DASHBOARDS_DIR,
    RULES_DIR,
    assert_laid_out,
    dashboard,
    dashboard_exprs,
    metrics_used,
    recorded,
    rule_exprs,
)

RULES = RULES_DIR / "nodeagent-rules.yaml"
DASHBOARD = DASHBOARDS_DIR / "nodeagent-pools.json"
# Series Prometheus itself makes: allowed in rules without being ours.
BUILTIN = {"up"}
RECORDED = re.compile(r"\b(pool:[a-z0-9_]+:[a-z0-9_]+)")


@pytest.mark.parametrize("path", [RULES, DASHBOARD], ids=["rules", "dashboard"])
def test_only_cataloged_metrics_are_used(path: Path) -> None:
    exprs = rule_exprs(path) if path == RULES else dashboard_exprs(path)
    assert metrics_used(exprs) - set(CATALOG) == set()


def test_dashboard_uses_only_recorded_pool_series() -> None:
    used = {m for e in dashboard_exprs(DASHBOARD) for m in RECORDED.findall(e)}
    assert used
    assert used - recorded(RULES) == set()


def test_rules_use_no_unknown_bare_series() -> None:
    # `up` is Prometheus' own; anything else un-prefixed would be a typo of ours.
    for expr in rule_exprs(RULES):
        for name in re.findall(r"(?<![\w:\"])([a-z_]+)\{", expr):
            assert name in BUILTIN or name.startswith("nodeagent_"), (name, expr)


def test_dashboard_panels_are_laid_out() -> None:
    assert_laid_out(DASHBOARD)
    titles = {p["title"] for p in dashboard(DASHBOARD)["panels"] if p["type"] == "row"}
    assert titles == {
        "Pool health",
        "Fragmentation",
        "MIG layout",
        "Driver drift",
        "Shared GPUs",
        "Profiling",
    }
