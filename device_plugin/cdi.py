"""The ``cdi`` device-list strategy: CDI specs written by the agent, names in ``CDIDevices``.

One spec per resource, ``<cdi_spec_dir>/<vendor>-<class>_<resource>.json`` (``gpu``,
``mig-1g.10gb``, ``gpu.shared``), from the generator the DRA driver uses
(:mod:`nodeagent.cdi`). Each physical device (GPU or MIG device; a GPU's replicas share one) is
``<resource>-<UUID>``, with its GPU's device node, a MIG device's capability nodes, the control
nodes, ``NVIDIA_VISIBLE_DEVICES`` and, on an MPS GPU, its daemon's pipe directory mounted at
the same path. Specs are rewritten whenever the served resources (or their MPS daemons) change,
removed with their resource, and left in place at shutdown so restarted containers of running
pods still resolve their devices.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from nodeagent.cdi import CdiDevice, CdiWriter, Mps, mig_cap_minors
from nodeagent.config.device_plugin import RESOURCE_PREFIX, DevicePluginSection
from nodeagent.runtime.mps import MpsPaths
from nodeagent_device_plugin.resources import PluginDevice, Resource

log = logging.getLogger(__name__)

PROC_CAPABILITIES = Path("/proc/driver/nvidia/capabilities")


def writer(section: DevicePluginSection) -> CdiWriter:
    """The spec writer of ``section.cdi_spec_kind`` in ``section.cdi_spec_dir``."""
    vendor, device_class = section.cdi_spec_kind.split("/", 1)
    return CdiWriter(section.cdi_spec_dir.absolute(), vendor, device_class)


def spec_id(resource: str) -> str:
    """The spec (and device name prefix) of a resource: its name without ``nvidia.com/``."""
    return resource.removeprefix(RESOURCE_PREFIX)


def device_names(section: DevicePluginSection, resource: str, uuids: Sequence[str]) -> list[str]:
    """The qualified CDI names Allocate returns for a container's devices."""
    cdi = writer(section)
    return [cdi.qualified(spec_id(resource), uuid) for uuid in uuids]


def _cdi_device(device: PluginDevice, mps: MpsPaths | None, proc_capabilities: Path) -> CdiDevice:
    caps: tuple[int, ...] = ()
    if device.mig_ids is not None:
        caps = mig_cap_minors(proc_capabilities, device.minor_number, *device.mig_ids)
    return CdiDevice(
        device.uuid,
        (device.uuid,),
        (device.minor_number,),
        caps,
        Mps(mps.host_pipe_dir, mps.host_log_dir) if mps is not None else None,
    )


class CdiSpecs:
    """The specs of the served resources (written only while the ``cdi`` strategy is on)."""

    def __init__(self, proc_capabilities: Path = PROC_CAPABILITIES) -> None:
        self.proc_capabilities = proc_capabilities
        self._written: dict[str, CdiWriter] = {}  # resource -> the writer of its spec

    def sync(
        self,
        section: DevicePluginSection,
        resources: Mapping[str, Resource],
        mps: Callable[[str], MpsPaths | None],
    ) -> None:
        """Write the spec of every resource in ``resources`` and remove the others'."""
        wanted = list(resources.values())
        cdi = writer(section)
        for name, old in list(self._written.items()):
            if name not in {r.name for r in wanted} or old != cdi:
                old.remove(spec_id(name))
                del self._written[name]
                log.info("removed the CDI spec of %s", name)
        for resource in wanted:
            by_uuid = {d.uuid: d for d in resource.devices}  # replicas: one device per GPU
            devices = [
                _cdi_device(d, mps(d.gpu_uuid), self.proc_capabilities) for d in by_uuid.values()
            ]
            cdi.write(spec_id(resource.name), devices)
            self._written[resource.name] = cdi
        if wanted:
            log.info(
                "CDI specs of %s written to %s",
                ", ".join(r.name for r in wanted),
                section.cdi_spec_dir,
            )

    def paths(self) -> list[Path]:
        """The spec files written (for status and tests)."""
        return [w.spec_path(spec_id(name)) for name, w in self._written.items()]
