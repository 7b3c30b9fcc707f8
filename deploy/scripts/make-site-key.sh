#!/bin/sh
# Make a site's SuperNode authentication key pair (run by the data owner, at the site).
#
#   make-site-key.sh OUT_DIR SITE_NAME
#
# Writes OUT_DIR/SITE_NAME.key (private: stays at the site, read by the SuperNode) and
# OUT_DIR/SITE_NAME.pub (public: send it to the federation operator, who registers it with
# `flwr supernode register`). ECDSA P-384, as Flower's SuperNode authentication expects.
set -eu

if [ $# -ne 2 ]; then
    echo "usage: $0 OUT_DIR SITE_NAME" >&2
    exit 2
fi
out=$1
name=$2
case $name in
    ''|*[!A-Za-z0-9._-]*) echo "$0: site name '$name' may use letters, digits, '.', '_' and '-' only" >&2; exit 2 ;;
esac
if [ -e "$out/$name.key" ] || [ -e "$out/$name.pub" ]; then
    echo "$0: $out/$name.key or $out/$name.pub exists; refusing to overwrite" >&2
    exit 1
fi
umask 077
mkdir -p "$out"
ssh-keygen -q -t ecdsa -b 384 -N "" -C "graphveil-site-$name" -f "$out/$name.key"
mv "$out/$name.key.pub" "$out/$name.pub"
chmod 644 "$out/$name.pub"
echo "wrote $out/$name.key (keep at the site) and $out/$name.pub (send to the operator)"
