# syntax=docker/dockerfile:1
# The pd-operator image: `docker build -t <registry>/pd-operator:0.1.0 .` (docs/install.md).
# Stage 1 builds the wheel and installs it with the pinned dependencies into a virtualenv;
# stage 2 copies only that virtualenv into a slim image that runs as a non-root user. Only the
# operator package goes in: the tooling (operator/pd_tools: pdctl, simulators, planner) stays out.
# Pin PYTHON_IMAGE by digest in a release pipeline (python:3.11-slim-bookworm@sha256:...).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY requirements/constraints.txt requirements/constraints.txt
COPY operator/pd_operator/ operator/pd_operator/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/pd-operator \
 && /opt/pd-operator/bin/pip install --constraint requirements/constraints.txt /wheels/pd_operator-*.whl \
 && rm /opt/pd-operator/bin/pdctl \
 && /opt/pd-operator/bin/python -m pd_operator --help > /dev/null \
 && /opt/pd-operator/bin/python -m pd_operator.activator --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="pd-operator" \
      org.opencontainers.image.description="Kubernetes operator for disaggregated prefill/decode LLM inference pools" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/pd-operator/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/pd-operator /opt/pd-operator
# 65532: the conventional "nonroot" uid/gid; numeric so that runAsNonRoot can verify it.
USER 65532:65532
# /metrics and /healthz (the chart's defaults: --metrics-port 8000, --health-port 8080).
EXPOSE 8000 8080
ENTRYPOINT ["/opt/pd-operator/bin/python", "-m", "pd_operator"]
