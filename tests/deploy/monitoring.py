"""Reading the shipped Prometheus rule files and Grafana dashboards, for the tests that check
them against the metrics each component registers."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "deploy" / "prometheus"
DASHBOARDS_DIR = REPO / "deploy" / "grafana"
# A nodeagent series named in PromQL, not the tail of a recording rule's name.
METRIC = re.compile(r"(?<![:\w])(nodeagent_[a-z0-9_]+)")


def rules(path: Path) -> list[dict[str, Any]]:
    """Every rule of every group in a rule file."""
    return [r for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def rule_exprs(path: Path) -> list[str]:
    return [r["expr"] for r in rules(path)]


def recorded(path: Path) -> set[str]:
    """The series a rule file's recording rules make."""
    return {r["record"] for r in rules(path) if "record" in r}


def dashboard(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def dashboard_exprs(path: Path) -> list[str]:
    """Every panel query and template-variable query of a dashboard."""
    dash = dashboard(path)
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return exprs + [v["definition"] for v in dash["templating"]["list"] if "definition" in v]


def assert_laid_out(path: Path) -> None:
    """Panel ids are unique and every panel fits Grafana's 24-column grid."""
    panels = dashboard(path)["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate panel ids"
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, f"{path.name}: {p['title']} is off the grid"


def metrics_used(exprs: list[str]) -> set[str]:
    used = {m for e in exprs for m in METRIC.findall(e)}
    assert used, "no nodeagent metric found: the regex or the file is broken"
    return used


def registered_names(registry: CollectorRegistry) -> set[str]:
    """Every series name a registry can expose, counters with their ``_total`` even before
    their first increment (a labelled counter has no sample to name it until then)."""
    names: set[str] = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
    return names
