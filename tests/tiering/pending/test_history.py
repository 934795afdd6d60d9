"""The rolling history the leader keeps of pending GPU workloads."""

from __future__ import annotations

from datetime import UTC, datetime

from nodeagent_tiering.pending.history import (
    KEEP_DAYS,
    MAX_STEP_S,
    History,
)
from tests.tiering.pending.builders import NOON, diagnose, fragmented

GPU = "nvidia.com/gpu"


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
