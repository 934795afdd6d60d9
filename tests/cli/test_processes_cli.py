"""`nodeagent sim process add` and `nodeagent processes` as a user runs them."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.testing.podresources import FakeKubelet, serving
from tests.cli.test_inventory_cli import nodeagent

MIB = 1024 * 1024
UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


@pytest.fixture
def kubelet() -> Iterator[tuple[FakeKubelet, Path]]:
    short = Path(tempfile.mkdtemp(prefix="proc-cli-"))
    socket = short / "kubelet.sock"
    with serving(socket) as servicer:
        yield servicer, socket
    shutil.rmtree(short, ignore_errors=True)


def test_processes_lists_each_process_with_its_pod(
    tmp_path: Path, kubelet: tuple[FakeKubelet, Path]
) -> None:
    env = {"NODEAGENT_SIMULATE": "dgx-h100", "NODEAGENT_SIM_STATE": str(tmp_path / "sim")}
    added = []
    for extra in (
        ["--memory-mib", "2048", "--sm-share", "0.4", "--name", "trainer"],
        ["--memory-mib", "512", "--sm-share", "0.1", "--name", "nvidia-cuda-mps-server"],
        ["--memory-mib", "4096", "--sm-share", "0.3", "--name", "vllm", "--mps"],
    ):
        result = nodeagent("sim", "process", "add", "--gpu", "2", *extra, env=env)
        assert result.returncode == 0, result.stderr
        added.append(int(result.stdout))
    trainer, server, client = added
    proc = tmp_path / "proc"
    for pid, text in (
        (trainer, f"0::/kubepods/burstable/pod{UID}/{'a' * 64}"),
        (server, "0::/system.slice/nvidia-mps.service"),
    ):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text + "\n")
    servicer, socket = kubelet
    gpus = json.loads(nodeagent("gpus", "--json", env=env).stdout)
    servicer.pods = [("train-0", "ml", "main", "nvidia.com/gpu", [f"{gpus[2]['uuid']}::0"])]
    args = ["--proc-root", str(proc), "--pod-resources-socket", str(socket)]

    result = nodeagent("processes", "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    rows = {r["pid"]: r for r in json.loads(result.stdout)}
    assert set(rows) == set(added)
    assert rows[trainer]["used_memory_bytes"] == 2048 * MIB
    assert (rows[trainer]["namespace"], rows[trainer]["pod"], rows[trainer]["container"]) == (
        "ml",
        "train-0",
        "main",
    )
    assert rows[trainer]["pod_uid"] == UID
    assert rows[trainer]["gpu"] == 2
    assert rows[trainer]["mig_device"] is None
    assert 0.3 <= rows[trainer]["sm_utilization_ratio"] <= 0.41
    assert rows[server]["pod"] is None  # a host process, though one pod holds the GPU
    # No cgroup file for the client: the GPU's only holder stands in.
    assert (rows[client]["pod"], rows[client]["attribution"]) == ("train-0", "pod-resources")
    assert (rows[client]["type"], rows[client]["name"]) == ("M+C", "vllm")

    table = nodeagent("processes", *args, env=env)
    assert table.returncode == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split() == [
        "GPU", "MIG", "PID", "TYPE", "NAME", "MEMORY", "SM", "POD", "CONTAINER"
    ]  # fmt: skip
    trainer_line = next(line for line in lines if line.split()[2] == str(trainer))
    assert trainer_line.split()[4:6] == ["trainer", "2048MiB"]
    assert "ml/train-0" in trainer_line


def test_processes_bad_proc_root_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {"NODEAGENT_SIMULATE": "t4", "NODEAGENT_SIM_STATE": str(tmp_path)}
    result = nodeagent("processes", "--proc-root", str(tmp_path / "nope"), env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--proc-root" in result.stderr


def test_sim_process_add_rejects_a_bad_share(tmp_path: Path) -> None:
    env = {"NODEAGENT_SIMULATE": "t4", "NODEAGENT_SIM_STATE": str(tmp_path)}
    result = nodeagent("sim", "process", "add", "--gpu", "0", "--sm-share", "2", env=env)
    assert result.returncode == 2
    assert "outside 0..1" in result.stderr
    assert "Traceback" not in result.stderr
