"""What nvitop's Python API reports about the node, as JSON on stdout.

Run under ``nodeagent sim exec`` by the tests beside it; nvitop imports ``pynvml`` itself.
"""

from __future__ import annotations

import json
from typing import Any

from nvitop import NA, Device


def _value(reading: Any) -> Any:
    return None if reading is NA else reading


def report() -> list[dict[str, Any]]:
    """One entry per physical GPU, with its MIG devices and processes."""
    out: list[dict[str, Any]] = []
    for device in Device.all():
        out.append(
            {
                "index": device.index,
                "name": device.name(),
                "uuid": device.uuid(),
                "memory_used": _value(device.memory_used()),
                "memory_total": _value(device.memory_total()),
                "utilization": _value(device.gpu_utilization()),
                "temperature": _value(device.temperature()),
                "power_mw": _value(device.power_usage()),
                "mig": [
                    {
                        "uuid": mig.uuid(),
                        "name": mig.name(),
                        "gi": mig.gpu_instance_id(),
                        "memory_total": _value(mig.memory_total()),
                    }
                    for mig in device.mig_devices()
                ],
                "processes": [
                    {"pid": p.pid, "gpu_memory": _value(p.gpu_memory()), "gi": p.gpu_instance_id()}
                    for p in device.processes().values()
                ],
            }
        )
    return out


if __name__ == "__main__":
    print(json.dumps(report()))
