"""The ``cdi`` device-list strategy through the socket: CDI names in CDIDevices, and the spec
files the agent writes with the shared generator resolve every name Allocate returns."""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent.config.device_plugin import DeviceListStrategy

KIND = "k8s.device-plugin.nodeagent.io/gpu"


def resolve(spec_dir: Path) -> dict[str, dict]:
    """What a CDI registry sees: qualified device name -> containerEdits (plus the spec's)."""
    out: dict[str, dict] = {}
    for path in sorted(spec_dir.glob("*.json")):
        spec = json.loads(path.read_text())
        assert spec["cdiVersion"] == "0.6.0"
        for device in spec["devices"]:
            name = f"{spec['kind']}={device['name']}"
            assert name not in out, f"{name} defined twice"
            out[name] = {"device": device["containerEdits"], "spec": spec["containerEdits"]}
    return out


def test_cdi_strategy_returns_names_the_written_specs_resolve(
    run_plugin, mps_binary, short_dir
) -> None:
    spec_dir = short_dir / "cdi"
    plugin = run_plugin(
        "a30x4",
        mig={0: ["2g.12gb", "2g.12gb"]},
        config={
            "pools": {"default": {"gpu_sharing": {"1": {"mode": "mps", "replicas": 2}}}},
            "device_plugin": {
                "mig_strategy": "mixed",
                "device_list_strategy": "cdi",
                "cdi_spec_dir": str(spec_dir),
                "mps": {"control_binary": str(mps_binary)},
            },
        },
    )
    kubelet = plugin.kubelet
    mps_gpu, plain = plugin.uuid(1), plugin.uuid(2)
    kubelet.wait_devices("nvidia.com/gpu", lambda d: d.get(f"{mps_gpu}::0", ("",))[0] == "Healthy")
    # A whole GPU: its CDI name only, no env or mounts for the runtime to apply itself.
    [whole] = kubelet.allocate("nvidia.com/gpu", [plain]).container_responses
    assert [d.name for d in whole.cdi_devices] == [f"{KIND}=gpu-{plain}"]
    assert not whole.envs
    assert not whole.mounts
    registry = resolve(spec_dir)
    edits = registry[f"{KIND}=gpu-{plain}"]
    assert f"NVIDIA_VISIBLE_DEVICES={plain}" in edits["device"]["env"]
    minor = plugin.node.info(2).minor_number
    assert {"path": f"/dev/nvidia{minor}"} in edits["device"]["deviceNodes"]
    assert {"path": "/dev/nvidiactl"} in edits["spec"]["deviceNodes"]
    # Two replicas of an MPS GPU name the GPU once; the spec mounts its daemon's pipe.
    [shared] = kubelet.allocate(
        "nvidia.com/gpu", [f"{mps_gpu}::0", f"{mps_gpu}::1"]
    ).container_responses
    assert [d.name for d in shared.cdi_devices] == [f"{KIND}=gpu-{mps_gpu}"]
    daemon = plugin.manager.mps.daemon(mps_gpu)
    assert daemon is not None
    edits = registry[f"{KIND}=gpu-{mps_gpu}"]["device"]
    assert f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}" in edits["env"]
    assert edits["mounts"][0]["hostPath"] == str(daemon.pipe_dir)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in shared.envs, "the spec sets it"
    assert [(m.container_path, m.host_path) for m in shared.mounts] == [("/dev/shm", "/dev/shm")]
    # A MIG device of the mixed strategy: its own resource's spec, named by its MIG UUID.
    mig = [i.uuid for i in plugin.snapshot.gpus[0].mig_instances]
    [one] = kubelet.allocate("nvidia.com/mig-2g.12gb", [mig[1]]).container_responses
    assert [d.name for d in one.cdi_devices] == [f"{KIND}=mig-2g.12gb-{mig[1]}"]
    edits = registry[f"{KIND}=mig-2g.12gb-{mig[1]}"]["device"]
    assert edits["env"] == [f"NVIDIA_VISIBLE_DEVICES={mig[1]}"]
    assert sorted(p.name for p in spec_dir.iterdir()) == [
        "k8s.device-plugin.nodeagent.io-gpu_gpu.json",
        "k8s.device-plugin.nodeagent.io-gpu_mig-2g.12gb.json",
    ]


def test_a_retired_resource_loses_its_spec_and_other_strategies_write_none(
    run_plugin, short_dir
) -> None:
    spec_dir = short_dir / "cdi"
    config = {
        "device_plugin": {
            "mig_strategy": "mixed",
            "device_list_strategy": ["envvar", "cdi"],
            "cdi_spec_dir": str(spec_dir),
        }
    }
    plugin = run_plugin("a30x4", mig={0: ["4g.24gb"]}, config=config)
    assert {p.name for p in spec_dir.iterdir()} == {
        "k8s.device-plugin.nodeagent.io-gpu_gpu.json",
        "k8s.device-plugin.nodeagent.io-gpu_mig-4g.24gb.json",
    }
    u = plugin.uuid(1)
    [resp] = plugin.kubelet.allocate("nvidia.com/gpu", [u]).container_responses
    assert resp.envs["NVIDIA_VISIBLE_DEVICES"] == u, "envvar beside cdi"
    assert [d.name for d in resp.cdi_devices] == [f"{KIND}=gpu-{u}"]
    # MIG off on GPU 0: the MIG resource goes, and with it its spec; GPU 0 joins nvidia.com/gpu.
    plugin.node.set_mig_mode(0, False)
    manager = plugin.manager
    manager.apply(plugin.node.snapshot(), manager.pool, manager.section)
    assert [p.name for p in spec_dir.iterdir()] == ["k8s.device-plugin.nodeagent.io-gpu_gpu.json"]
    assert f"{KIND}=gpu-{plugin.uuid(0)}" in resolve(spec_dir)
    # The strategy off: the agent's specs go too.
    off = manager.section.model_copy(update={"device_list_strategy": (DeviceListStrategy.ENVVAR,)})
    manager.apply(plugin.node.snapshot(), manager.pool, off)
    assert list(spec_dir.iterdir()) == []
