# One entry point per job. Each target sets up the virtual environment it needs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DIR ?= .demo
PRESET ?= dgx-h100

.PHONY: demo test lint rules bench clean kube-bins cluster nvidia-peers libnvml device-plugin-front

# The environment is rebuilt whenever pyproject.toml changes.
$(BIN)/nodeagent: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

# Run the agent on a simulated node: every component, metrics on http://127.0.0.1:9475/metrics.
# There is no kubelet here: the device plugin serves its sockets in $(DEMO_DIR)/kubelet and
# retries registration quietly, and pod attribution (the kubelet's pod-resources API) is off.
demo: $(BIN)/nodeagent
	mkdir -p $(DEMO_DIR)/kubelet
	NODEAGENT_METRICS_POD_ATTRIBUTION=false $(BIN)/nodeagent run --simulate $(PRESET) \
		--state-dir $(DEMO_DIR)/sim --kubelet-dir $(DEMO_DIR)/kubelet \
		--metrics-address 127.0.0.1:9475

# The real control plane the kube tests run on, built from the modules pinned in hack/kube
# (a cold build takes about 10 minutes on 2 cores; nothing is rebuilt while the pins hold),
# and helm from hack/helm (3-9 minutes cold), cached apart so neither rebuilds the other; the
# kubelet and fakecri for the real-kubelet tests from hack/kube/node (cached apart too; a few
# minutes after the control plane's build, 10 cold).
kube-bins:
	@bash hack/kube/build.sh
	@bash hack/kube/build-node.sh
	@bash hack/helm/build.sh

# NVIDIA's device plugin and nvidia-ctk from the modules pinned in hack/nvidia (test peers
# only, cached like helm), and the simulated libnvidia-ml.so.1 they run on (needs gcc and Go:
# it compiles against go-nvml's nvml.h; cached by its inputs).
nvidia-peers:
	@bash hack/nvidia/build.sh

libnvml: $(BIN)/nodeagent
	@$(BIN)/python -m nodeagent.sim.libnvml

# The Go program that answers the kubelet's Allocate for the agent (device_plugin.allocate_front;
# docs/device-plugin.md), cached by its sources; prints its path.
device-plugin-front:
	@bash device_plugin/front/build.sh

# kube-apiserver, etcd, kube-scheduler, kube-controller-manager and Kueue on loopback, in the
# foreground; prints the kubeconfig to export. NODES=N adds N kubelet-less 8-GPU nodes;
# KUBELETS=N adds N nodes run by a real kubelet with the agent on a simulated $(PRESET)
# (docs/kubelet.md; needs root for the kubelet's private mount namespace).
cluster: $(BIN)/nodeagent kube-bins
	$(BIN)/python -m nodeagent.testing.kube --nodes $(or $(NODES),0) \
		--kubelets $(or $(KUBELETS),0) --preset $(PRESET)

test: $(BIN)/nodeagent kube-bins
	$(BIN)/python -m pytest -q

# mypy resolves a module by its folder name, so the feature folders get links under their
# import names (nodeagent_mig -> mig, ...); pyproject.toml points mypy_path there. Remade on
# every lint, so a feature added to FEATURES gets its link in an existing checkout.
TYPECHECK := .typecheck
FEATURES := mig exporters device_plugin tiering dra
.PHONY: $(TYPECHECK)

$(TYPECHECK):
	mkdir -p $(TYPECHECK)
	for f in $(FEATURES); do ln -sfn ../$$f $(TYPECHECK)/nodeagent_$$f; done

lint: $(BIN)/nodeagent $(TYPECHECK)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The PrometheusRule manifest is generated from the Prometheus rule files; a test fails when the
# shipped copy is stale.
rules: $(BIN)/nodeagent
	$(BIN)/python -m nodeagent_exporters.rules --write

clean:
	rm -rf $(VENV) $(DEMO_DIR) $(TYPECHECK) .mypy_cache .ruff_cache .pytest_cache
