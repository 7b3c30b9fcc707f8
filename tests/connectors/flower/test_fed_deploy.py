"""deploy/: scripts, images, compose, Kubernetes and the runbook agree with the code.

No Docker engine or cluster runs here, so these are static checks plus running the credential
scripts; the entrypoints themselves run in tests/connectors/flower/test_federation.py.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from _paths import REPO

from graphveil.connectors.flower.settings import SiteSettings

DEPLOY = REPO / "deploy"
REPO = DEPLOY.parent
SCRIPTS = sorted((DEPLOY / "scripts").glob("*.sh")) + [DEPLOY / "compose" / "prepare.sh"]
NODE_KEYS = {f.alias or n for n, f in SiteSettings.model_fields.items()}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_executable_posix_sh(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script} is not executable"
    assert script.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(script)], check=True)


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("ssh-keygen")), reason="needs openssl and ssh-keygen")
def test_credential_scripts_make_a_verifiable_chain_and_never_overwrite(tmp_path: Path) -> None:
    certs, keys = tmp_path / "certs", tmp_path / "keys"
    subprocess.run([DEPLOY / "scripts" / "make-certs.sh", certs, "DNS:link.example.org"], check=True, capture_output=True)
    subprocess.run(["openssl", "verify", "-CAfile", certs / "ca.crt", certs / "server.pem"], check=True, capture_output=True)
    text = subprocess.run(["openssl", "x509", "-in", certs / "server.pem", "-noout", "-text"],
                          check=True, capture_output=True, text=True).stdout
    assert "DNS:link.example.org" in text and "TLS Web Server Authentication" in text
    assert (certs / "server.key").stat().st_mode & 0o077 == 0 and (certs / "ca.key").stat().st_mode & 0o077 == 0
    again = subprocess.run([DEPLOY / "scripts" / "make-certs.sh", certs], capture_output=True, text=True)
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr

    subprocess.run([DEPLOY / "scripts" / "make-site-key.sh", keys, "bank-a"], check=True, capture_output=True)
    assert (keys / "bank-a.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert (keys / "bank-a.key").stat().st_mode & 0o077 == 0
    bad = subprocess.run([DEPLOY / "scripts" / "make-site-key.sh", keys, "bank a"], capture_output=True, text=True)
    assert bad.returncode == 2


@pytest.mark.parametrize("name", ["site", "server"])
def test_dockerfiles_copy_what_exists_and_install_nothing_at_run_time(name: str) -> None:
    text = (DEPLOY / "docker" / f"{name}.Dockerfile").read_text()
    for line in re.findall(r"(?m)^COPY (.+)$", text):
        for src in line.split()[:-1]:
            assert (REPO / src).exists(), f"{name}.Dockerfile copies missing {src}"
    assert "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in text and "HF_HUB_OFFLINE=1" in text
    assert re.search(r"(?m)^USER 10001", text)
    entrypoint = re.search(r'ENTRYPOINT \["(.+?)"\]', text).group(1)
    assert (DEPLOY / "scripts" / Path(entrypoint).name).is_file()


def test_compose_runs_one_server_and_three_authenticated_tls_sites() -> None:
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"superlink", "register", "site-1", "site-2", "site-3"} == set(services)
    prepare = (DEPLOY / "compose" / "prepare.sh").read_text()
    for i in (1, 2, 3):
        site = services[f"site-{i}"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in site["volumes"]}
        assert mounts["/keys/site.key"] == f"./secrets/site-{i}/site-{i}.key"
        assert mounts["/certs/ca.crt"] == "./secrets/server/ca.crt"
        assert mounts["/config/site.toml"] == f"./sites/site-{i}/site.toml"
        assert site["depends_on"]["register"]["condition"] == "service_completed_successfully"
        assert site["environment"]["GV_SUPERLINK"] == "superlink:8000"
    assert "make-certs.sh\" secrets/server DNS:superlink" in prepare  # SAN names the service sites dial
    # the node config prepare.sh writes is valid for SiteSettings, unchanged, and the shipped app's
    # task passes its policy (else the documented compose run would refuse every round)
    block = re.search(r"<<TOML\n(.*?)\nTOML", prepare, re.S).group(1).replace("$i", "1").replace("$budget", "8.0")
    _check_shipped_site(SiteSettings.from_mapping(tomllib.loads(block)))


def test_kubernetes_manifests_reference_what_they_define() -> None:
    for part in ("server", "site"):
        folder = DEPLOY / "k8s" / part
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        for resource in kustomization["resources"]:
            assert (folder / resource).is_file()
        docs = [d for r in kustomization["resources"] for d in yaml.safe_load_all((folder / r).read_text())]
        (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        pod = deployment["spec"]["template"]["spec"]
        claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
        for volume in pod["volumes"]:
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
        mounted = {m["name"] for c in pod["containers"] for m in c["volumeMounts"]}
        assert mounted == {v["name"] for v in pod["volumes"]}
    _check_shipped_site(SiteSettings.from_toml(DEPLOY / "k8s" / "site" / "site.toml"))


def _init_argv_options(argv: list[str]) -> dict[str, str]:
    i = argv.index("init")
    assert argv[i - 2:i] == ["graphveil", "budget"], argv
    opts = argv[i + 1:]
    return dict(zip(opts[::2], opts[1::2], strict=True))


def test_each_shipped_site_creates_its_ledger_once_with_budget_init() -> None:
    """No deployment makes a ledger on start-up; each ships the explicit `graphveil budget init`
    for exactly the ledger, anchor and site name of its node config."""
    k8s = DEPLOY / "k8s" / "site"
    assert "ledger-init.yaml" not in yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"]
    (pod,) = yaml.safe_load_all((k8s / "ledger-init.yaml").read_text())
    site = SiteSettings.from_toml(k8s / "site.toml")
    opts = _init_argv_options(pod["spec"]["containers"][0]["command"])
    assert opts == {"--ledger": str(site.ledger), "--anchor": str(site.ledger_anchor), "--site": site.site_name}
    claims = {d["metadata"]["name"] for d in yaml.safe_load_all((k8s / "site.yaml").read_text())
              if d["kind"] == "PersistentVolumeClaim"}
    assert {v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]} <= claims
    header = (DEPLOY / "compose" / "compose.yaml").read_text()
    line = re.search(r"budget init \\\n#\s+(.*)", header).group(1).split()
    prepare = (DEPLOY / "compose" / "prepare.sh").read_text()
    block = re.search(r"<<TOML\n(.*?)\nTOML", prepare, re.S).group(1).replace("$i", "1").replace("$budget", "8.0")
    compose_site = SiteSettings.from_mapping(tomllib.loads(block))
    opts = dict(zip(line[::2], line[1::2], strict=True))
    assert opts == {"--ledger": str(compose_site.ledger), "--anchor": str(compose_site.ledger_anchor),
                    "--site": "site-$i"}
    # the site's start-up never runs it (the entrypoint only starts `graphveil fed site`)
    body = (DEPLOY / "scripts" / "supernode-entrypoint.sh").read_text().split("set -eu", 1)[1]
    assert "budget init" not in body and "graphveil fed site" in body


def _check_shipped_site(site: SiteSettings) -> None:
    """A shipped node config carries the whole policy, shares nothing non-private, and accepts the
    shipped app's task as is."""
    from flwr.common.config import flatten_dict

    from graphveil.connectors.flower.settings import (
        FederationSettings,
        check_site_policy,
        site_run_config,
    )

    explicit = site.model_fields_set
    for key in ("delta", "privacy_unit", "accountants", "min_noise_multiplier", "max_steps_per_round"):
        assert key in explicit, f"the shipped node config does not set {key}"
    assert not site.share_utility_metrics and not site.share_epsilon
    app = tomllib.loads((REPO / "connectors" / "graphveil" / "connectors" / "flower" / "app" / "pyproject.toml").read_text())
    fed = FederationSettings.from_run_config(flatten_dict(app["tool"]["flwr"]["app"]["config"]))
    check_site_policy(site, fed, site_run_config(fed, site, seed=0), local_steps=fed.local_steps)


def test_runbook_documents_every_node_config_key_and_only_real_ones() -> None:
    runbook = (DEPLOY / "RUNBOOK.md").read_text()
    block = re.search(r"```toml\n(.*?)```", runbook, re.S).group(1)
    documented = set(re.findall(r"(?m)^#?\s*([a-z][a-z-]*) =", block))
    assert documented == NODE_KEYS - {"seed"}  # seed is for tests only
    uncommented = tomllib.loads(block)
    SiteSettings.from_mapping(uncommented)
