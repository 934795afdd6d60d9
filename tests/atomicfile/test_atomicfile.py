"""Atomic JSON state files: a failed write keeps the last good file, a bad file is named.

Every state file of the agent goes through :mod:`nodeagent.atomicfile`; its consumers' tests
(tests/health, tests/agent, tests/dra) check what each does with these errors.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, TypeAdapter

from nodeagent.atomicfile import (
    StateFileError,
    read_json,
    read_json_as,
    write_json_atomic,
    write_text_atomic,
)
from tests.health.fulldisk import small_disk


class Saved(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    generation: int
    name: str


def test_a_write_to_a_full_disk_keeps_the_old_file_and_leaves_nothing_behind() -> None:
    with small_disk() as disk:
        target = disk.path / "state" / "intent.json"
        write_json_atomic(target, {"generation": 1})
        disk.fill()
        with pytest.raises(StateFileError) as caught:
            write_json_atomic(target, {"generation": 2, "pad": "x" * 8192})
        assert str(caught.value) == (
            f"cannot write {target}: the file system is full; free space on it"
        )
        assert read_json(target) == {"generation": 1}
        assert disk.stray_files() == []
        disk.free()
        write_json_atomic(target, {"generation": 2})
        assert read_json(target) == {"generation": 2}


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "history.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"history\.json: not valid JSON"):
        read_json(path)
    with pytest.raises(ValueError, match=r"history\.json: not valid JSON"):
        read_json_as(path, TypeAdapter(Saved))


def test_a_missing_file_is_none_not_an_error(tmp_path: Path) -> None:
    assert read_json(tmp_path / "absent.json") is None
    assert read_json_as(tmp_path / "absent.json", TypeAdapter(Saved)) is None


def test_a_schema_read_names_the_first_bad_field_and_keeps_json_types(tmp_path: Path) -> None:
    path = tmp_path / "saved.json"
    write_json_atomic(path, {"generation": 3, "name": "a"})
    assert read_json_as(path, TypeAdapter(Saved)) == Saved(generation=3, name="a")
    # A number written as a string is damage, not a value to coerce.
    write_json_atomic(path, {"generation": "3", "name": "a"})
    with pytest.raises(ValueError, match=r"saved\.json: generation: ") as caught:
        read_json_as(path, TypeAdapter(Saved))
    assert "\n" not in str(caught.value)
    write_json_atomic(path, {"generation": "x", "name": 1})
    with pytest.raises(ValueError, match=r"generation: .*\(and 1 more\)$"):
        read_json_as(path, TypeAdapter(Saved))


def test_a_directory_in_the_files_place_is_one_state_file_error(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.mkdir()
    for attempt in (
        lambda: write_json_atomic(path, {}),
        lambda: write_text_atomic(path, "x"),
        lambda: read_json(path),
        lambda: read_json_as(path, TypeAdapter(Saved)),
    ):
        with pytest.raises(StateFileError) as caught:
            attempt()
        assert str(path) in str(caught.value)
        assert "\n" not in str(caught.value)
    assert path.is_dir()
    assert list(path.iterdir()) == [], "nothing was written into it"


def test_a_device_or_pipe_in_the_files_place_is_refused_not_replaced(tmp_path: Path) -> None:
    # A rename would replace the node itself: `-o /dev/null`, run as root, would leave a plain
    # file where every program expects the null device.
    pipe = tmp_path / "out.yaml"
    os.mkfifo(pipe)
    for attempt in (lambda: write_text_atomic(pipe, "x"), lambda: write_json_atomic(pipe, {})):
        with pytest.raises(StateFileError) as caught:
            attempt()
        assert str(caught.value) == (
            f"cannot write {pipe}: it is not a regular file (a device, socket or pipe)"
        )
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.yaml"], "no temporary file left"


def test_a_text_write_replaces_the_file_whole_with_the_mode_asked(tmp_path: Path) -> None:
    path = tmp_path / "token"
    write_text_atomic(path, "first", mode=0o600)
    write_text_atomic(path, "second", mode=0o600)
    assert path.read_text() == "second"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["token"]  # no temporary left
