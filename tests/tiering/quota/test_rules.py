"""The tiering service's quota alerts and dashboard: only metrics the service registers, and
the dashboard reads the recorded tier series (promtool, with the alert's unit tests, runs over
every rule file in tests/deploy/test_prometheus_rules.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nodeagent_tiering.metrics import TieringMetrics
from tests.deploy.monitoring import (
    DASHBOARDS_DIR,
    RULES_DIR,
    assert_laid_out,
    dashboard_exprs,
    metrics_used,
    recorded,
    registered_names,
    rule_exprs,
)

RULES = RULES_DIR / "nodeagent-tiering-quota-rules.yaml"
DASHBOARD = DASHBOARDS_DIR / "nodeagent-tiering-quota.json"
RECORDED = re.compile(r"\b(tier:[a-z0-9_]+:[a-z0-9_]+)")


@pytest.mark.parametrize("path", [RULES, DASHBOARD], ids=["rules", "dashboard"])
def test_only_metrics_the_service_registers(path: Path) -> None:
    exprs = rule_exprs(path) if path == RULES else dashboard_exprs(path)
    assert metrics_used(exprs) - registered_names(TieringMetrics().registry) == set()


def test_the_dashboard_reads_only_recorded_tier_series_and_is_laid_out() -> None:
    used = {m for e in dashboard_exprs(DASHBOARD) for m in RECORDED.findall(e)}
    assert used
    assert used <= recorded(RULES)
    assert_laid_out(DASHBOARD)
