"""Read-only commands load only what they use: no Kubernetes client, gRPC, Prometheus client or
agent wiring at start (bench/cli_startup.py measures the time this saves)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Packages a read-only command has no use for; each costs tens to hundreds of ms to import.
HEAVY = (
    "kubernetes",
    "grpc",
    "prometheus_client",
    "pydantic",  # the config models: only commands that read the agent's config need it
    "nodeagent_tiering",
    "nodeagent_device_plugin",
    "nodeagent_exporters",
    "nodeagent.agent.daemon",
    "nodeagent.kube",
)

PROBE = """
import json, sys
sys.argv = ["nodeagent", *json.loads(sys.argv[1])]
from nodeagent.cli.main import main
try:
    main()
except SystemExit:
    pass
sys.stdout = sys.__stdout__
print("MODULES=" + json.dumps(sorted(sys.modules)))
"""


# `health` reads the agent's config (its thresholds), so it loads the config models;
# bench/cli_startup.py times it against the budget.
READS_CONFIG = {"health": {"pydantic"}}


@pytest.mark.parametrize(
    "command",
    [["--version"], ["gpus"], ["topo"], ["mig", "show"], ["health"], ["status"]],
    ids=lambda c: " ".join(c),
)
def test_a_read_only_command_imports_nothing_heavy(tmp_path: Path, command: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env.update(NODEAGENT_SIMULATE="dgx-h100", NODEAGENT_SIM_STATE=str(tmp_path / "sim"))
    env["NODEAGENT_STATE_DIR"] = str(tmp_path / "agent")
    result = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(command)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    line = next(x for x in result.stdout.splitlines() if x.startswith("MODULES="))
    modules = json.loads(line.removeprefix("MODULES="))
    allowed = READS_CONFIG.get(" ".join(command), set())
    loaded = sorted(
        {
            h
            for h in HEAVY
            for m in modules
            if (m == h or m.startswith(h + ".")) and h not in allowed
        }
    )
    assert loaded == [], f"`nodeagent {' '.join(command)}` imported {loaded}"
