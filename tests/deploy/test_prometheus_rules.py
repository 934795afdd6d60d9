"""Every shipped Prometheus rule file passes `promtool check rules` and its unit tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.deploy.monitoring import RULES_DIR
from tests.deploy.tools import require_tool

RULE_FILES = sorted(RULES_DIR.glob("*.yaml"))


def _tests_of(rule_file: Path) -> Path:
    return RULES_DIR / "tests" / f"{rule_file.stem}.test.yaml"


def _promtool(*args: str) -> None:
    result = subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULES_DIR / "tests",
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_rule_files_and_each_has_unit_tests() -> None:
    assert len(RULE_FILES) >= 3
    for rule_file in RULE_FILES:
        assert _tests_of(rule_file).is_file(), f"{rule_file.name} has no promtool unit tests"


@pytest.mark.integration
@pytest.mark.parametrize("rule_file", RULE_FILES, ids=[p.name for p in RULE_FILES])
def test_promtool_check_rules(rule_file: Path) -> None:
    _promtool("check", "rules", str(rule_file))


@pytest.mark.integration
@pytest.mark.parametrize("rule_file", RULE_FILES, ids=[p.name for p in RULE_FILES])
def test_promtool_test_rules(rule_file: Path) -> None:
    _promtool("test", "rules", str(_tests_of(rule_file)))
