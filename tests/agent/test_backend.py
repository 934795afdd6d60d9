"""Choosing the backend at the edge: simulator presets, the environment, no driver."""

from __future__ import annotations

import ctypes.util
import sys
from pathlib import Path

import pytest

from nodeagent.agent.backend import (
    MIG_LOCK_FILE,
    host_root,
    mig_lock_file,
    open_node,
    preset_names,
    simulated_preset,
)
from nodeagent.gpu.errors import DriverNotLoaded, InvalidArgument

REQUIRED_PRESETS = (
    "dgx-a100",
    "dgx-a100-80",
    "dgx-h100",
    "hgx-h200",
    "pcie-l40s",
    "pcie-h100nvl",
    "a30x4",
    "t4",
)
HAS_NVML_LIBRARY = ctypes.util.find_library("nvidia-ml") is not None


def test_preset_names_lists_every_documented_preset() -> None:
    assert set(REQUIRED_PRESETS) <= set(preset_names())


def _assert_no_driver_hint(exc: DriverNotLoaded) -> None:
    message = str(exc)
    assert "\n" not in message
    assert "--simulate PRESET" in message
    assert "NODEAGENT_SIMULATE" in message
    for preset in REQUIRED_PRESETS:
        assert preset in message


@pytest.mark.skipif(HAS_NVML_LIBRARY, reason="this host has the NVML library")
def test_without_driver_open_node_raises_driver_not_loaded_with_hint() -> None:
    with pytest.raises(DriverNotLoaded) as caught:
        open_node()
    _assert_no_driver_hint(caught.value)
    assert caught.value.function == "nvmlInit"


def test_without_pynvml_open_node_raises_driver_not_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    with pytest.raises(DriverNotLoaded) as caught:
        open_node()
    _assert_no_driver_hint(caught.value)


def test_unknown_preset_is_rejected_with_the_list(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as caught:
        open_node(simulate="dgx-z900", state_dir=tmp_path)
    message = str(caught.value)
    assert "dgx-z900" in message
    assert all(preset in message for preset in REQUIRED_PRESETS)
    assert "\n" not in message


def test_env_simulate_selects_the_simulator(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("NODEAGENT_SIMULATE", "pcie-h100nvl")
    monkeypatch.setenv("NODEAGENT_SIM_STATE", str(tmp_path))
    assert simulated_preset(None) == "pcie-h100nvl"
    with open_node() as node:
        assert node.count() == 4
    # The node lives in the state directory named by the environment.
    assert any(tmp_path.iterdir())


def test_argument_wins_over_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NODEAGENT_SIMULATE", "pcie-h100nvl")
    with open_node(simulate="t4", state_dir=tmp_path) as node:
        assert node.count() == 1


def test_a_state_dir_holding_a_node_is_that_node_and_its_lock(tmp_path: Path) -> None:
    with open_node(simulate="a30x4", state_dir=tmp_path):
        pass
    # Neither --simulate nor NODEAGENT_SIMULATE: the directory says which node it simulates.
    assert simulated_preset(None, environ={}, state_dir=tmp_path) == "a30x4"
    assert simulated_preset(None, environ={"NODEAGENT_SIM_STATE": str(tmp_path)}) == "a30x4"
    assert mig_lock_file(None, tmp_path, environ={}) == tmp_path / "mig.lock"
    with open_node(state_dir=tmp_path) as node:
        assert node.count() == 4
    # An empty directory holds no node: real GPUs, and nothing is seeded in it.
    empty = tmp_path / "empty"
    empty.mkdir()
    assert simulated_preset(None, environ={}, state_dir=empty) is None
    assert mig_lock_file(None, empty, environ={}) == MIG_LOCK_FILE
    assert not any(empty.iterdir())


def test_a_simulated_node_reads_its_host_files_from_its_own_folder(tmp_path: Path) -> None:
    """GFD's machine label on a simulated node names the preset's machine, not this host's."""
    node = open_node(simulate="dgx-h100", state_dir=tmp_path)
    node.close()
    root = host_root("dgx-h100", tmp_path, environ={})
    assert root == tmp_path / "host"
    assert (root / "sys/class/dmi/id/product_name").read_text().strip() == "DGXH100"
    # A state directory that holds a node is enough on its own, as for every command.
    assert host_root(None, tmp_path, environ={}) == root


def test_a_real_node_reads_its_host_files_from_the_root() -> None:
    assert host_root(None, None, environ={}) == Path("/")
