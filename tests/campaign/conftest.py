"""The fault campaign's bookkeeping: how many cases each scenario tried, survived and lost.

The campaign is bounded: in CI each scenario runs a small seeded sample (about a minute in
all on a 2-core machine); ``NODEAGENT_CAMPAIGN=long`` runs the full sizes recorded in
docs/benchmarks.md. ``NODEAGENT_CAMPAIGN_REPORT=FILE`` appends every scenario's counts to FILE
as JSON lines, which is how those numbers are collected.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

LONG = os.environ.get("NODEAGENT_CAMPAIGN") == "long"


def size(ci: int, long: int) -> int:
    """How many cases a scenario tries: ``ci`` by default, ``long`` with the long knob."""
    return long if LONG else ci


@dataclass
class Tally:
    """One scenario's counts; ``lost`` cases keep their first messages for the failure."""

    scenario: str
    tried: int = 0
    survived: int = 0
    lost: list[str] = field(default_factory=list)

    def ok(self) -> None:
        self.tried += 1
        self.survived += 1

    def lose(self, why: str) -> None:
        self.tried += 1
        self.lost.append(why)

    def line(self) -> str:
        return (
            f"campaign {self.scenario}: tried {self.tried}, survived {self.survived}, "
            f"lost {len(self.lost)}"
        )

    def verify(self) -> None:
        """Report the counts, then fail on any lost case (or on a scenario that tried none)."""
        print(self.line())
        report = os.environ.get("NODEAGENT_CAMPAIGN_REPORT")
        if report:
            counts = {
                "scenario": self.scenario,
                "tried": self.tried,
                "survived": self.survived,
                "lost": len(self.lost),
            }
            with Path(report).open("a", encoding="utf-8") as fh:
                fh.write(json.dumps(counts) + "\n")
        assert self.tried > 0, "the scenario tried nothing"
        assert not self.lost, f"{self.line()}; first: {self.lost[:3]}"


@pytest.fixture
def tally(request: pytest.FixtureRequest) -> Tally:
    """A tally named after the test; the test ends with ``tally.verify()``."""
    return Tally(request.node.name.removeprefix("test_"))
