"""Stability score: decay, hysteresis, flapping and persistence (fake clock, no sleeps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter

from nodeagent.atomicfile import read_json, read_json_as, write_json_atomic
from nodeagent.config.health import HealthSection
from nodeagent.health.score import (
    FaultRecord,
    SavedScore,
    StabilityLevel,
    StabilityScore,
)

HOUR = 3600.0
CFG = HealthSection(half_life_s=HOUR)  # 1 h half-life keeps the arithmetic readable


def rec(t: float, w: float) -> FaultRecord:
    return FaultRecord(t, w, 0, "test")


@pytest.mark.parametrize(
    ("age_s", "expected"),
    [
        pytest.param(0.0, 8.0, id="fresh"),
        pytest.param(HOUR, 4.0, id="one half-life"),
        pytest.param(3 * HOUR, 1.0, id="three half-lives"),
    ],
)
def test_score_halves_every_half_life(age_s: float, expected: float) -> None:
    score = StabilityScore(CFG)
    score.record(rec(1000.0, 8.0))
    assert score.score(1000.0 + age_s) == pytest.approx(expected)


def test_levels_rise_at_enter_thresholds_and_fall_only_below_exit() -> None:
    score = StabilityScore(CFG)  # degraded 4/2, unstable 12/6
    t = 0.0
    score.record(rec(t, 12.0))
    assert score.level(t) is StabilityLevel.UNSTABLE
    # After one half-life the score is 6.0: not below unstable_exit yet, still unstable.
    assert score.level(t + HOUR) is StabilityLevel.UNSTABLE
    # Just over: 5.99 < 6 -> degraded (not stable: still >= degraded_exit).
    assert score.level(t + HOUR + 10) is StabilityLevel.DEGRADED
    # log2(12/2) = 2.585 half-lives to reach 2.0: degraded until then...
    assert score.level(t + 2.5 * HOUR) is StabilityLevel.DEGRADED
    # ...and stable after, even though 2.0 > 0 and the score never reached zero.
    assert score.level(t + 2.6 * HOUR) is StabilityLevel.STABLE


def test_hysteresis_holds_a_level_while_the_score_hovers() -> None:
    score = StabilityScore(CFG)
    score.record(rec(0.0, 4.0))  # reaches degraded_enter
    assert score.level(0.0) is StabilityLevel.DEGRADED
    # Decays to ~3 (below enter, above exit): stays degraded.
    assert score.level(0.4 * HOUR) is StabilityLevel.DEGRADED
    # A stable node at the same score of ~3 would not become degraded.
    fresh = StabilityScore(CFG)
    fresh.record(rec(0.0, 3.0))
    assert fresh.level(0.0) is StabilityLevel.STABLE


def test_flapping_makes_the_node_unstable_until_the_window_empties() -> None:
    cfg = HealthSection(half_life_s=HOUR, flap_window_s=600.0, flap_transitions=4)
    score = StabilityScore(cfg)
    for i in range(3):
        score.transition(i * 60.0)
    assert score.level(180.0) is StabilityLevel.STABLE
    score.transition(240.0)
    assert score.flapping
    assert score.level(240.0) is StabilityLevel.UNSTABLE
    # Two transitions left in the window at t=700 (120 and 240): 2 is not below 4/2 -> still.
    assert score.level(700.0) is StabilityLevel.UNSTABLE
    # At t=790 only the one at 240 is in the window: below half -> flapping ends.
    assert score.level(790.0) is StabilityLevel.STABLE


def test_negligible_records_are_pruned() -> None:
    score = StabilityScore(CFG)
    score.record(rec(0.0, 1.0))
    score.update(20 * HOUR)  # 2^-20 < 1e-3
    assert score.records == []


def test_state_round_trips_through_an_atomic_file(tmp_path: Path) -> None:
    score = StabilityScore(CFG)
    score.record(rec(0.0, 20.0))
    score.transition(5.0)
    path = tmp_path / "h" / "history.json"
    write_json_atomic(path, score.saved().model_dump(mode="json", by_alias=True))
    assert [p.name for p in path.parent.iterdir()] == ["history.json"]  # no temp file left
    assert read_json(path) == {
        "score_level": "unstable",
        "flapping": False,
        "records": [{"t": 0.0, "w": 20.0, "gpu": 0, "reason": "test"}],
        "transitions": [5.0],
    }
    again = StabilityScore(CFG)
    saved = read_json_as(path, TypeAdapter(SavedScore))
    assert saved is not None
    again.restore(saved)
    assert again.level(10.0) is StabilityLevel.UNSTABLE
    assert again.score(10.0) == pytest.approx(score.score(10.0))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"degraded_exit": 5.0}, "degraded_exit", id="exit above enter"),
        pytest.param({"unstable_exit": 20.0}, "unstable_exit", id="unstable exit above enter"),
        pytest.param({"half_life_s": 0.0}, "half_life_s", id="zero half-life"),
        pytest.param({"ignore_xids": (13,), "fatal_xids": (13,)}, "both", id="xid twice"),
    ],
)
def test_config_validation(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HealthSection(**change)  # type: ignore[arg-type]
