"""Every metric the service registers is listed in docs/tiering.md, and nothing else is."""

from __future__ import annotations

import re
from pathlib import Path

from nodeagent_tiering.service import ServiceMetrics

DOC = Path(__file__).resolve().parents[2] / "docs" / "tiering.md"


def test_metrics_section_matches_the_registry():
    section = DOC.read_text().split("## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(nodeagent_tiering_[a-z_]+)`", section, flags=re.M))
    registered = {m.name for m in ServiceMetrics().registry.collect()}
    # prometheus_client drops the _total suffix from counter family names.
    registered = {name + "_total" if f"{name}_total" in documented else name for name in registered}
    assert registered == documented
