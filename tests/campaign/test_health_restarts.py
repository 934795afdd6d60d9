"""Agent restarts at random moments across a fault and its recovery, and history files of every
wrong shape.

A restart case survives when no device comes back Healthy before its fault cleared plus the
whole hold (model) or quiet period (device plugin), however the agent stopped (SIGTERM: a final
save; SIGKILL: none) and however long it was down. A history case survives when the model
starts (no exception), sets an unusable file aside, and reports the node as unknown, never as
"stable", until its first sample.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeagent.agent.backend import open_node
from nodeagent.config.health import HealthSection
from nodeagent.health.model import HealthModel
from nodeagent.health.score import StabilityLevel
from nodeagent.runtime.health_source import HealthState
from nodeagent.sim.control import SimControl
from nodeagent.testing.clock import FakeClock
from nodeagent.testing.health import ScriptedHealth
from nodeagent_device_plugin.withheld import HealthTracker
from tests.campaign.conftest import Tally, size

QUIET = 30.0


def test_restarts_across_a_fault_never_shorten_the_hold(tmp_path: Path, tally: Tally) -> None:
    rng = random.Random(3)
    sim = tmp_path / "sim"
    control = SimControl(sim, "a30x4")
    node = open_node(simulate="a30x4", state_dir=sim)
    uuid = node.info(3).uuid
    config = HealthSection(recovery_quiet_s=QUIET)
    for case in range(size(ci=60, long=600)):
        clock = FakeClock()
        history = tmp_path / f"h{case}" / "history.json"
        control.clear(3)
        fault_s, tick = rng.uniform(2, 40), rng.choice((0.5, 1.0))
        restarts = sorted(rng.uniform(0, fault_s + QUIET + 10) for _ in range(rng.randint(1, 3)))
        model = HealthModel(config, history_path=history, clock=clock)
        model.on_snapshot(node.snapshot())
        control.inject("lost", 3)
        start, last_seen, healthy_at = clock(), None, None
        cleared = False
        # Samples, not seconds: a long downtime must not use up the case.
        for _ in range(int((fault_s + QUIET * 3) / tick)):
            clock.advance(tick)
            if not cleared and clock() - start >= fault_s:
                control.clear(3)
                cleared = True
            if restarts and clock() - start >= restarts[0]:
                restarts.pop(0)
                if rng.random() < 0.5:
                    model.save(final=True)  # SIGTERM; SIGKILL saves nothing more
                clock.advance(rng.choice((1.0, 5.0, 400.0)))  # down for a moment, or long
                model = HealthModel(config, history_path=history, clock=clock)
            snapshot = node.snapshot()
            if not cleared:
                last_seen = clock()  # the last sample that saw the GPU lost
            model.on_snapshot(snapshot)
            if rng.random() < 0.9:
                model.save()  # the reporter saves about once a second
            if cleared and model.device_health()[uuid].state is HealthState.HEALTHY:
                healthy_at = clock()
                break
        cleared_at = last_seen  # the quiet period counts from the last sight of the fault
        if healthy_at is None or cleared_at is None:
            tally.lose(f"case {case}: never recovered")
        elif healthy_at < cleared_at + QUIET:
            tally.lose(
                f"case {case}: healthy {healthy_at - cleared_at:.1f}s after it was last seen"
            )
        else:
            tally.ok()
    control.clear(3)
    node.close()
    tally.verify()


def test_device_plugin_restarts_never_shorten_the_quiet_period(
    tmp_path: Path, tally: Tally
) -> None:
    rng = random.Random(9)
    for case in range(size(ci=200, long=2000)):
        state = tmp_path / f"w{case}.json"
        mono, wall = FakeClock(1000.0), FakeClock(1_700_000_000.0)
        source = ScriptedHealth()
        source.set("GPU-a", HealthState.UNHEALTHY)
        tracker = HealthTracker(QUIET, lambda: None, mono, state_file=state, wall=wall)
        tracker.attach(source)
        cleared_at: float | None = None
        back: float | None = None
        for _ in range(200):
            step = rng.choice((0.5, 1.0, 3.0))
            mono.advance(step)
            wall.advance(step)
            if cleared_at is None and rng.random() < 0.1:
                source.set("GPU-a", HealthState.HEALTHY)
                cleared_at = wall()
            if rng.random() < 0.05:  # restart; down for a while
                tracker.detach()
                down = rng.choice((1.0, 10.0, 100.0))
                wall.advance(down)
                mono = FakeClock(5000.0 * (case + 1))  # a new process: a new monotonic clock
                tracker = HealthTracker(QUIET, lambda: None, mono, state_file=state, wall=wall)
                tracker.attach(source)
            tracker.poll()
            if cleared_at is not None and tracker.reason("GPU-a") is None:
                back = wall()
                break
        if cleared_at is None:
            tally.ok()  # never cleared: withheld throughout, which is right
        elif back is not None and back < cleared_at + QUIET:
            tally.lose(f"case {case}: advertised {back - cleared_at:.1f}s after clearing")
        else:
            tally.ok()
    tally.verify()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
# Shapes close to a real history, so the cases reach past the version check.
KEYS = ("version", "saved_s", "score", "faults", "records", "transitions", "score_level")
history_like = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 1, 1, 2, "1", None])},
    optional={
        "score": st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4),
        "faults": st.lists(
            st.dictionaries(
                st.sampled_from(
                    ("gpu", "uuid", "gi", "key", "state", "reason", "action", "first", "last")
                ),
                json_values,
                max_size=9,
            ),
            max_size=3,
        )
        | json_values,
    },
)


def test_history_files_of_every_wrong_shape(tmp_path: Path, tally: Tally) -> None:
    config = HealthSection()
    cases = [0]

    @settings(
        max_examples=size(ci=300, long=3000),
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.one_of(history_like, json_values, st.binary(max_size=40)))
    def one(content: Any) -> None:
        cases[0] += 1
        history = tmp_path / f"c{cases[0]}" / "history.json"
        history.parent.mkdir()
        if isinstance(content, bytes):
            history.write_bytes(content)
        else:
            history.write_text(json.dumps(content))
        try:
            model = HealthModel(config, history_path=history, clock=FakeClock())
        except Exception as exc:  # noqa: BLE001 - counting what escapes is the point
            tally.lose(f"{content!r}: {type(exc).__name__}: {exc}")
            return
        node = model.node_health()
        if node.history_errors:
            aside = list(history.parent.glob("history.json.unusable-*"))
            if history.exists() or len(aside) != 1:
                tally.lose(f"{content!r}: not set aside")
            elif node.level is not StabilityLevel.UNKNOWN:
                tally.lose(f"{content!r}: starts {node.level} with no history")
            else:
                tally.ok()
        elif node.level is StabilityLevel.UNKNOWN:
            tally.lose(f"{content!r}: accepted, yet the level is unknown")
        else:
            tally.ok()  # a file that is a valid (if odd) history, restored as such

    one()
    tally.verify()
