"""The YAML reader's limits: each is counted while the data is built, and the error names it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodeagent.config.errors import ConfigError
from nodeagent.config.yamlfile import CONFIG, Limits, parse_document, read_document

SMALL = Limits(max_bytes=1000, max_depth=4, max_values=50, max_alias_values=20)


def bomb(fan: int, height: int) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * fan)}]"]
    for level in range(1, height):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * fan)}]")
    return "\n".join(lines) + f"\ntop: *l{height - 1}\n"


def refused(text: str, limits: Limits = SMALL) -> str:
    with pytest.raises(ConfigError) as info:
        parse_document(text, "f.yaml", limits)
    (problem,) = info.value.problems
    return str(problem)


def test_each_limit_is_named_alone() -> None:
    assert refused("a: [[[[[1]]]]]\n") == (
        "f.yaml:1: nested deeper than 4 levels (the depth limit); flatten the lists and mappings"
    )
    assert refused("a: &a [1, 2, 3, 4, 5]\nb: [*a, *a, *a, *a, *a]\n").startswith(
        "f.yaml: YAML aliases expand to more than 20 values (the alias limit"
    )
    many = "a: [" + ", ".join(["1"] * 60) + "]\n"
    assert refused(many) == (
        "f.yaml: holds more than 50 values (the value limit); split it into smaller files"
    )


def test_values_written_out_are_no_alias_expansion() -> None:
    """Only values reached through an alias count against the alias limit: 40 plain values
    pass a limit of 20 alias values, and a shared snippet within it is read, merges included."""
    plain = "a: [" + ", ".join(["1"] * 40) + "]\n"
    assert len(parse_document(plain, "f.yaml", SMALL).data["a"]) == 40
    shared = "d: &d {x: 1, y: 2}\ne:\n  <<: *d\n  z: 3\nf: *d\n"
    assert parse_document(shared, "f.yaml", SMALL).data == {
        "d": {"x": 1, "y": 2},
        "e": {"x": 1, "y": 2, "z": 3},
        "f": {"x": 1, "y": 2},
    }


def test_a_nine_by_nine_alias_bomb_stops_at_once() -> None:
    """9 levels of 9 aliases: 387 million values if expanded; refused after 10,000."""
    started = time.monotonic()
    message = refused(bomb(9, 9), CONFIG)
    assert "more than 10000 values (the alias limit" in message
    assert time.monotonic() - started < 1


def test_read_document_names_the_size_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("a: " + "x" * 5000 + "\n")
    with pytest.raises(ConfigError) as info:
        read_document(path, Limits(max_bytes=4096, size_hint="split it"))
    assert [str(p) for p in info.value.problems] == [
        f"{path}: larger than 4 KiB (the size limit); split it"
    ]
