"""The pool review's fragmentation section, built from the rolling history and a live pass."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from typer.testing import CliRunner

from nodeagent.cli.tiering import app
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent_tiering.cluster.cluster_api import Kube
from nodeagent_tiering.cluster.view import NO_QUEUE
from nodeagent_tiering.pending.history import Day, History, HistoryStore
from nodeagent_tiering.review.fragmentation import (
    fragmentation_section,
    mig_template,
    queue_account,
    queue_change,
    whole_template,
)
from tests.tiering.pending.builders import NOON, diagnose, fragmented


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
    assert section.queues == {
        NO_QUEUE: {
            "days": 1,
            "stranded": round(10 * 59 * 60 / 3600, 2),
            "blocking": round(8 * 59 * 60 / 3600, 2),
            "request": "3 nvidia.com/gpu",
            "change": "ask for 4 GPUs, not 3 (a request template: gpus 1, 2, 4, 8)",
        }
    }


def test_queues_that_fragment_day_after_day_come_first_with_the_change_they_would_make() -> None:
    def day(queues: dict[str, float], sizes: dict[str, str]) -> Day:
        d = Day(observed_s=86400)
        d.queues = {"stranded": dict(queues), "blocking": {}}
        d.queue_sizes = {q: {size: queues[q]} for q, size in sizes.items()}
        return d

    hour = 3600.0
    days = [
        day(
            {"daily": 1 * hour, "burst": 40 * hour},
            {"daily": "6 nvidia.com/gpu", "burst": "2 nvidia.com/gpu"},
        ),
        day(
            {"daily": 2 * hour, "mig": 3 * hour},
            {"daily": "6 nvidia.com/gpu", "mig": "1 nvidia.com/mig-2g.20gb"},
        ),
        day(
            {"daily": 1 * hour, "mig": 1 * hour},
            {"daily": "6 nvidia.com/gpu", "mig": "1 nvidia.com/mig-2g.20gb"},
        ),
    ]
    account = queue_account(days, ["3g.40gb"])
    # "daily" strands a little every day: lasting, so first; "burst" once, however much.
    assert list(account) == ["daily", "mig", "burst"]
    assert account["daily"] == {
        "days": 3,
        "stranded": 4.0,
        "blocking": 0.0,
        "request": "6 nvidia.com/gpu",
        "change": "ask for 8 GPUs, not 6 (a request template: gpus 1, 2, 4, 8)",
    }
    assert account["mig"]["change"] == "ask for 3g.40gb (the MIG template), not 2g.20gb"
    assert account["burst"]["change"].startswith("pack its 2-GPU pods on fewer nodes")
    assert queue_change("12 nvidia.com/gpu", []) == "ask for whole nodes (8 GPUs each), not 12 GPUs"


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
    assert "Queues whose pods make lasting fragmentation" in table.output
    html = CliRunner().invoke(app, ["report", "--html", "/dev/null", *access])
    assert html.exit_code == 0, html.output
