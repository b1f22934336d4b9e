# syntax=docker/dockerfile:1
# The one image of the Kubernetes deployment (docs/kubernetes.md): the Dagster webserver, the daemon, the
# code location (its default command), run and step pods, and the executor pods of pools.image.
#
#   docker build -t registry.example.com/team/primus-dagster:0.1.0 .                          # CPU torch
#   docker build --build-arg TORCH_VARIANT=cu128 -t registry.example.com/team/primus-dagster:0.1.0-cu128 .
#
# Every Python package is installed under constraints.txt, the same pins `make setup` uses.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# cpu (default) or a CUDA build of the pinned torch (cu126, cu128, ...): the wheel index it comes from.
ARG TORCH_VARIANT=cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/${TORCH_VARIANT}
ARG PRIMUS_UID=10001

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home \
    PRIMUS_HOME=/data/primus \
    PRIMUS_DATA_ROOT=/data \
    PRIMUS_DEPLOYMENT=kubernetes

WORKDIR /app

# torch first, from its own index, so the CPU build (or the TORCH_VARIANT one) is what the project gets.
COPY constraints.txt /app/constraints.txt
RUN pip install -c constraints.txt --index-url "${TORCH_INDEX_URL}" torch

# The package with the `k8s` extra (dagster-postgres for the shared run storage, dagster-k8s), then the
# reference code location: definitions.py and its modules stay in /app (not installed).
COPY pyproject.toml README.md /app/
COPY primus_dagster /app/primus_dagster
RUN pip install -c constraints.txt "/app[k8s]"
COPY definitions.py workspace.yaml /app/
COPY assets /app/assets
COPY resources /app/resources
COPY sensors /app/sensors
COPY examples /app/examples

RUN useradd --uid "${PRIMUS_UID}" --user-group --create-home --home-dir /home/primus primus \
    && mkdir -p "${DAGSTER_HOME}" /data \
    && chown -R "${PRIMUS_UID}:${PRIMUS_UID}" /opt/dagster /data
USER ${PRIMUS_UID}

# The code location's gRPC server, as the Dagster Helm chart runs a user deployment (port 3030);
# the webserver and daemon Deployments override the command (deploy/kubernetes/).
EXPOSE 3030
CMD ["dagster", "api", "grpc", "--host", "0.0.0.0", "--port", "3030", "--module-name", "definitions", "--working-directory", "/app"]
