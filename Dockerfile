# nodeagent container image: the agent for the Kubernetes DaemonSet (deploy/kubernetes).
#
# The install step is the tested one: `pip install .` from the source tree into a virtual
# environment, as `make` does for development (there with `-e '.[dev]'`). Build with
#   docker build -t nodeagent:0.1.0 .
# NVIDIA's NVML is not in the image: the NVIDIA container toolkit mounts the host driver's
# libnvidia-ml.so and the GPU devices when the container asks for them (NVIDIA_VISIBLE_DEVICES).
# The image does carry the simulated libnvidia-ml.so.1 (docs/simulator.md), outside the loader's
# path: only `nodeagent sim exec --driver` and `sim driver-root` use it, named by
# NODEAGENT_LIBNVML, so that NVML programs run on a simulated node in the container too.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
ARG GO_IMAGE=golang:1.26.0-bookworm

# NVIDIA's nvml.h, which the simulated library is compiled against, from the go-nvml module
# hack/nvidia pins, found as `make libnvml` finds it (the header is never part of this tree).
FROM ${GO_IMAGE} AS nvml-header
WORKDIR /src
COPY hack/nvidia/ hack/nvidia/
RUN cp "$(bash hack/nvidia/build.sh --nvml-header)" /nvml.h

# The Allocate front (device_plugin/front): a static Go program that answers the kubelet's
# Allocate for the agent; the image turns it on (NODEAGENT_DEVICE_PLUGIN_ALLOCATE_FRONT below).
FROM ${GO_IMAGE} AS front
WORKDIR /src
COPY device_plugin/front/ device_plugin/front/
RUN cp "$(bash device_plugin/front/build.sh)" /nodeagent-device-plugin-front

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# gcc for the simulated library only; this stage is thrown away. Debian's release pins it.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY nodeagent/ nodeagent/
COPY mig/ mig/
COPY device_plugin/ device_plugin/
COPY exporters/ exporters/
COPY tiering/ tiering/
COPY dra/ dra/
COPY systemd/ systemd/
RUN python -m venv /opt/nodeagent \
    && /opt/nodeagent/bin/pip install --no-cache-dir .
COPY --from=nvml-header /nvml.h /tmp/nvml.h
# Built here, where the compiler and the header are, against the Python the image runs, from
# the installed package (outside /src, whose source tree would otherwise be imported).
WORKDIR /opt/nodeagent
RUN NODEAGENT_NVML_HEADER=/tmp/nvml.h NODEAGENT_LIBNVML_CACHE=/opt/nodeagent/libnvml \
        /opt/nodeagent/bin/python -m nodeagent.sim.libnvml > /tmp/libnvml-dir \
    && ln -s "$(cat /tmp/libnvml-dir)/libnvidia-ml.so.1" /opt/nodeagent/libnvml/libnvidia-ml.so.1

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="nodeagent" \
      org.opencontainers.image.description="Node-level GPU sharing and health agent: MIG, device plugin, health and metrics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/nodeagent/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    NODEAGENT_LIBNVML=/opt/nodeagent/libnvml/libnvidia-ml.so.1 \
    NODEAGENT_DEVICE_PLUGIN_ALLOCATE_FRONT=/opt/nodeagent/bin/nodeagent-device-plugin-front
COPY --from=build /opt/nodeagent /opt/nodeagent
COPY --from=front /nodeagent-device-plugin-front /opt/nodeagent/bin/
# An unprivileged default for `docker run nodeagent ...` (simulation, planning, `gpus`). The
# DaemonSet runs the agent as root with only CAP_SYS_ADMIN: the kubelet's sockets are root-only
# and the driver allows MIG changes only with that capability (docs/operations.md).
RUN useradd --system --uid 65532 --home-dir /var/lib/nodeagent --create-home \
        --shell /usr/sbin/nologin nodeagent
USER 65532:65532
WORKDIR /var/lib/nodeagent
EXPOSE 9475
HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:9475/healthz', timeout=2).status != 200)"]
ENTRYPOINT ["nodeagent"]
CMD ["run"]
