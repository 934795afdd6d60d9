"""GPU feature discovery's label set on every simulated preset, strategy and sharing mode.

The expected labels are written here from GFD's documentation and its own tests (NVIDIA
k8s-device-plugin v0.17, ``docs/gpu-feature-discovery/README.md`` and ``internal/lm``'s
``mig-strategy_test.go`` / ``resource_test.go``), not produced by the code under test:

- every node with GPUs: ``gpu.machine`` (DMI product name, blanks as ``-``), ``gpu.mode``
  (``compute`` for a PCI 3D controller), ``mig.capable``, ``mps.capable``, the driver and CUDA
  versions under the deprecated and the new names, and ``nvidia.com/gpu.*`` of the whole GPUs:
  product (name, blanks as ``-``), count, memory (MiB), family, compute major/minor, replicas
  (1 unshared, N time-sliced or MPS, 0 when the GPUs have MIG enabled) and sharing-strategy
  (``none`` | ``time-slicing`` | ``mps``); a shared product ends in ``-SHARED`` unless renamed;
- ``mig.strategy`` only under single and mixed, whatever the GPUs;
- single: ``nvidia.com/gpu.*`` describe the MIG devices (product ``<name>-MIG-<profile>``,
  count of MIG devices, memory, multiprocessors, slices, engines); a node the strategy cannot
  describe (a MIG GPU without MIG devices, MIG next to non-MIG GPUs, two profiles) gets
  ``<name>-MIG-INVALID`` with count, replicas and memory 0;
- mixed: the whole-GPU labels plus ``nvidia.com/mig-<profile>.*`` per profile.

The MIG attribute numbers are the simulated driver's (570) ``nvidia-smi mig -lgip`` columns,
whose sources ``nodeagent.migcatalog.SOURCES`` names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from nodeagent import labels as lbl
from nodeagent.agent.node_labels import CapabilityLabels, read_host_facts
from nodeagent.config.pool_policy import Sharing, SharingMode
from nodeagent.config.schema import AgentConfig
from nodeagent.gpu.types import GpuState, NodeSnapshot
from nodeagent.runtime.snapshots import SnapshotStore
from nodeagent.testing.nodes import enable_mig

N = "nvidia.com/"

# preset -> (product label, GPUs, memory MiB, compute capability, family, machine label)
PRESETS: dict[str, tuple[str, int, int, tuple[int, int], str, str]] = {
    "dgx-a100": ("NVIDIA-A100-SXM4-40GB", 8, 40960, (8, 0), "ampere",
                 "DGXA100-920-23687-2530-000"),
    "dgx-a100-80": ("NVIDIA-A100-SXM4-80GB", 8, 81920, (8, 0), "ampere",
                    "DGXA100-920-23687-2530-000"),
    "dgx-h100": ("NVIDIA-H100-80GB-HBM3", 8, 81559, (9, 0), "hopper", "DGXH100"),
    "hgx-h200": ("NVIDIA-H200", 8, 143771, (9, 0), "hopper", "Simulated-HGX-H200"),
    "pcie-l40s": ("NVIDIA-L40S", 8, 46068, (8, 9), "ada-lovelace", "Simulated-PCIe-L40S-server"),
    "pcie-h100nvl": ("NVIDIA-H100-NVL", 4, 95830, (9, 0), "hopper",
                     "Simulated-PCIe-H100-NVL-server"),
    "a30x4": ("NVIDIA-A30", 4, 24576, (8, 0), "ampere", "Simulated-PCIe-A30-server"),
    "t4": ("Tesla-T4", 1, 15360, (7, 5), "turing", "Simulated-T4-server"),
    "dgx-b200": ("NVIDIA-B200", 8, 183359, (10, 0), "blackwell", "DGXB200"),
    "gh200": ("NVIDIA-GH200-480GB", 1, 97871, (9, 0), "hopper", "Simulated-GH200-server"),
}  # fmt: skip

# MIG presets: (small profile, whole-GPU profile), and each profile's lgip columns
# (memory MiB, SMs, copy engines, decoders, JPEG, OFA, GPU-instance slices).
MIG_PROFILES: dict[str, tuple[str, str]] = {
    "dgx-a100": ("1g.5gb", "7g.40gb"),
    "dgx-a100-80": ("1g.10gb", "7g.80gb"),
    "dgx-h100": ("1g.10gb", "7g.80gb"),
    "hgx-h200": ("1g.18gb", "7g.141gb"),
    "pcie-h100nvl": ("1g.12gb", "7g.94gb"),
    "a30x4": ("1g.6gb", "4g.24gb"),
    "dgx-b200": ("1g.23gb", "7g.180gb"),
    "gh200": ("1g.12gb", "7g.96gb"),
}
LGIP: dict[tuple[str, str], tuple[int, int, int, int, int, int, int]] = {
    ("dgx-a100", "1g.5gb"): (4864, 14, 1, 0, 0, 0, 1),
    ("dgx-a100", "7g.40gb"): (40192, 98, 7, 5, 1, 1, 7),
    ("dgx-a100-80", "1g.10gb"): (9728, 14, 1, 0, 0, 0, 1),
    ("dgx-a100-80", "7g.80gb"): (80384, 98, 7, 5, 1, 1, 7),
    ("dgx-h100", "1g.10gb"): (9984, 16, 1, 1, 1, 0, 1),
    ("dgx-h100", "7g.80gb"): (81152, 132, 8, 7, 7, 1, 7),
    ("hgx-h200", "1g.18gb"): (16384, 16, 1, 1, 1, 0, 1),
    ("hgx-h200", "7g.141gb"): (143104, 132, 8, 7, 7, 1, 7),
    ("pcie-h100nvl", "1g.12gb"): (11008, 16, 1, 1, 1, 0, 1),
    ("pcie-h100nvl", "7g.94gb"): (95360, 132, 8, 7, 7, 1, 7),
    ("a30x4", "1g.6gb"): (5952, 14, 1, 0, 0, 0, 1),
    ("a30x4", "4g.24gb"): (24000, 56, 4, 4, 1, 1, 4),
    ("dgx-b200", "1g.23gb"): (20992, 18, 2, 1, 1, 0, 1),
    ("dgx-b200", "7g.180gb"): (182784, 144, 16, 7, 7, 1, 7),
    ("gh200", "1g.12gb"): (11264, 16, 1, 1, 1, 0, 1),
    ("gh200", "7g.96gb"): (96768, 132, 8, 7, 7, 1, 7),
}

# The simulated driver: 570.124.06 offering CUDA 12.8.
VERSIONS = {
    N + "cuda.driver.major": "570",
    N + "cuda.driver.minor": "124",
    N + "cuda.driver.rev": "06",
    N + "cuda.runtime.major": "12",
    N + "cuda.runtime.minor": "8",
    N + "cuda.driver-version.major": "570",
    N + "cuda.driver-version.minor": "124",
    N + "cuda.driver-version.revision": "06",
    N + "cuda.driver-version.full": "570.124.06",
    N + "cuda.runtime-version.major": "12",
    N + "cuda.runtime-version.minor": "8",
    N + "cuda.runtime-version.full": "12.8",
}

EXCLUSIVE = Sharing()
SHARINGS: dict[str, Sharing] = {
    "exclusive": EXCLUSIVE,
    "time-slicing": Sharing(mode=SharingMode.TIME_SLICING, replicas=4),
    "time-slicing-renamed": Sharing(mode=SharingMode.TIME_SLICING, replicas=4, rename_shared=True),
    "mps": Sharing(mode=SharingMode.MPS, replicas=2),
}


def _gfd_only(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k.startswith(N)}


def _resource(resource: str, product: str, count: int, sharing: Sharing | None) -> dict[str, str]:
    """GFD's base labels of one resource, as its README and tests spell them."""
    if sharing is None:  # whole GPUs in MIG mode: no sharing applies
        replicas, strategy, suffix = "0", "none", ""
    elif sharing.mode is SharingMode.EXCLUSIVE:
        replicas, strategy, suffix = "1", "none", ""
    else:
        replicas, strategy = str(sharing.replicas), str(sharing.mode)
        suffix = "" if sharing.rename_shared else "-SHARED"
    return {
        f"{resource}.product": product + suffix,
        f"{resource}.count": str(count),
        f"{resource}.replicas": replicas,
        f"{resource}.sharing-strategy": strategy,
    }


def _mig_attributes(resource: str, preset: str, profile: str) -> dict[str, str]:
    memory, sms, ce, dec, jpeg, ofa, gi = LGIP[(preset, profile)]
    return {
        f"{resource}.memory": str(memory),
        f"{resource}.multiprocessors": str(sms),
        f"{resource}.slices.gi": str(gi),
        f"{resource}.slices.ci": str(gi),
        f"{resource}.engines.copy": str(ce),
        f"{resource}.engines.decoder": str(dec),
        f"{resource}.engines.encoder": "0",
        f"{resource}.engines.jpeg": str(jpeg),
        f"{resource}.engines.ofa": str(ofa),
    }


def _node_labels(preset: str, *, mps: bool = False) -> dict[str, str]:
    """What GFD writes on every node of ``preset``, before the resource labels."""
    return {
        N + "gpu.machine": PRESETS[preset][5],
        N + "gpu.mode": "compute",
        N + "mig.capable": "true" if preset in MIG_PROFILES else "false",
        N + "mps.capable": "true" if mps else "false",
        **VERSIONS,
    }


def _whole_gpus(preset: str, sharing: Sharing | None) -> dict[str, str]:
    product, gpus, memory, (major, minor), family, _ = PRESETS[preset]
    return {
        **_resource(N + "gpu", product, gpus, sharing),
        N + "gpu.memory": str(memory),
        N + "gpu.family": family,
        N + "gpu.compute.major": str(major),
        N + "gpu.compute.minor": str(minor),
    }


def _labels(snapshot: NodeSnapshot, host: Path, strategy: str, sharing: Sharing) -> dict[str, str]:
    facts = read_host_facts(host, snapshot)
    node_facts = lbl.NodeFacts(
        pool="default",
        mig_strategy=strategy,
        machine=facts.machine,
        pci_classes=facts.pci_classes,
        sharing=lambda _gpu, _position, _resource: sharing,
    )
    return _gfd_only(lbl.capability_labels(snapshot, node_facts))


def _node(make_node: Any, sim_state_dir: Path, preset: str, mig: dict[int, list[str]]) -> Any:
    node = make_node(preset)
    if mig:
        enable_mig(node, mig)
    return node.snapshot(), sim_state_dir / "host"


WHOLE_CASES = [
    pytest.param(preset, strategy, sharing, id=f"{preset}-{strategy}-{sharing}")
    for preset in PRESETS
    for strategy in ("none", "single", "mixed")
    for sharing in SHARINGS
]


@pytest.mark.parametrize(("preset", "strategy", "sharing"), WHOLE_CASES)
def test_whole_gpus(make_node, sim_state_dir, preset, strategy, sharing):
    """MIG off: every strategy labels the whole GPUs; mig.strategy only under single/mixed."""
    snapshot, host = _node(make_node, sim_state_dir, preset, {})
    shared = SHARINGS[sharing]
    expected = {
        **_node_labels(preset, mps=shared.mode is SharingMode.MPS),
        **_whole_gpus(preset, shared),
    }
    if strategy != "none":
        expected[N + "mig.strategy"] = strategy
    assert _labels(snapshot, host, strategy, shared) == expected


MIG_CASES = [
    pytest.param(preset, sharing, id=f"{preset}-{sharing}")
    for preset in MIG_PROFILES
    for sharing in ("exclusive", "time-slicing", "time-slicing-renamed", "mps")
]


@pytest.mark.parametrize(("preset", "sharing"), MIG_CASES)
def test_single_strategy(make_node, sim_state_dir, preset, sharing):
    """Two small instances on every GPU: nvidia.com/gpu.* describe the MIG devices."""
    small, _ = MIG_PROFILES[preset]
    gpus = PRESETS[preset][1]
    snapshot, host = _node(
        make_node, sim_state_dir, preset, {i: [small, small] for i in range(gpus)}
    )
    shared = SHARINGS[sharing]
    # MIG devices are never MPS-shared (the plugin serves them exclusive, GFD refuses).
    mig_sharing = EXCLUSIVE if shared.mode is SharingMode.MPS else shared
    product = f"{PRESETS[preset][0]}-MIG-{small}"
    expected = {
        **_node_labels(preset),
        **_whole_gpus(preset, None),
        N + "mig.strategy": "single",
        **_resource(N + "gpu", product, 2 * gpus, mig_sharing),
        **_mig_attributes(N + "gpu", preset, small),
    }
    assert _labels(snapshot, host, "single", shared) == expected


@pytest.mark.parametrize(("preset", "sharing"), MIG_CASES)
def test_mixed_strategy(make_node, sim_state_dir, preset, sharing):
    """Two small instances on GPU 0 and a whole-GPU one on GPU 1: one label set per profile."""
    small, whole = MIG_PROFILES[preset]
    product, gpus, *_ = PRESETS[preset]
    layout = {0: [small, small], 1: [whole]} if gpus > 1 else {0: [small, small]}
    snapshot, host = _node(make_node, sim_state_dir, preset, layout)
    shared = SHARINGS[sharing]
    mig_sharing = EXCLUSIVE if shared.mode is SharingMode.MPS else shared
    # Whole-GPU labels: GPUs without MIG carry the sharing; on a one-GPU node it has MIG on.
    whole_sharing = shared if gpus > 2 else None
    expected = {
        **_node_labels(preset, mps=shared.mode is SharingMode.MPS and gpus > 2),
        **_whole_gpus(preset, whole_sharing),
        N + "mig.strategy": "mixed",
    }
    for profile, count in ((small, 2), (whole, 1)) if gpus > 1 else ((small, 2),):
        resource = f"{N}mig-{profile}"
        expected.update(_resource(resource, f"{product}-MIG-{profile}", count, mig_sharing))
        expected.update(_mig_attributes(resource, preset, profile))
    assert _labels(snapshot, host, "mixed", shared) == expected


INVALID = {
    "some GPUs without MIG": lambda small, whole: {0: [small]},
    "a MIG GPU without MIG devices": lambda small, whole: {0: [small], 1: []},
    "two profiles": lambda small, whole: {0: [small], 1: [whole]},
}


@pytest.mark.parametrize("case", INVALID)
def test_single_strategy_invalid(make_node, sim_state_dir, case):
    """GFD's mig-strategy-invalid labels; the whole-GPU labels it does not override stay."""
    small, whole = MIG_PROFILES["dgx-h100"]
    layout = INVALID[case](small, whole)
    if case != "some GPUs without MIG":
        layout = {i: layout.get(i, [small]) for i in range(8)}
    snapshot, host = _node(make_node, sim_state_dir, "dgx-h100", layout)
    expected = {
        **_node_labels("dgx-h100"),
        **_whole_gpus("dgx-h100", EXCLUSIVE if case == "some GPUs without MIG" else None),
        N + "mig.strategy": "single",
        N + "gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-INVALID",
        N + "gpu.count": "0",
        N + "gpu.replicas": "0",
        N + "gpu.memory": "0",
    }
    assert _labels(snapshot, host, "single", EXCLUSIVE) == expected


def test_node_whose_gpus_differ(make_node, tmp_path):
    """Two products on one node: GFD labels one product (it warns, and a Go map's order picks
    which); nodeagent names GPU 0's, counting the GPUs of that product only. gpu.mode is the
    first GPU's, mig.capable is true when any GPU is MIG-capable."""
    h100 = make_node("dgx-h100", state_dir=tmp_path / "h100").snapshot()
    l40s = make_node("pcie-l40s", state_dir=tmp_path / "l40s").snapshot()

    def renumbered(gpu: GpuState, index: int) -> GpuState:
        return dataclasses.replace(gpu, info=dataclasses.replace(gpu.info, index=index))

    gpus = (*(renumbered(g, i) for i, g in enumerate(l40s.gpus[:2])),
            *(renumbered(g, 2 + i) for i, g in enumerate(h100.gpus[:6])))  # fmt: skip
    mixed = dataclasses.replace(l40s, gpus=gpus, topology={})
    facts = lbl.NodeFacts(pool="default", mig_strategy="single", machine="Mixed box")
    labels = _gfd_only(lbl.capability_labels(mixed, facts))
    assert labels == {
        N + "gpu.machine": "Mixed-box",
        N + "gpu.mode": "unknown",  # no PCI class given
        N + "mig.capable": "true",  # the H100s
        N + "mps.capable": "false",
        **VERSIONS,
        **_resource(N + "gpu", "NVIDIA-L40S", 2, EXCLUSIVE),
        N + "gpu.memory": "46068",
        N + "gpu.family": "ada-lovelace",
        N + "gpu.compute.major": "8",
        N + "gpu.compute.minor": "9",
        N + "mig.strategy": "single",
    }
    # Listed the other way round, the node is labelled as the H100s.
    flipped = dataclasses.replace(
        mixed,
        gpus=tuple(renumbered(g, (g.info.index + 6) % 8) for g in gpus),
    )
    labels = _gfd_only(lbl.capability_labels(flipped, facts))
    assert labels[N + "gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels[N + "gpu.count"] == "6"


def test_no_gpus_no_gfd_labels():
    """GFD writes nothing on a node without GPUs; nodeagent's own pool label stays."""
    empty = NodeSnapshot(0.0, 0.0, "570.124.06", "12.8", ())
    assert lbl.capability_labels(empty, lbl.NodeFacts(pool="p")) == {
        lbl.POOL: "p",
        lbl.DRIVER_VERSION: "570.124.06",
    }


def test_machine_type_unreadable(make_node, tmp_path):
    """No DMI file (or no host tree): gpu.machine and gpu.mode say unknown, as GFD."""
    snapshot = make_node("t4").snapshot()
    facts = read_host_facts(tmp_path / "nothing-here", snapshot)
    assert (facts.machine, dict(facts.pci_classes)) == (None, {})
    labels = lbl.capability_labels(snapshot, lbl.NodeFacts(pool="p", machine=facts.machine))
    assert (labels[N + "gpu.machine"], labels[N + "gpu.mode"]) == ("unknown", "unknown")


def test_capability_labels_from_the_agent_config(make_node, sim_state_dir):
    """The agent's labels take the MIG strategy and the device plugin's per-GPU sharing from
    the config (NVIDIA's sharing.timeSlicing shape) and the host facts from the host root."""
    snapshot = make_node("dgx-h100").snapshot()
    store = SnapshotStore()
    store.publish(snapshot)
    config = AgentConfig.model_validate(
        {
            "device_plugin": {
                "mig_strategy": "mixed",
                "sharing": {"timeSlicing": {"resources": [{"name": N + "gpu", "replicas": 3}]}},
            }
        }
    )
    labels = CapabilityLabels(store, config, host_root=sim_state_dir / "host")()
    assert _gfd_only(dict(labels)) == {
        **_node_labels("dgx-h100"),
        **_whole_gpus("dgx-h100", Sharing(mode=SharingMode.TIME_SLICING, replicas=3)),
        N + "mig.strategy": "mixed",
    }
    assert labels[lbl.POOL] == "default"


def test_stale_mixed_strategy_labels_are_removed():
    """The per-profile labels come and go with the layout: a profile gone is deleted."""
    current = {N + "mig-1g.10gb.count": "2", N + "mig-1g.10gb.memory": "9984", "team": "ml"}
    desired = {N + "mig-7g.80gb.count": "1"}
    assert lbl.label_patch(current, desired) == {
        N + "mig-7g.80gb.count": "1",
        N + "mig-1g.10gb.count": None,
        N + "mig-1g.10gb.memory": None,
    }
