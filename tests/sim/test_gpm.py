"""The simulator's GPM: pynvml's nvmlGpm* functions and structs, over the modelled load."""

from __future__ import annotations

import pynvml
import pytest

from tests.sim.conftest import two_slice_mig_device

METRICS = (
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    pynvml.NVML_GPM_METRIC_SM_UTIL,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
    pynvml.NVML_GPM_METRIC_FP64_UTIL,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC,
)


def _metrics(sim, first, second, ids=METRICS):
    """{metric id: (nvmlReturn, value)} as pynvml's caller builds and reads the struct."""
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(ids)
    request.sample1, request.sample2 = first, second
    for slot, metric_id in enumerate(ids):
        request.metrics[slot].metricId = metric_id
    answer = sim.nvmlGpmMetricsGet(request)
    return {
        int(answer.metrics[i].metricId): (
            int(answer.metrics[i].nvmlReturn),
            answer.metrics[i].value,
        )
        for i in range(len(ids))
    }


def _two_samples(sim, clock, take):
    first, second = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    take(first)
    clock.advance(1.0)
    take(second)
    return first, second


def test_support_follows_the_generation(make_sim):
    for preset, supported in (("dgx-h100", 1), ("hgx-h200", 1), ("dgx-b200", 1), ("dgx-a100", 0),
                              ("t4", 0), ("pcie-l40s", 0)):  # fmt: skip
        sim = make_sim(preset)
        support = sim.nvmlGpmQueryDeviceSupport(sim.nvmlDeviceGetHandleByIndex(0))
        assert isinstance(support, pynvml.c_nvmlGpmSupport_t)
        assert support.isSupportedDevice == supported, preset


def test_sampling_an_unsupported_gpu_is_not_supported(make_sim):
    sim = make_sim("dgx-a100")
    sample = sim.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlGpmSampleGet(sim.nvmlDeviceGetHandleByIndex(0), sample)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED
    sim.nvmlGpmSampleFree(sample)


def test_gpu_metrics_agree_with_coarse_utilisation(make_sim, control_for, clock):
    sim = make_sim("dgx-h100")
    control_for(sim).add_process(3, load=0.5)
    handle = sim.nvmlDeviceGetHandleByIndex(3)
    first, second = _two_samples(sim, clock, lambda s: sim.nvmlGpmSampleGet(handle, s))
    got = _metrics(sim, first, second)
    assert all(code == pynvml.NVML_SUCCESS for code, _ in got.values())
    coarse = sim.nvmlDeviceGetUtilizationRates(handle)
    graphics = got[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL][1]
    sm = got[pynvml.NVML_GPM_METRIC_SM_UTIL][1]
    # The engine-busy figure is the coarse utilisation (NVML rounds that to whole percent);
    # SMs are busy for part of that time only, and the pipes for part of the SM time.
    assert abs(graphics - coarse.gpu) <= 1.0
    assert 0.0 < sm < graphics
    assert 0.0 < got[pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL][1] < sm
    assert 0.0 < got[pynvml.NVML_GPM_METRIC_SM_OCCUPANCY][1] < sm
    assert abs(got[pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL][1] - 0.9 * coarse.memory) <= 1.0
    assert got[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC][1] > 0.0
    # No simulated traffic crosses NVLink: a reading of 0, not a missing one.
    assert got[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC] == (pynvml.NVML_SUCCESS, 0.0)


def test_idle_gpu_reads_zero_activity(make_sim, clock):
    sim = make_sim("hgx-h200")
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    first, second = _two_samples(sim, clock, lambda s: sim.nvmlGpmSampleGet(handle, s))
    got = _metrics(sim, first, second)
    assert got[pynvml.NVML_GPM_METRIC_SM_UTIL] == (pynvml.NVML_SUCCESS, 0.0)


def test_mig_instance_metrics_are_relative_to_the_instance(make_sim, control_for, clock):
    sim = make_sim("dgx-h100")
    handle, gi, mig = two_slice_mig_device(sim)
    gi_id = sim.nvmlGpuInstanceGetInfo(gi).id
    # 0.2 of the whole GPU is 0.7 of a 2-slice instance of a 7-slice GPU.
    control_for(sim).add_process(0, mig_uuid=sim.nvmlDeviceGetUUID(mig), load=0.2)
    first, second = _two_samples(sim, clock, lambda s: sim.nvmlGpmMigSampleGet(handle, gi_id, s))
    got = _metrics(sim, first, second)
    graphics = got[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL][1]
    assert 0.8 * 70 - 1 <= graphics <= 70 + 1
    # PCIe and NVLink belong to the GPU: not counted per instance.
    assert got[pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC][0] == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert got[pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC][0] == (
        pynvml.NVML_ERROR_NOT_SUPPORTED
    )
    # The whole GPU sees the same work as a 0.2 share of its SMs.
    gpu_first, gpu_second = _two_samples(sim, clock, lambda s: sim.nvmlGpmSampleGet(handle, s))
    whole = _metrics(sim, gpu_first, gpu_second)[pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL][1]
    assert 0.8 * 20 - 1 <= whole <= 20 + 1


def test_unknown_instance_and_mig_off(make_sim):
    sim = make_sim("dgx-h100")
    sample = sim.nvmlGpmSampleAlloc()
    handle = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlGpmMigSampleGet(handle, 1, sample)
    assert caught.value.value == pynvml.NVML_ERROR_NOT_SUPPORTED


@pytest.mark.parametrize("problem", ["version", "untaken", "mixed-devices", "freed"])
def test_metrics_get_rejects_bad_requests(make_sim, clock, problem):
    sim = make_sim("dgx-h100")
    h0, h1 = sim.nvmlDeviceGetHandleByIndex(0), sim.nvmlDeviceGetHandleByIndex(1)
    first, second = sim.nvmlGpmSampleAlloc(), sim.nvmlGpmSampleAlloc()
    sim.nvmlGpmSampleGet(h0, first)
    if problem != "untaken":
        sim.nvmlGpmSampleGet(h1 if problem == "mixed-devices" else h0, second)
    if problem == "freed":
        sim.nvmlGpmSampleFree(second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = 99 if problem == "version" else pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlGpmMetricsGet(request)
    want = (
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        if problem == "version"
        else pynvml.NVML_ERROR_INVALID_ARGUMENT
    )
    assert caught.value.value == want


def test_old_driver_lacks_the_entry_points(make_sim, control_for):
    sim = make_sim("dgx-h100")
    control_for(sim).inject("driver", 0, version="515.105.01")
    with pytest.raises(pynvml.NVMLError) as caught:
        sim.nvmlGpmQueryDeviceSupport(sim.nvmlDeviceGetHandleByIndex(0))
    assert caught.value.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
