#!/bin/sh
# Make the federation's CA and the SuperLink's TLS certificate (run once, by the operator).
#
#   make-certs.sh OUT_DIR [SAN ...]
#
# SANs are the names sites dial, e.g. DNS:superlink.example.org IP:203.0.113.7
# (default: DNS:superlink DNS:localhost IP:127.0.0.1). Writes, and refuses to overwrite:
#   OUT_DIR/ca.crt      CA certificate: give it to every site and to the flwr CLI
#   OUT_DIR/ca.key      CA private key: keep it offline; it is not needed at run time
#   OUT_DIR/server.pem  SuperLink certificate (signed by the CA)
#   OUT_DIR/server.key  SuperLink private key: only the SuperLink reads it
# Keys are ECDSA P-384; validity is GV_CERT_DAYS days (default 365).
set -eu

if [ $# -lt 1 ]; then
    echo "usage: $0 OUT_DIR [SAN ...]" >&2
    exit 2
fi
out=$1
shift
[ $# -gt 0 ] || set -- DNS:superlink DNS:localhost IP:127.0.0.1
days=${GV_CERT_DAYS:-365}
for f in ca.crt ca.key server.pem server.key; do
    if [ -e "$out/$f" ]; then
        echo "$0: $out/$f exists; refusing to overwrite (remove it to make new certificates)" >&2
        exit 1
    fi
done
san=$(printf '%s,' "$@")
san=${san%,}

umask 077
mkdir -p "$out"
work=$(mktemp -d "$out/.certs.XXXXXX")
trap 'rm -rf "$work"' EXIT

openssl ecparam -name secp384r1 -genkey -noout -out "$work/ca.key"
openssl req -x509 -new -key "$work/ca.key" -sha384 -days "$days" -subj "/CN=GraphVeil federation CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$work/ca.crt"
openssl ecparam -name secp384r1 -genkey -noout -out "$work/server.key"
openssl req -new -key "$work/server.key" -subj "/CN=GraphVeil SuperLink" -out "$work/server.csr"
printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyAgreement\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' \
    "$san" > "$work/server.ext"
openssl x509 -req -in "$work/server.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -sha384 -days "$days" -extfile "$work/server.ext" -out "$work/server.pem" 2>/dev/null
openssl verify -CAfile "$work/ca.crt" "$work/server.pem" >/dev/null

chmod 644 "$work/ca.crt" "$work/server.pem"
for f in ca.key ca.crt server.key server.pem; do
    mv "$work/$f" "$out/$f"
done
echo "wrote $out/ca.crt $out/ca.key $out/server.pem $out/server.key (SAN: $san)"
