#!/bin/sh
# Register sites' SuperNode public keys with the SuperLink (run by the operator).
#
#   register-sites.sh CONNECTION KEY.pub [KEY.pub ...]
#
# CONNECTION is a flwr SuperLink connection (see `graphveil fed connect`). The site name is
# the key file's name without .pub. Only registered SuperNodes may connect. A key that is
# already registered is reported and skipped, so the script can be re-run.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 CONNECTION KEY.pub [KEY.pub ...]" >&2
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
        *'already in use'*) echo "already registered: $name ($key)" ;;
        *) echo "failed to register $name ($key): $out" >&2; status=1 ;;
    esac
done
exit $status
