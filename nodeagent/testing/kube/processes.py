"""nodeagent's own programs against the test control plane, as the processes users run.

- :class:`SimulatedAgent`: ``nodeagent run --simulate PRESET`` for one kubelet-less node
  (``NODE_NAME``), reaching the API server with a kubeconfig of the agent's ServiceAccount;
  :meth:`SimulatedAgent.inject` is ``nodeagent sim inject`` on that node.
- :class:`TieringService`: ``nodeagent tiering run --kubeconfig ...`` under the tiering
  service's ServiceAccount; :meth:`TieringService.kill` is ``kill -9``.

Both run as children that die with the test process (see :class:`Component`), log to a file the
failure messages quote, and stop at the end of a ``with`` block.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from nodeagent.testing.kube.controlplane import Component, Kubeconfig, free_port

NODEAGENT = [sys.executable, "-m", "nodeagent.cli.main"]


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(extra)
    return env


class _Child:
    component: Component

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process."""
        self.component.start()

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL after 10 s."""
        self.component.stop()

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill would."""
        self.component.kill()

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.component.running

    def log(self, lines: int = 40) -> str:
        """The end of the process's log, for failure messages."""
        return f"{self.component.name} log {self.component.log_path}:\n{self.component.tail(lines)}"


class SimulatedAgent(_Child):
    """The agent for one simulated node, as the DaemonSet would run it on that node.

    ``config`` is merged over a config with the health reporter on (kubeconfig set), the
    sampler and the reporter's heartbeat fast, no device plugin (there is no kubelet) and metrics
    on a free loopback port.
    """

    def __init__(
        self,
        node_name: str,
        kubeconfig: Kubeconfig,
        workdir: Path,
        *,
        preset: str = "dgx-h100",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.node_name = node_name
        self.preset = preset
        self.workdir = workdir
        self.sim_state = workdir / "sim"
        self.metrics_port = free_port()
        workdir.mkdir(parents=True, exist_ok=True)
        document: dict[str, Any] = {
            "version": "v1",
            "state_dir": str(workdir / "agent"),
            "sampler": {"interval_s": 0.2},
            "mig": {"enabled": False},
            "device_plugin": {"enabled": False},
            "metrics": {"address": f"127.0.0.1:{self.metrics_port}", "pod_attribution": False},
            "health": {"report_interval_s": 5.0},
            "kubernetes": {"enabled": True, "kubeconfig": str(kubeconfig.path)},
        }
        for key, value in (config or {}).items():
            if isinstance(value, dict) and isinstance(document.get(key), dict):
                document[key] = {**document[key], **value}
            else:
                document[key] = value
        self.config_path = workdir / "agent.yaml"
        self.config_path.write_text(yaml.safe_dump(document))
        self.component = Component(
            f"agent on {node_name}",
            [
                *NODEAGENT,
                "run",
                "--simulate",
                preset,
                "--state-dir",
                str(self.sim_state),
                "--config",
                str(self.config_path),
                "--log-level",
                "info",
            ],
            workdir / "agent.log",
            env=_env({"NODE_NAME": node_name}),
        )

    def inject(self, kind: str, gpu: int, **options: Any) -> None:
        """``nodeagent sim inject KIND --gpu N [--code C ...]`` on this node."""
        argv = [*NODEAGENT, "sim", "inject", kind, "--gpu", str(gpu)]
        for name, value in options.items():
            argv += [f"--{name.replace('_', '-')}", str(value)]
        argv += ["--simulate", self.preset, "--state-dir", str(self.sim_state)]
        result = subprocess.run(argv, capture_output=True, text=True, env=_env({}), check=False)
        if result.returncode != 0:
            raise AssertionError(f"nodeagent sim inject {kind} failed: {result.stderr.strip()}")


class TieringService(_Child):
    """One replica of the tiering service (``nodeagent tiering run``)."""

    def __init__(
        self,
        kubeconfig: Kubeconfig,
        policy: dict[str, Any],
        workdir: Path,
        *,
        identity: str,
        namespace: str = "nodeagent",
        lease_name: str = "nodeagent-tiering",
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.identity = identity
        self.metrics_port = free_port()
        policy_path = workdir / f"policy-{identity}.yaml"
        policy_path.write_text(yaml.safe_dump(policy))
        self.component = Component(
            f"tiering service {identity}",
            [
                *NODEAGENT,
                "tiering",
                "run",
                "--kubeconfig",
                str(kubeconfig.path),
                "--policy",
                str(policy_path),
                "--namespace",
                namespace,
                "--lease-name",
                lease_name,
                "--identity",
                identity,
                "--metrics-address",
                f"127.0.0.1:{self.metrics_port}",
            ],
            workdir / f"tiering-{identity}.log",
            env=_env({}),
        )
