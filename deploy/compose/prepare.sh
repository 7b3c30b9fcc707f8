#!/bin/sh
# Prepare the compose demo: the CA and SuperLink certificate, one key pair per site, a share of
# the bundled CiteSeer graph per site, and each site's node config. Needs openssl, ssh-keygen and
# a Python with graphveil installed (or set GV_PYTHON). Safe to re-run: existing files are kept.
set -eu
cd "$(dirname "$0")"
scripts=../scripts
python=${GV_PYTHON:-python3}
budget=${GV_EPSILON_BUDGET:-8.0}

[ -e secrets/server/ca.crt ] || "$scripts/make-certs.sh" secrets/server DNS:superlink DNS:localhost IP:127.0.0.1
mkdir -p secrets/public-keys out
for i in 1 2 3; do
    name=site-$i
    [ -e "secrets/$name/$name.key" ] || "$scripts/make-site-key.sh" "secrets/$name" "$name"
    cp "secrets/$name/$name.pub" "secrets/public-keys/$name.pub"
done
if [ ! -e sites/site-3/data/edges.tsv ]; then
    "$python" -m graphveil.connectors.flower.partition --sites 3 --out sites/.partition
    for i in 1 2 3; do
        mkdir -p "sites/site-$i"
        rm -rf "sites/site-$i/data"
        mv "sites/.partition/site-$i" "sites/site-$i/data"
    done
    rmdir sites/.partition
fi
for i in 1 2 3; do
    cat > "sites/site-$i/site.toml" <<TOML
# Node config of site-$i (paths are inside the site container).
site-name = "site-$i"
data-source = "edge_list"
data-path = "/data/edges.tsv"
data-entities = "/data/entities.jsonl"
epsilon-budget = $budget
ledger = "/ledger/ledger.sqlite"
ledger-anchor = "/anchor/ledger.head"   # own volume: a restored ledger backup is refused
# The site's privacy policy (deploy/RUNBOOK.md §4): a task that differs is refused.
delta = 1e-6                       # well below 1/(relations of this site); the site's, not the task's
privacy-unit = "edge"              # the demo app trains edge-level DP
min-records = 100                  # public lower bound on training relations: ε uses it, not the size
accountants = "edge_rdp"
min-noise-multiplier = 0.5
max-steps-per-round = 100
share-utility-metrics = false      # true: also send held-out MRR/PREC@1 (not privatized)
share-epsilon = false              # true: also send ε spent (depends on the graph size)
TOML
done
# The containers run as uid 10001: let them read the keys and data.
chmod -R a+rX sites secrets/public-keys secrets/server/ca.crt
# Demo only: on a real site, give the key to the container user instead (chown 10001).
chmod a+r secrets/server/server.key
for i in 1 2 3; do chmod a+r "secrets/site-$i/site-$i.key"; done
echo "ready: docker compose build, then once per site (its ledger, key and anchor; never on start):"
echo "  docker compose run --rm --no-deps --entrypoint graphveil site-N budget init \\"
echo "      --ledger /ledger/ledger.sqlite --anchor /anchor/ledger.head --site site-N"
echo "then: docker compose up -d"
