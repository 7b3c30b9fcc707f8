# syntax=docker/dockerfile:1
# The GraphVeil server image: Flower's SuperLink, the GraphVeil ServerApp (run by the SuperLink
# as a subprocess when the operator starts a run) and the flwr CLI, all installed at build time.
#
# Build from the repository root:
#   docker build -f deploy/docker/server.Dockerfile -t graphveil-server:0.1.0 .
#
# Mounts (see deploy/RUNBOOK.md):
#   /certs   ca.crt, server.pem, server.key (read-only)
#   /state   the SuperLink's state (registered site keys, runs)
#   /out     the ServerApp's output (run with --run-config 'output-dir="/out"')
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    GV_CERTS_DIR=/certs GV_DATABASE=/state/superlink.db

RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /opt/graphveil
COPY pyproject.toml setup.py README.md ./
COPY framework ./framework
COPY plugins ./plugins
COPY connectors ./connectors
RUN pip install . \
    && python -c "import graphveil.connectors.flower.server; print('graphveil server ready')"

COPY deploy/scripts/superlink-entrypoint.sh deploy/scripts/register-sites.sh /usr/local/bin/
RUN useradd --create-home --uid 10001 graphveil \
    && mkdir -p /certs /state /out \
    && chown graphveil /state /out
USER 10001:10001
WORKDIR /out
VOLUME ["/state", "/out"]
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/superlink-entrypoint.sh"]
