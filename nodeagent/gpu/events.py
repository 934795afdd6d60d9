"""Events: XID and ECC events from an NVML event set, attributed to their GPU."""

from __future__ import annotations

import logging
import time
from typing import Any

from nodeagent.gpu import errors
from nodeagent.gpu.errors import GpuLost
from nodeagent.gpu.nvml import Nvml, address, instance_id, text
from nodeagent.gpu.types import EventKind, GpuEvent

log = logging.getLogger(__name__)

# NVML event type bits (nvml.h nvmlEventType*) and what the agent calls them.
_EVENT_SBE = 0x1
_EVENT_DBE = 0x2
_EVENT_XID = 0x8
_EVENT_KINDS: dict[int, EventKind] = {
    _EVENT_XID: EventKind.XID,
    _EVENT_SBE: EventKind.ECC_SINGLE_BIT,
    _EVENT_DBE: EventKind.ECC_DOUBLE_BIT,
}


class EventWatcher:
    """An NVML event set registered for XID and ECC events on every GPU that supports them."""

    def __init__(self, nvml: Nvml) -> None:
        self._nvml = nvml
        self._set: Any = nvml.call("nvmlEventSetCreate")
        self.registered: tuple[int, ...] = ()  # GPU indices with at least one event registered
        registered: list[int] = []
        self._uuids: dict[int, str] = {}
        wanted = _EVENT_XID | _EVENT_SBE | _EVENT_DBE
        for index in range(nvml.count):
            try:
                handle = nvml.handle(index)
                supported = nvml.optional("nvmlDeviceGetSupportedEventTypes", handle, gpu=index)
                mask = wanted & int(supported or 0)
                if not mask:
                    continue
                if nvml.try_call("nvmlDeviceRegisterEvents", handle, mask, self._set, gpu=index):
                    registered.append(index)
                    # Read now: a GPU that falls off the bus can no longer say who it was.
                    self._uuids[index] = text(nvml.call("nvmlDeviceGetUUID", handle, gpu=index))
            except GpuLost as exc:
                # A lost GPU sends no events; the sampler reports it as lost.
                log.warning("not watching events on GPU %d: %s", index, exc)
        self.registered = tuple(registered)
        # Events name their GPU by handle. Matching the handle's address against the handles we
        # hold needs no NVML call, so an event from a GPU that just fell off the bus (XID 79)
        # is still attributed; NVML hands out one fixed handle per device.
        self._by_address: dict[int | None, int] = {
            address(handle): i for i, handle in nvml.handles().items()
        }

    def wait(self, timeout_s: float) -> GpuEvent | None:
        """Block until an event arrives or the timeout passes (then ``None``)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        while True:
            remaining_ms = max(int((deadline - time.monotonic()) * 1000), 0)
            # TIMEOUT is NVML's "nothing happened", an answer rather than an error.
            data, code = self._nvml.attempt(
                "nvmlEventSetWait",
                self._set,
                remaining_ms,
                gpu=None,
                expected=frozenset({errors.NVML_ERROR_TIMEOUT}),
            )
            if code == errors.NVML_ERROR_TIMEOUT:
                return None
            kind = _EVENT_KINDS.get(int(data.eventType))
            if kind is not None:
                return self._event(kind, data)
            # Not one of ours (a driver may deliver more than the mask asked for): keep waiting.
            if time.monotonic() >= deadline:
                return None

    def _event(self, kind: EventKind, data: Any) -> GpuEvent:
        nvml = self._nvml
        index = self._by_address.get(address(data.device))
        if index is None:
            index = int(nvml.call("nvmlDeviceGetIndex", data.device))
        uuid = self._uuids.get(index)
        if uuid is None:
            uuid = text(nvml.call("nvmlDeviceGetUUID", data.device, gpu=index))
        return GpuEvent(
            kind=kind,
            gpu_index=index,
            gpu_uuid=uuid,
            data=int(data.eventData),
            gpu_instance_id=instance_id(int(data.gpuInstanceId)),
            compute_instance_id=instance_id(int(data.computeInstanceId)),
            timestamp_s=time.time(),
        )

    def close(self) -> None:
        """Free the event set."""
        if self._set is not None:
            self._nvml.call("nvmlEventSetFree", self._set)
            self._set = None

    def __enter__(self) -> EventWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
