"""Choosing a node's agent config by the nvidia.com/device-plugin.config label (the Helm
chart's per-node configs), and the init container that copies the choice."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.agent import config_select
from nodeagent.config.selection import (
    CONFIG_LABEL,
    Fallback,
    SelectionError,
    choose,
    entries_in,
    parse_fallbacks,
)
from nodeagent.testing.kube.controlplane import free_port

BOTH = (Fallback.NAMED, Fallback.SINGLE)


@pytest.mark.parametrize(
    ("entries", "label", "default", "fallbacks", "chosen"),
    [
        pytest.param({"a", "b"}, "b", "a", BOTH, "b", id="label-wins-over-default"),
        pytest.param({"a", "b"}, None, "a", BOTH, "a", id="no-label-default"),
        pytest.param({"a", "b"}, "", "a", BOTH, "a", id="empty-label-is-no-label"),
        pytest.param({"default", "b"}, None, "", BOTH, "default", id="fallback-named"),
        pytest.param({"only"}, None, "", BOTH, "only", id="fallback-single"),
        pytest.param({"default"}, None, "", (Fallback.SINGLE,), "default", id="single-only"),
        pytest.param({"only"}, None, "", (Fallback.NAMED,), None, id="named-needs-default"),
        pytest.param({"a", "b"}, None, "", BOTH, None, id="nothing-applies"),
        pytest.param({"a"}, None, "", (), None, id="no-fallbacks"),
        pytest.param({"a", "b"}, "c", "a", BOTH, None, id="label-names-no-entry"),
        pytest.param({"a", "b"}, None, "c", BOTH, None, id="default-names-no-entry"),
    ],
)
def test_choose(
    entries: set[str],
    label: str | None,
    default: str,
    fallbacks: tuple[Fallback, ...],
    chosen: str | None,
) -> None:
    if chosen is None:
        with pytest.raises(SelectionError):
            choose(entries, label, default, fallbacks)
    else:
        assert choose(entries, label, default, fallbacks).name == chosen


def test_a_label_naming_no_entry_names_the_label_and_the_entries() -> None:
    # A typo in the label must not quietly give the node the default config.
    with pytest.raises(SelectionError) as raised:
        choose({"mig-single", "default"}, "mig-singel", "default", BOTH)
    assert str(raised.value) == (
        f"node label {CONFIG_LABEL}=mig-singel names no config entry (entries: default, mig-single)"
    )


def test_parse_fallbacks() -> None:
    assert parse_fallbacks("named,single") == BOTH
    assert parse_fallbacks(" single ") == (Fallback.SINGLE,)
    assert parse_fallbacks("") == ()
    with pytest.raises(SelectionError, match="unknown fallback strategy 'first'"):
        parse_fallbacks("named,first")


def test_entries_skip_the_kubelet_bookkeeping_and_strip_suffixes(tmp_path: Path) -> None:
    data = tmp_path / "..2026_12_04"
    data.mkdir()
    (tmp_path / "..data").symlink_to(data.name)
    for key in ("a.yaml", "b.yml", "c"):
        (data / key).write_text(key)
        (tmp_path / key).symlink_to(f"..data/{key}")
    found = entries_in(tmp_path)
    assert sorted(found) == ["a", "b", "c"]
    assert found["b"].read_text() == "b.yml"


def test_one_entry_under_two_keys_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    (tmp_path / "a.yaml").write_text("y")
    with pytest.raises(SelectionError, match="entry 'a' is given twice"):
        entries_in(tmp_path)


def test_init_container_without_a_node_name_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--dir", str(tmp_path), "--out", str(tmp_path / "out.yaml")]
    assert config_select.main(args, {}) == config_select.EXIT_USAGE
    assert "set NODE_NAME" in capsys.readouterr().err


def test_init_container_exits_1_when_the_api_server_is_unreachable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Exit 1, not 2: the kubelet restarts the init container and the next try may reach it.
    (tmp_path / "default.yaml").write_text("version: v1\n")
    out = tmp_path / "selected"
    out.mkdir()
    environ = {
        "NODE_NAME": "gpu-1",
        "NODEAGENT_KUBERNETES_API_SERVER": f"http://127.0.0.1:{free_port()}",
        "NODEAGENT_KUBERNETES_REQUEST_TIMEOUT_S": "2",
    }
    args = ["--dir", str(tmp_path), "--out", str(out / "nodeagent.yaml")]
    assert config_select.main(args, environ) == config_select.EXIT_UNAVAILABLE
    assert "cannot read node gpu-1's labels" in capsys.readouterr().err
    assert not (out / "nodeagent.yaml").exists()
