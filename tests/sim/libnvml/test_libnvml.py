"""The simulated libnvidia-ml.so.1, through NVML's C API: a C program and nvidia-ml-py.

Builds the library from NVIDIA's nvml.h (go-nvml's copy, pinned in hack/nvidia) and a C probe
of our own, then checks that every header symbol is exported, that the probe reads what
``nodeagent gpus --json`` and ``nodeagent mig show --json`` report on every preset (with a MIG
layout applied where the GPUs have MIG), that the event API blocks without holding up other
threads and honours its timeout, and that pynvml's ctypes path works over it. With ``CI=true``
a missing gcc or Go fails instead of skipping.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from nodeagent.sim import presets
from nodeagent.sim.libnvml import bridge, builder, gen

HERE = Path(__file__).resolve().parent
NODEAGENT = Path(sys.executable).parent / "nodeagent"


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing in CI: .ci/run installs it")
    pytest.skip(f"{what} is not installed")


@pytest.fixture(scope="module")
def header() -> Path:
    if shutil.which("go") is None and not os.environ.get(builder.ENV_HEADER):
        _missing("go (for go-nvml's nvml.h)")
    return builder.find_header()


@pytest.fixture(scope="module")
def libdir(header: Path) -> Path:
    if shutil.which("gcc") is None:
        _missing("gcc")
    return builder.build(header)


@pytest.fixture(scope="module")
def probe(libdir: Path, header: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("probe") / "probe"
    subprocess.run(
        [
            "gcc",
            "-O1",
            "-Wall",
            "-Werror",
            f"-I{header.parent}",
            str(HERE / "probe.c"),
            f"-L{libdir}",
            "-lnvidia-ml",
            "-lpthread",
            f"-Wl,-rpath,{libdir}",
            "-o",
            str(out),
        ],
        check=True,
    )
    return out


def _node(tmp_path: Path, preset: str) -> dict[str, str]:
    env = {
        **os.environ,
        "NODEAGENT_SIM_STATE": str(tmp_path / preset),
        "NODEAGENT_SIMULATE": preset,
    }
    env.pop("NODEAGENT_LIBNVML_TRACE", None)
    return env


def _cli(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(NODEAGENT), *args], env=env, capture_output=True, text=True, check=check, timeout=60
    )


def test_every_nvml_h_function_is_exported(libdir: Path, header: Path) -> None:
    declared = {f.name for f in gen.functions(header.read_text())}
    lib = ctypes.CDLL(str(libdir / builder.SONAME))
    missing = [name for name in declared if not hasattr(lib, name)]
    assert len(declared) > 400
    assert missing == []
    # The ones go-nvml probes first are there in their versioned forms and simulated.
    assert {"nvmlInit_v2", "nvmlDeviceGetCount_v2", "nvmlDeviceGetPciInfo_v3"} <= bridge.simulated()


# Structs the bridge writes, with the pynvml class it writes them from.
_STRUCTS = {
    "nvmlPciInfo_t": pynvml.nvmlPciInfo_t,
    "nvmlMemory_t": pynvml.c_nvmlMemory_t,
    "nvmlMemory_v2_t": pynvml.c_nvmlMemory_v2_t,
    "nvmlBAR1Memory_t": pynvml.c_nvmlBAR1Memory_t,
    "nvmlUtilization_t": pynvml.c_nvmlUtilization_t,
    "nvmlProcessInfo_v1_t": bridge._ProcessInfoV1,
    "nvmlProcessInfo_v2_t": pynvml.c_nvmlProcessInfo_v2_t,
    "nvmlProcessInfo_t": pynvml.c_nvmlProcessInfo_t,
    "nvmlFieldValue_t": pynvml.c_nvmlFieldValue_t,
    "nvmlEventData_t": pynvml.c_nvmlEventData_t,
    "nvmlDeviceAttributes_t": pynvml.c_nvmlDeviceAttributes,
    "nvmlGpuInstancePlacement_t": pynvml.c_nvmlGpuInstancePlacement_t,
    "nvmlGpuInstanceProfileInfo_t": pynvml.c_nvmlGpuInstanceProfileInfo_t,
    "nvmlGpuInstanceProfileInfo_v2_t": pynvml.c_nvmlGpuInstanceProfileInfo_v2_t,
    "nvmlGpuInstanceProfileInfo_v3_t": bridge._GiProfileInfoV3,
    "nvmlGpuInstanceInfo_t": pynvml.c_nvmlGpuInstanceInfo_t,
    "nvmlComputeInstancePlacement_t": pynvml.c_nvmlComputeInstancePlacement_t,
    "nvmlComputeInstanceProfileInfo_t": pynvml.c_nvmlComputeInstanceProfileInfo_t,
    "nvmlComputeInstanceProfileInfo_v2_t": pynvml.c_nvmlComputeInstanceProfileInfo_v2_t,
    "nvmlComputeInstanceProfileInfo_v3_t": bridge._CiProfileInfoV3,
    "nvmlComputeInstanceInfo_t": pynvml.c_nvmlComputeInstanceInfo_t,
}


def test_struct_layouts_match_nvidias_header(header: Path, tmp_path: Path) -> None:
    source = tmp_path / "sizes.c"
    lines = [f'printf("%s %zu\\n", "{n}", sizeof({n}));' for n in _STRUCTS]
    source.write_text(
        '#include <stdio.h>\n#include "nvml.h"\nint main(void) {\n' + "\n".join(lines) + "\n}\n"
    )
    if shutil.which("gcc") is None:
        _missing("gcc")
    subprocess.run(
        ["gcc", f"-I{header.parent}", str(source), "-o", str(tmp_path / "sizes")], check=True
    )
    out = subprocess.run([str(tmp_path / "sizes")], capture_output=True, text=True, check=True)
    sizes = dict(line.split() for line in out.stdout.splitlines())
    assert {n: int(sizes[n]) for n in _STRUCTS} == {
        n: ctypes.sizeof(c) for n, c in _STRUCTS.items()
    }


def _apply_mig(env: dict[str, str], tmp_path: Path) -> str:
    """A MIG layout: the shipped all-balanced, else the GPU's largest profile once."""
    if _cli(env, "mig", "apply", "-c", "all-balanced", "--yes", check=False).returncode == 0:
        return "all-balanced"
    _cli(env, "mig", "apply", "-c", "all-enabled", "--yes")  # `mig show` lists profiles now
    shown = json.loads(_cli(env, "mig", "show", "--json").stdout)["gpus"]
    largest: str = shown[0]["profiles"][0]
    config = tmp_path / "layout.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  largest:\n    - devices: all\n      mig-enabled: true\n"
        f"      mig-devices:\n        {largest}: 1\n"
    )
    _cli(env, "mig", "apply", "-f", str(config), "-c", "largest", "--yes")
    return largest


_GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "serial",
    "pci_device_id",
    "numa_node",
    "memory_total_bytes",
    "compute_capability",
    "driver_version",
    "cuda_driver_version",
    "vbios_version",
    "mig_capable",
    "mig_enabled",
    "mig_pending",
)


def _compare(env: dict[str, str], probe: Path) -> int:
    """Probe vs the CLI on one node; the number of MIG devices compared."""
    seen = json.loads(
        subprocess.run(
            [str(probe), "json"], env=env, capture_output=True, text=True, check=True, timeout=60
        ).stdout
    )["gpus"]
    gpus = json.loads(_cli(env, "gpus", "--json").stdout)
    mig = {g["index"]: g for g in json.loads(_cli(env, "mig", "show", "--json").stdout)["gpus"]}
    assert len(seen) == len(gpus)
    compared = 0
    for c_view, cli in zip(seen, gpus, strict=True):
        assert {f: c_view[f] for f in _GPU_FIELDS} == {f: cli[f] for f in _GPU_FIELDS}
        # NVML writes bus IDs in upper case; nodeagent reports them in lower case.
        assert c_view["pci_bus_id"].lower() == cli["pci_bus_id"].lower()
        expected = {
            (
                i["uuid"],
                i["instance_id"],
                i["profile"],
                i["placement"]["start"],
                i["placement"]["size"],
            )
            for i in mig[cli["index"]]["instances"]
        }
        got = {
            (
                i["uuid"],
                i["instance_id"],
                i["profile"],
                i["placement"]["start"],
                i["placement"]["size"],
            )
            for i in c_view["instances"]
        }
        assert got == expected
        assert all(i["is_mig"] == 1 and i["parent_is_gpu"] for i in c_view["instances"])
        assert all(i["memory_mb"] > 0 for i in c_view["instances"])
        compared += len(got)
    return compared


@pytest.mark.parametrize("preset", sorted(presets.PRESETS))
def test_c_program_reads_what_nodeagent_reports(preset: str, probe: Path, tmp_path: Path) -> None:
    env = _node(tmp_path, preset)
    _compare(env, probe)
    gpus = json.loads(_cli(env, "gpus", "--json").stdout)
    if any(g["mig_capable"] for g in gpus):
        _apply_mig(env, tmp_path)
        assert _compare(env, probe) > 0


def test_event_wait_blocks_alone_and_honours_its_timeout(probe: Path, tmp_path: Path) -> None:
    env = _node(tmp_path, "dgx-h100")
    out = subprocess.run(
        [str(probe), "events", "400"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.splitlines()
    timed_out = json.loads(out[-1])
    assert (timed_out["rc"], timed_out["error"]) == (pynvml.NVML_ERROR_TIMEOUT, "Timeout")
    assert 0.38 <= timed_out["waited_s"] < 2.0
    assert timed_out["other_calls"] > 10  # the wait did not hold the GIL

    waiting = subprocess.Popen(
        [str(probe), "events", "20000"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert waiting.stdout is not None
        assert waiting.stdout.readline().strip() == "ready"
        time.sleep(0.3)
        _cli(env, "sim", "inject", "xid", "--gpu", "5", "--code", "48")
        got = json.loads(waiting.stdout.readline())
    finally:
        waiting.kill()
        waiting.wait()
    assert (got["rc"], got["gpu"], got["xid"]) == (0, 5, 48)
    assert got["waited_s"] < 15


_PYNVML = """
import json, pynvml
assert pynvml.nvmlDeviceGetCount  # the real module, not the simulator's stand-in
try:
    pynvml.nvmlDeviceGetCount()
except pynvml.NVMLError_Uninitialized:
    before = "uninitialized"
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(1)
try:
    pynvml.nvmlDeviceGetFanSpeed(h)
except pynvml.NVMLError_NotSupported as exc:
    fan = str(exc)
mem = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
print(json.dumps({"lib": pynvml.nvmlLib._name, "before": before, "fan": fan,
    "name": pynvml.nvmlDeviceGetName(h), "uuid": pynvml.nvmlDeviceGetUUID(h),
    "bus": pynvml.nvmlDeviceGetPciInfo(h).busId, "total": mem.total,
    "err": pynvml.nvmlErrorString(pynvml.NVML_ERROR_IN_USE)}))
pynvml.nvmlShutdown()
"""


def test_nvidia_ml_py_loads_the_library(libdir: Path, tmp_path: Path) -> None:
    """pynvml's own ctypes path (versioned symbols, structs, errors) over the C library."""
    env = _node(tmp_path, "dgx-a100") | {"LD_LIBRARY_PATH": str(libdir)}
    out = subprocess.run(
        [sys.executable, "-c", _PYNVML],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    got: dict[str, Any] = json.loads(out)
    cli = json.loads(_cli(env, "gpus", "--json").stdout)[1]
    assert got["lib"] == "libnvidia-ml.so.1"
    assert (got["before"], got["fan"], got["err"]) == (
        "uninitialized",
        "Not Supported",
        "In use by another client",
    )
    assert (got["name"], got["uuid"], got["total"]) == (
        cli["name"],
        cli["uuid"],
        cli["memory_total_bytes"],
    )
    assert got["bus"].lower() == cli["pci_bus_id"].lower()


_ATTRIBUTES = """
import json, pynvml
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
try:
    pynvml.nvmlDeviceGetAttributes_v2(gpu)
    whole = "answered"
except pynvml.NVMLError as exc:
    whole = exc.value
mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, 0)
attrs = pynvml.nvmlDeviceGetAttributes_v2(mig)
gi = pynvml.nvmlDeviceGetGpuInstanceById(gpu, pynvml.nvmlDeviceGetGpuInstanceId(mig))
profile_id = pynvml.nvmlGpuInstanceGetInfo(gi).profileId
for index in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
    try:
        profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(gpu, index)
    except pynvml.NVMLError:
        continue
    if profile.id == profile_id:
        break
print(json.dumps({"whole": whole, "slices": [attrs.gpuInstanceSliceCount, profile.sliceCount],
    "memory": [attrs.memorySizeMB, profile.memorySizeMB], "sms": attrs.multiprocessorCount}))
pynvml.nvmlShutdown()
"""


def test_device_attributes_answer_for_mig_devices_only(libdir: Path, tmp_path: Path) -> None:
    """nvml.h: nvmlDeviceGetAttributes "currently only supports MIG device handles"; a whole
    GPU gets NOT_SUPPORTED ("not supported by the device"), a MIG device its profile's sizes."""
    env = _node(tmp_path, "dgx-a100") | {"LD_LIBRARY_PATH": str(libdir)}
    _apply_mig(env, tmp_path)
    out = subprocess.run(
        [sys.executable, "-c", _ATTRIBUTES],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got: dict[str, Any] = json.loads(out.stdout)
    assert got["whole"] == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert got["slices"][0] == got["slices"][1] > 0
    assert got["memory"][0] == got["memory"][1] > 0
    assert got["sms"] > 0


def test_missing_compiler_is_one_clear_line(header: Path, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CC": "no-such-gcc",
        builder.ENV_CACHE: str(tmp_path),
        builder.ENV_HEADER: str(header),
    }
    done = subprocess.run(
        [sys.executable, "-m", "nodeagent.sim.libnvml"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "libnvml: no C compiler 'no-such-gcc': install gcc (apt-get install gcc) or set CC"
    ]


def test_a_library_built_ahead_is_used_as_is(libdir: Path, tmp_path: Path) -> None:
    # The container image builds the library in its build stage and names it; at run time
    # there is no compiler and no nvml.h, so nothing may be built.
    if os.geteuid() != 0:
        pytest.skip("a driver root's device nodes need root (mknod)")
    prebuilt = tmp_path / "prebuilt" / builder.SONAME
    prebuilt.parent.mkdir()
    # Trailing bytes a loader ignores: they tell the named copy from any cached build.
    prebuilt.write_bytes((libdir / builder.SONAME).read_bytes() + b"built-ahead")
    env = {
        **_node(tmp_path, "dgx-h100"),
        builder.ENV_LIBRARY: str(prebuilt),
        builder.ENV_HEADER: str(tmp_path / "no-nvml.h"),
        builder.ENV_CACHE: str(tmp_path / "cache"),
        "CC": "no-such-gcc",
    }
    root = tmp_path / "root"
    _cli(env, "sim", "driver-root", str(root))
    libs = next(root.glob("usr/lib/*"))
    assert (libs / "libnvidia-ml.so.1").resolve().read_bytes() == prebuilt.read_bytes()
    assert not (tmp_path / "cache").exists()


def test_a_named_library_that_is_missing_is_one_clear_line(tmp_path: Path) -> None:
    env = {**_node(tmp_path, "dgx-h100"), builder.ENV_LIBRARY: str(tmp_path / "gone.so.1")}
    done = _cli(env, "sim", "driver-root", str(tmp_path / "root"), check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) <= 2, lines  # the cause, and the hint nodeagent adds
    assert f"NODEAGENT_LIBNVML={tmp_path / 'gone.so.1'} is not a file" in lines[0]
    assert "Traceback" not in done.stderr
