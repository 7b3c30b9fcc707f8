#!/bin/sh
# Register sites' SuperNode public keys with the SuperLink (run by the operator).
#
#   register-sites.sh [--allow-existing] CONNECTION KEY.pub [KEY.pub ...]
#
# CONNECTION is a flwr SuperLink connection to the operator-only Control API (see
# `graphveil fed connect`). The site name is the key file's name without .pub. Only registered
# SuperNodes may connect.
#
# A key the SuperLink reports as already registered ("Public key already in use") is an ERROR
# (exit 1): this script did not register it, so someone else did, earlier or not. Check it with
# `flwr supernode list CONNECTION` (which node, which name, registered when) before trusting it;
# unregister it (`flwr supernode unregister NODE_ID CONNECTION`) if you cannot account for it.
# `--allow-existing` accepts existing registrations with a warning; use it only to re-run
# the script over keys you registered yourself and have just checked.
set -eu

allow_existing=0
if [ "${1:-}" = "--allow-existing" ]; then
    allow_existing=1
    shift
fi
if [ $# -lt 2 ]; then
    echo "usage: $0 [--allow-existing] CONNECTION KEY.pub [KEY.pub ...]" >&2
    exit 2
fi
conn=$1
shift
status=0
for key in "$@"; do
    name=$(basename "$key" .pub)
    out=$(flwr supernode register "$key" "$conn" --name "$name" --format json 2>&1) || true
    case $out in
        *'"success": true'*) echo "registered $name ($key)" ;;
        *'already in use'*)
            if [ "$allow_existing" -eq 1 ]; then
                echo "WARNING: $name ($key) was already registered (--allow-existing); check \`flwr supernode list $conn\`" >&2
            else
                echo "ERROR: the key of $name ($key) is already registered with the SuperLink, and not by this run." >&2
                echo "       Check \`flwr supernode list $conn\` before trusting it: a registration you cannot account" >&2
                echo "       for may be someone else's. Unregister it if in doubt; re-run with --allow-existing only" >&2
                echo "       for keys you registered yourself." >&2
                status=1
            fi
            ;;
        *) echo "failed to register $name ($key): $out" >&2; status=1 ;;
    esac
done
exit $status
