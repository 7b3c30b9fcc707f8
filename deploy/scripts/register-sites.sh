#!/bin/sh
# Register sites' SuperNode public keys with the SuperLink (run by the operator).
#
#   register-sites.sh CONNECTION KEY.pub [KEY.pub ...]
#
# CONNECTION is a flwr SuperLink connection (see `graphveil fed connect`). The site name is
# the key file's name without .pub. Only registered SuperNodes may connect.
set -eu

if [ $# -lt 2 ]; then
    echo "usage: $0 CONNECTION KEY.pub [KEY.pub ...]" >&2
    exit 2
fi
conn=$1
shift
for key in "$@"; do
    name=$(basename "$key" .pub)
    flwr supernode register "$key" "$conn" --name "$name"
done
