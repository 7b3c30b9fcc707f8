#!/bin/sh
# The server container's entrypoint: the SuperLink with TLS and SuperNode authentication on.
# The ServerApp runs as its subprocess when the operator starts a run (`flwr run`).
#
# GV_CERTS_DIR  folder with ca.crt, server.pem, server.key (default /certs)
# GV_HOST       listen address (default 0.0.0.0)
# GV_PORT       the SuperLink's one HTTPS port (default 8000)
# GV_DATABASE   SuperLink state file (default: in memory; registered keys are then lost on restart)
set -eu

certs=${GV_CERTS_DIR:-/certs}
set -- --ca "$certs/ca.crt" --cert "$certs/server.pem" --key "$certs/server.key" \
    --host "${GV_HOST:-0.0.0.0}" --port "${GV_PORT:-8000}" "$@"
if [ -n "${GV_DATABASE:-}" ]; then
    set -- "$@" --database "$GV_DATABASE"
fi
exec graphveil fed server "$@"
