"""Every file nodeagent reads refuses bad bytes, tags, syntax and shapes in one line each.

The same cases run through each loader (agent config, MIG layouts, MIG hooks, tier policy):
they share one reader, and this keeps it that way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.config.errors import ConfigError
from nodeagent.config.schema import load_agent_config
from nodeagent.config.yamlfile import MAX_ALIAS_VALUES, MAX_BYTES, MAX_DEPTH
from nodeagent_mig.config import load_config, load_hooks
from nodeagent_tiering.cluster.tier_policy import load_policy


def _agent(path: Path) -> Any:
    return load_agent_config(path, environ={})


# Each loader with the smallest valid file of its kind.
KINDS: list[Any] = [
    pytest.param(_agent, "version: v1\n", id="agent-config"),
    pytest.param(
        load_config,
        "version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: false\n",
        id="mig-layout",
    ),
    pytest.param(load_hooks, "version: v1\nhooks: {}\n", id="mig-hooks"),
    pytest.param(load_policy, "version: v1\ntiers:\n  - name: all\n", id="tier-policy"),
]
LOADERS = [pytest.param(p.values[0], id=p.id) for p in KINDS]

# An alias bomb: each level refers to the previous one ten times (10^7 values at the end).
BOMB = b"version: v1\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + b"".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n".encode() for i in range(1, 8)
)

BAD_CONTENT = [
    pytest.param(
        b"version: v1\nnode:\n  name: caf\xe9\n", 3, "byte 0xe9 is not UTF-8", id="latin-1"
    ),
    pytest.param(b"\xff\xfeversion: v1\n", 1, "byte 0xff is not UTF-8", id="utf-16-bom"),
    pytest.param(
        b"version: v1\nx: !!python/object:os.system {}\n",
        2,
        "YAML tag !!python/object:os.system is not supported",
        id="python-tag",
    ),
    pytest.param(
        b"version: v1\nx: !foo bar\n", 2, "YAML tag !foo is not supported", id="local-tag"
    ),
    pytest.param(b"version: v1\nx: !!set {a}\n", 2, "YAML tag !!set", id="set-tag"),
    pytest.param(b"version: v1\nx: !!int abc\n", 2, "'abc' is not a valid !!int", id="bad-int"),
    pytest.param(b"version: v1\nx: [1, 2\n", 3, "not valid YAML", id="syntax"),
    pytest.param(b"version: v1\n  x: 1\n", 2, "not valid YAML", id="indentation"),
    pytest.param(
        b"version: v1\n---\nversion: v1\n", 2, "more than one YAML document", id="two-docs"
    ),
    pytest.param(b"", None, "the file is empty", id="empty"),
    pytest.param(b"# nothing but a comment\n", None, "the file is empty", id="comment-only"),
    pytest.param(b"- version: v1\n", 1, "holds a list", id="top-level-list"),
    pytest.param(b"v1\n", 1, "holds the single value 'v1'", id="top-level-scalar"),
    pytest.param(b"version: v1\nx: 1\nx: 2\n", 3, "x: given twice", id="duplicate-key"),
    pytest.param(b"version: v1\n\x00\n", 2, "character #x0000 is not allowed", id="nul"),
    pytest.param(b"version: v1\n? [a, b]\n: 1\n", 2, "must be plain text", id="list-key"),
    pytest.param(
        b"version: v1\na: &a [*a]\n",
        None,
        f"nested deeper than {MAX_DEPTH} levels (the depth limit)",
        id="recursive-alias",
    ),
    pytest.param(
        BOMB,
        None,
        f"YAML aliases expand to more than {MAX_ALIAS_VALUES} values (the alias limit",
        id="alias-bomb",
    ),
    pytest.param(
        b"version: v1\nx: " + b"[" * 65 + b"]" * 65 + b"\n",
        2,
        f"nested deeper than {MAX_DEPTH} levels (the depth limit)",
        id="deep",
    ),
    pytest.param(
        b"version: v1\nx: " + b"[" * 5000 + b"]" * 5000 + b"\n",
        2,
        f"nested deeper than {MAX_DEPTH} levels (the depth limit)",
        id="deeper-than-libyaml-parses",
    ),
    pytest.param(b"version: v2\n", 1, "unsupported version 'v2'", id="version"),
    pytest.param(b"x: 1\n", 1, "version: missing", id="no-version"),
    pytest.param(
        b"version: v1\n" + b"# padding\n" * (MAX_BYTES // 10),
        None,
        "larger than 1024 KiB (the size limit)",
        id="huge",
    ),
]


@pytest.mark.parametrize("load", LOADERS)
@pytest.mark.parametrize(("content", "line", "message"), BAD_CONTENT)
def test_bad_content_is_one_located_problem(
    tmp_path: Path, load: Callable[[Path], Any], content: bytes, line: int | None, message: str
) -> None:
    path = tmp_path / "file.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        load(path)
    problems = info.value.problems
    assert len(problems) == 1, problems
    text = str(problems[0])
    where = f"{path}:{line}: " if line is not None else f"{path}: "
    assert text.startswith(where), text
    assert message in text, text
    assert "\n" not in text


def _directory(tmp_path: Path) -> Path:
    return tmp_path


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "absent.yaml"


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "plain").write_text("x")
    return tmp_path / "plain" / "file.yaml"


@pytest.mark.parametrize("load", LOADERS)
@pytest.mark.parametrize(
    ("make", "message"),
    [
        pytest.param(_directory, "is a directory; name the file itself", id="directory"),
        pytest.param(_missing, "no such file; check the path", id="missing"),
        pytest.param(_under_a_file, "cannot read: Not a directory", id="parent-is-a-file"),
    ],
)
def test_unreadable_paths_are_one_problem(
    tmp_path: Path, load: Callable[[Path], Any], make: Callable[[Path], Path], message: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError) as info:
        load(path)
    assert [str(p) for p in info.value.problems] == [f"{path}: {message}"]


@pytest.mark.parametrize(("load", "body"), KINDS)
def test_a_utf8_bom_and_windows_line_ends_are_the_same_file(
    tmp_path: Path, load: Callable[[Path], Any], body: str
) -> None:
    """What editors on other systems write reads as the plain file does."""
    plain, windows = tmp_path / "plain.yaml", tmp_path / "windows.yaml"
    plain.write_text(body)
    windows.write_bytes(b"\xef\xbb\xbf" + body.replace("\n", "\r\n").encode())
    assert _content(load(windows)) == _content(load(plain))


def _content(loaded: Any) -> Any:
    """What a loaded file says, without the name it was read from."""
    if hasattr(loaded, "configs"):
        return loaded.configs
    if hasattr(loaded, "hooks") and hasattr(loaded, "path"):
        return loaded.hooks
    return loaded
