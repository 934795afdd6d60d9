"""The health component in an agent context: sampler + events + reporter, and the CLI."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from nodeagent.agent.sampler import Sampler
from nodeagent.cli.health import app
from nodeagent.config.health import HealthSection
from nodeagent.config.kubernetes import KubernetesSection
from nodeagent.config.schema import AgentConfig, NodeSection, SamplerSection
from nodeagent.gpu.node import GpuNode
from nodeagent.health import component as health
from nodeagent.health.model import HealthModel
from nodeagent.runtime.health_source import HealthState, HealthTransition
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.sim.control import SimControl
from nodeagent.testing.kube import waiting
from nodeagent.testing.kube.controlplane import ControlPlane
from nodeagent.testing.kube.deploy import Identities
from nodeagent.testing.kube.nodes import NodeSet

NODE = "gpu-node-1"


def _config(
    tmp_path: Path, kubeconfig: Path | None, node: str = NODE, **health: object
) -> AgentConfig:
    kube = KubernetesSection(enabled=kubeconfig is not None, kubeconfig=kubeconfig)
    return AgentConfig(
        node=NodeSection(name=node),
        state_dir=tmp_path / "agent",
        health=HealthSection(**health),  # type: ignore[arg-type]
        kubernetes=kube,
    )


def test_disabled_health_builds_nothing(make_node: Callable[..., GpuNode], tmp_path: Path) -> None:
    assert health.build_model(_config(tmp_path, None, enabled=False)) is None


def test_agent_flags_an_injected_xid(
    make_node: Callable[..., GpuNode],
    sim_state_dir: Path,
    control_plane: ControlPlane,
    kube_nodes: NodeSet,
    kube_identities: Identities,
    tmp_path: Path,
) -> None:
    node = make_node("dgx-h100")
    name = kube_nodes.create("gpu-1")
    mark = control_plane.audit_mark()
    cfg = _config(tmp_path, kube_identities.agent.kubeconfig.path, name)
    api = control_plane.api_client()

    def gpu_healthy(status: str) -> Callable[[dict[str, object]], bool]:
        def check(obj: dict[str, object]) -> bool:
            cond = waiting.condition(obj, "GPUHealthy")
            return cond is not None and cond["status"] == status

        return check

    snapshots = SnapshotStore()
    model = health.build_model(cfg)
    assert isinstance(model, HealthModel)  # built on its own, before any component runs
    component = health.build(cfg, model, node, snapshots)
    assert component.name == "health"
    seen: list[HealthTransition] = []
    model.subscribe(seen.append)
    sampler = Sampler(node, snapshots, SamplerSection(interval_s=0.05))
    stop = threading.Event()
    threads = [
        threading.Thread(target=sampler.run, args=(stop,), daemon=True),
        threading.Thread(target=component.run, args=(stop,), daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        waiting.node(api, name, gpu_healthy("True"), what=f"agent: node {name} GPUHealthy=True")
        assert component.ready
        SimControl(sim_state_dir).inject("xid", 6, code=62)
        flagged = waiting.node(
            api,
            name,
            gpu_healthy("False"),
            what=f"agent: node {name} GPUHealthy=False",
            timeout_s=5,
        )
        cond = waiting.condition(flagged, "GPUHealthy")
        assert cond is not None
        assert "gpu6" in cond["message"]
        # Flagged through the status subresource, merged beside the kubelet's Ready condition.
        assert waiting.condition(flagged, "Ready") is not None
        sent = control_plane.audited(mark, user=kube_identities.agent.user)
        assert ("patch", "nodes/status", name, 200) in [
            (r.verb, r.resource, r.name, r.code) for r in sent
        ]
        assert [t.current.gpu_index for t in seen] == [6]
        assert seen[0].current.state is HealthState.UNHEALTHY
        # `nodeagent health` reads what the running agent wrote.
        result = CliRunner().invoke(app, ["--json", "--agent-state-dir", str(cfg.state_dir)])
        assert result.exit_code == 1, result.output  # an unhealthy GPU is a failure found
        data = json.loads(result.output)
        gpu6 = next(d for d in data["devices"] if d["gpu"] == 6 and d["parent"] is None)
        assert gpu6["state"] == "unhealthy"
        assert gpu6["action"] == "reset the GPU"
        assert "xid 62" in gpu6["reasons"][0]
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=5)
    assert not any(t.is_alive() for t in threads)
    assert (cfg.state_dir / "health" / "history.json").exists()


def test_cli_simulate_evaluates_once_without_an_agent(sim_state_dir: Path) -> None:
    control = SimControl(sim_state_dir, "dgx-a100")
    control.state()
    control.inject("remap-pending", 1)
    runner = CliRunner()
    args = ["--simulate", "dgx-a100", "--state-dir", str(sim_state_dir)]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "row remap pending" in result.output
    assert "reset the GPU" in result.output
    data = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert data["source"] == "evaluated"
    assert data["health"] == "unhealthy"


def test_cli_without_agent_or_simulate_says_what_to_do(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["--agent-state-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "no health status at" in result.output
    assert "--simulate" in result.output
