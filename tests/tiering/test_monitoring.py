"""The tiering service's Prometheus rules and Grafana dashboards (the diagnosis's and the
quota's): they name only metrics the service registers, the dashboards read only series the
rules record, and the panels are laid out. promtool and the rules' unit tests run over every
rule file in tests/deploy/test_prometheus_rules.py."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from nodeagent_tiering.service import ServiceMetrics
from tests.deploy import monitoring


@dataclass(frozen=True)
class Shipped:
    rules: Path
    dashboard: Path
    recorded: re.Pattern[str] | None  # the recorded series the dashboard reads, if any


SHIPPED = {
    "pending": Shipped(
        monitoring.RULES_DIR / "nodeagent-tiering-rules.yaml",
        monitoring.DASHBOARDS_DIR / "nodeagent-tiering-pending.json",
        None,  # its panels query the service's series directly
    ),
    "quota": Shipped(
        monitoring.RULES_DIR / "nodeagent-tiering-quota-rules.yaml",
        monitoring.DASHBOARDS_DIR / "nodeagent-tiering-quota.json",
        re.compile(r"\b(tier:[a-z0-9_]+:[a-z0-9_]+)"),
    ),
}
REGISTERED = monitoring.registered_names(ServiceMetrics(CollectorRegistry()).registry)


@pytest.mark.parametrize("shipped", SHIPPED.values(), ids=SHIPPED.keys())
def test_rules_and_dashboard_use_only_registered_metrics(shipped: Shipped) -> None:
    for exprs in (
        monitoring.rule_exprs(shipped.rules),
        monitoring.dashboard_exprs(shipped.dashboard),
    ):
        assert monitoring.metrics_used(exprs) - REGISTERED == set()


@pytest.mark.parametrize("shipped", SHIPPED.values(), ids=SHIPPED.keys())
def test_the_dashboard_is_laid_out(shipped: Shipped) -> None:
    monitoring.assert_laid_out(shipped.dashboard)


def test_the_quota_dashboard_reads_recorded_tier_series_that_exist() -> None:
    shipped = SHIPPED["quota"]
    assert shipped.recorded is not None
    exprs = monitoring.dashboard_exprs(shipped.dashboard)
    used = {m for e in exprs for m in shipped.recorded.findall(e)}
    assert used, "the dashboard reads no recorded series: the pattern or the file is broken"
    assert used <= monitoring.recorded(shipped.rules)


def test_the_pending_dashboard_shows_the_longest_blocked() -> None:
    titles = {p["title"] for p in monitoring.dashboard(SHIPPED["pending"].dashboard)["panels"]}
    assert "Longest blocked by fragmentation" in titles


def test_the_alert_is_about_fragmentation_for_30_minutes() -> None:
    (alert,) = [
        r
        for r in monitoring.rules(SHIPPED["pending"].rules)
        if r.get("alert") == "NodeagentGpuWorkloadsBlockedByFragmentation"
    ]
    assert "contiguity-gpus|contiguity-mig" in alert["expr"]
    assert "> 1800" in alert["expr"]
