"""The rolling history and the pool review's fragmentation section built from it."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent_tiering.history import (
    KEEP_DAYS,
    MAX_STEP_S,
    History,
    HistoryStore,
    fragmentation_section,
    mig_template,
    whole_template,
)
from nodeagent_tiering.kube import Kube
from tests.tiering.pending.builders import Cluster, diagnose

GPU = "nvidia.com/gpu"
NOON = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()


def fragmented() -> Cluster:
    # team "busy" runs 3-GPU pods on both nodes: 5 + 5 free, a pending 8-GPU pod waits.
    c = Cluster().whole("a", used=[3]).whole("b", used=[3])
    return c.pending("big", {GPU: 8}, namespace="research")


def test_a_pass_counts_for_the_time_since_the_last_one_capped() -> None:
    view = fragmented().view()
    result = diagnose(view)
    history = History()
    history.observe(view, result, NOON)
    history.observe(view, result, NOON + 60)
    history.observe(view, result, NOON + 60 + 3600)  # the service was down for an hour
    (day,) = history.days.values()
    assert day.observed_s == 60 + MAX_STEP_S
    assert day.pending == {"contiguity-gpus": 60 + MAX_STEP_S}
    assert day.peak == {"contiguity-gpus": 1}
    assert day.blocked == {
        "ns": {"research": 8 * (60 + MAX_STEP_S)},
        "size": {f"8 {GPU}": 8 * (60 + MAX_STEP_S)},
    }
    # 5 free GPUs per node, smallest blocked request 8: all 10 stranded, beside the 3-GPU pods.
    assert day.stranded_gpus["ns"] == {"busy": 10 * (60 + MAX_STEP_S)}
    assert day.stranded_gpus["size"] == {f"3 {GPU}": 10 * (60 + MAX_STEP_S)}
    assert day.free_blocks == {"training": {"5": 10 * (60 + MAX_STEP_S)}}


def test_days_roll_over_and_only_the_last_ones_are_kept() -> None:
    view = fragmented().view()
    result = diagnose(view)
    history = History()
    for day in range(KEEP_DAYS + 5):
        history.observe(view, result, NOON + day * 86400)
    assert len(history.days) == KEEP_DAYS
    assert min(history.days) == datetime.fromtimestamp(NOON + 5 * 86400, UTC).strftime("%Y-%m-%d")
    again = History.from_text(history.to_text())
    assert sorted(again.days) == sorted(history.days)
    assert len(history.to_text()) < 256 * 1024


def test_templates_follow_the_free_blocks() -> None:
    # Most free GPU-time sits in blocks of 5: 4-GPU requests would have used 80% of it.
    assert whole_template({"5": 1000.0}) == (4, 0.8)
    assert whole_template({"8": 100.0, "1": 100.0}) == (8, 0.5)
    assert whole_template({}) is None
    assert mig_template(800.0, {"1g.10gb": 700.0, "3g.40gb": 400.0}) == ("1g.10gb", 0.875)
    assert mig_template(0.0, {"1g.10gb": 1.0}) is None


def test_the_section_sums_the_period_and_recommends_per_tier() -> None:
    view = fragmented().view()
    result = diagnose(view)
    history = History()
    for step in range(0, 3600, 60):
        history.observe(view, result, NOON + step)
    history.observe(view, result, NOON - 40 * 86400)  # outside a 30-day period
    section = fragmentation_section(history, now_s=NOON + 3600, period_s=30 * 86400, current=result)
    assert section.days == 1
    assert section.now == {"contiguity-gpus": 1}
    assert section.pending["contiguity-gpus"] == round(59 * 60 / 3600, 2)
    assert list(section.blocked_ns) == ["research"]
    assert list(section.stranding_ns) == ["busy"]
    assert section.templates["training"]["gpus"] == {"size": 4, "share": 0.8}


def test_the_report_shows_the_section_from_the_configmap(
    control_plane: ControlPlane, kube_ns: str
) -> None:
    view = fragmented().view()
    result = diagnose(view)
    history = History()
    now = datetime.now(UTC).timestamp()
    history.observe(view, result, now - 120)
    history.observe(view, result, now - 60)
    HistoryStore(Kube(control_plane.api_client()), kube_ns).save(history, now)
    access = ["--kubeconfig", str(control_plane.admin.path), "--namespace", kube_ns]
    out = CliRunner().invoke(app, ["report", "--json", *access])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)["fragmentation"]
    assert data["blocked_ns"] == {"research": round(8 * 60 / 3600, 2)}
    assert data["source"] == f"ConfigMap {kube_ns}/nodeagent-tiering-history, live pass"
    table = CliRunner().invoke(app, ["report", *access])
    assert table.exit_code == 0, table.output
    assert "Pending GPU workloads by reason" in table.output
    assert "Recommended request-size templates" in table.output
    html = CliRunner().invoke(app, ["report", "--html", "/dev/null", *access])
    assert html.exit_code == 0, html.output
