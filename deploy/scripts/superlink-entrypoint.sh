#!/bin/sh
# The server container's entrypoint: the SuperLink with TLS and SuperNode authentication on.
# The ServerApp runs as its subprocess when the operator starts a run (`flwr run`).
#
# GV_CERTS_DIR  folder with ca.crt, server.pem, server.key (default /certs)
# GV_HOST       public address of the Fleet gateway sites dial (default 0.0.0.0)
# GV_PORT       public HTTPS port, Fleet API only (default 8000)
# GV_CONTROL_HOST, GV_CONTROL_PORT  the SuperLink itself: Control API (flwr) and Runtime API,
#               operator only (default 127.0.0.1:8001; in a pod/container, reach it with
#               `kubectl port-forward` / `docker compose exec`, never through a Service/port)
# GV_DATABASE   SuperLink state file (default: in memory; registered keys are then lost on restart)
# GV_GATEWAY_MAX_BODY, GV_GATEWAY_HEADER_TIMEOUT, GV_GATEWAY_BODY_TIMEOUT,
# GV_GATEWAY_MAX_CONNECTIONS, GV_GATEWAY_MAX_BUFFERED
#               the Fleet gateway's limits (--gateway-max-body 8MiB, … ; RUNBOOK §7), when set
set -eu

certs=${GV_CERTS_DIR:-/certs}
set -- --ca "$certs/ca.crt" --cert "$certs/server.pem" --key "$certs/server.key" \
    --host "${GV_HOST:-0.0.0.0}" --port "${GV_PORT:-8000}" \
    --control-host "${GV_CONTROL_HOST:-127.0.0.1}" --control-port "${GV_CONTROL_PORT:-8001}" "$@"
if [ -n "${GV_DATABASE:-}" ]; then
    set -- "$@" --database "$GV_DATABASE"
fi
[ -z "${GV_GATEWAY_MAX_BODY:-}" ] || set -- "$@" --gateway-max-body "$GV_GATEWAY_MAX_BODY"
[ -z "${GV_GATEWAY_HEADER_TIMEOUT:-}" ] || set -- "$@" --gateway-header-timeout "$GV_GATEWAY_HEADER_TIMEOUT"
[ -z "${GV_GATEWAY_BODY_TIMEOUT:-}" ] || set -- "$@" --gateway-body-timeout "$GV_GATEWAY_BODY_TIMEOUT"
[ -z "${GV_GATEWAY_MAX_CONNECTIONS:-}" ] || set -- "$@" --gateway-max-connections "$GV_GATEWAY_MAX_CONNECTIONS"
[ -z "${GV_GATEWAY_MAX_BUFFERED:-}" ] || set -- "$@" --gateway-max-buffered "$GV_GATEWAY_MAX_BUFFERED"
exec graphveil fed server "$@"
