#!/bin/sh
# A site container's entrypoint: this site's SuperNode, after GraphVeil checked its node config.
#
# GV_SUPERLINK     SuperLink address HOST:PORT (required)
# GV_NODE_CONFIG   the site's node config TOML (default /site/site.toml)
# GV_CA            CA certificate of the federation (default /certs/ca.crt)
# GV_SITE_KEY      this site's SuperNode private key (default /keys/site.key)
# GV_HOST, GV_PORT address of the SuperNode's local runtime API (default 127.0.0.1:9094)
#
# The site's ledger, its key and its anchor must exist: the site's operator creates them once with
# `graphveil budget init` (deploy/RUNBOOK.md §4). This entrypoint never creates them; without them
# `graphveil fed site` exits 2 naming the missing file and the init command.
set -eu

: "${GV_SUPERLINK:?set GV_SUPERLINK to the SuperLink address HOST:PORT}"
exec graphveil fed site --node-config "${GV_NODE_CONFIG:-/site/site.toml}" \
    --superlink "$GV_SUPERLINK" --ca "${GV_CA:-/certs/ca.crt}" --key "${GV_SITE_KEY:-/keys/site.key}" \
    --host "${GV_HOST:-127.0.0.1}" --port "${GV_PORT:-9094}" "$@"
