"""``graphveil privacy epsilon|calibrate``: JSON output, the host path, and exit 2 on bad values."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest

from graphveil.apps.cli_privacy import add_privacy_parser, main, run_privacy
from graphveil.contract.errors import GraphVeilError
from graphveil.contract.hookspecs import hookimpl
from graphveil.contract.host import PluginHost
from graphveil.plugins.edge_dp.accountant import EdgeRdpAccountant
from graphveil.plugins.edge_dp.pld_accountant import EdgePldAccountant
from graphveil.plugins.entity_dp.accountant import CoupledRdpAccountant
from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import DEFAULT_DELTA_RULE, DEFAULT_ORDERS, rdp_to_epsilon

ORDERS = np.asarray(DEFAULT_ORDERS)
PAPER = ["--nodes", "1e6", "--edges", "5e6", "--degree-cap", "5", "--k-neg", "4", "--sampling-rate", "1e-5"]
SMALL = ["--nodes", "5000", "--edges", "20000", "--degree-cap", "3", "--k-neg", "2", "--sampling-rate", "1e-3"]


class _Accountants:
    """Only the accountant hooks: the tests do not depend on the other plugin modules."""

    @hookimpl
    def graphveil_accountants(self):
        return {"coupled_rdp": CoupledRdpAccountant, "edge_rdp": EdgeRdpAccountant, "edge_pld": EdgePldAccountant}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    h = PluginHost(autoload=False)
    h.register(_Accountants(), "accountants")
    return h


def _json(capsys: pytest.CaptureFixture[str], host: PluginHost, *argv: str) -> dict:
    assert main(["privacy", *argv, "--json"], host=host) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1  # exactly one JSON object
    return json.loads(lines[0])


def test_entity_epsilon_paper_setting(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "epsilon", "--method", "entity", "--clipping", "freq", *PAPER,
                "--sigma", "0.5", "--steps", "7812")
    assert {"epsilon", "delta", "alpha", "rdp", "sigma"} <= set(out)
    # default δ: the run's rule over the n = 1e6 entities (a run on these sizes would report this ε)
    assert out["delta"] == 1e-7 and out["delta_rule"] == DEFAULT_DELTA_RULE and out["num_units"] == 1_000_000
    rdp = np.array(out["rdp"])
    assert rdp.shape == (len(ORDERS), 2) and np.array_equal(rdp[:, 0], ORDERS)
    direct = thm3_rdp(ORDERS, 0.5, 1e-5, 5_000_000, 1_000_000, 5, 4)
    np.testing.assert_allclose(rdp[:, 1], direct, rtol=1e-12)
    eps, alpha = rdp_to_epsilon(ORDERS, 7812 * direct, 1e-7)
    assert out["epsilon"] == pytest.approx(eps, rel=1e-12) and out["alpha"] == alpha


def test_entity_standard_clipping_uses_thm_c1(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "epsilon", "--method", "entity", "--clipping", "standard", *SMALL,
                "--sigma", "2", "--steps", "100", "--delta", "1e-6")
    direct = thmc1_rdp(ORDERS, 2.0, 1e-3, 20_000, 5_000, 3, 2)
    assert out["epsilon"] == pytest.approx(rdp_to_epsilon(ORDERS, 100 * direct, 1e-6)[0], rel=1e-12)
    assert out["profile"]["theorem"].startswith("Thm C.1")


def test_calibrate_json(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "calibrate", "--method", "entity", *SMALL, "--steps", "500",
                "--target-epsilon", "3")
    assert {"sigma", "epsilon"} <= set(out)
    assert out["epsilon"] <= 3.0 and out["steps"] == 500 and out["noise_multiplier"] == out["sigma"]
    tighter = rdp_to_epsilon(ORDERS, 500 * thm3_rdp(ORDERS, out["sigma"] * 0.99, 1e-3, 20_000, 5_000, 3, 2),
                             out["delta"])[0]
    assert tighter > 3.0


def test_edge_epsilon_matches_dp_accounting(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "epsilon", "--method", "edge", "--sampling-rate", "0.004", "--sigma", "0.9",
                "--steps", "2500", "--delta", "1e-6")
    lib = dp_accounting.rdp.RdpAccountant(orders=list(ORDERS))
    lib.compose(dp_accounting.PoissonSampledDpEvent(0.004, dp_accounting.GaussianDpEvent(0.9)), 2500)
    assert out["epsilon"] == pytest.approx(lib.get_epsilon(1e-6), rel=1e-12)
    assert out["mechanism"] == "edge_rdp"


def test_edge_pld_reports_both_epsilons(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--method", "edge", "--sampling-rate", "0.004", "--sigma", "0.9", "--steps", "2500", "--delta", "1e-6"]
    rdp = _json(capsys, host, "epsilon", *argv)
    pld = _json(capsys, host, "epsilon", *argv, "--accountant", "edge_pld")
    assert pld["mechanism"] == "edge_pld" and pld["epsilon_rdp"] == pytest.approx(rdp["epsilon"], rel=1e-12)
    assert pld["epsilon"] == pld["epsilon_pld"] < rdp["epsilon"]
    assert main(["privacy", "epsilon", *argv, "--accountant", "edge_pld"], host=host) == 0
    text = capsys.readouterr().out
    assert "ε (PLD)" in text and "ε (RDP)" in text


def test_zero_steps_spend_nothing_but_show_the_curve(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    out = _json(capsys, host, "epsilon", "--method", "entity", *SMALL, "--sigma", "1.5", "--steps", "0")
    assert out["epsilon"] == 0.0 and out["steps"] == 0
    np.testing.assert_allclose([v for _, v in out["rdp"]], thm3_rdp(ORDERS, 1.5, 1e-3, 20_000, 5_000, 3, 2))


def test_human_table(host: PluginHost, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["privacy", "epsilon", "--method", "edge", "--sampling-rate", "0.01", "--sigma", "1",
                 "--steps", "10", "--edges", "1000"], host=host) == 0
    text = capsys.readouterr().out
    assert "ε" in text and not text.lstrip().startswith("{")
    assert f"δ          0.0001 ({DEFAULT_DELTA_RULE}, n=1000)" in text  # 1000 relations: 1/(10n)


def test_edge_default_delta_counts_relations_and_explicit_delta_is_kept(
        host: PluginHost, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    argv = ["epsilon", "--method", "edge", "--sampling-rate", "0.01", "--sigma", "1", "--steps", "10"]
    out = _json(capsys, host, *argv, "--edges", "1001")
    assert (out["delta"], out["delta_rule"], out["num_units"]) == (1e-5, DEFAULT_DELTA_RULE, 1001)
    paper = _json(capsys, host, *argv, "--edges", "1001", "--delta", str(1 / 1001))  # the paper's 1/|E|
    assert paper["delta"] == 1 / 1001 and paper["delta_rule"] == "explicit"
    assert paper["epsilon"] < out["epsilon"]
    assert "not below 1/n for n=1001" in caplog.text  # δ = 1/n is honoured, with a warning


@pytest.mark.parametrize("argv", [
    ["calibrate", "--method", "entity", *SMALL, "--steps", "10", "--target-epsilon", "0"],
    ["calibrate", "--method", "entity", *SMALL, "--steps", "10", "--target-epsilon", "-2"],
    ["calibrate", "--method", "entity", *SMALL, "--steps", "1000000", "--target-epsilon", "1e-6"],
    ["epsilon", "--method", "entity", *SMALL, "--steps", "10", "--sigma", "1", "--delta", "1.5"],
    ["epsilon", "--method", "entity", *SMALL, "--steps", "10", "--sigma", "1", "--delta", "0"],
    ["epsilon", "--method", "entity", *SMALL, "--steps", "10", "--sigma", "0"],
    ["epsilon", "--method", "entity", *SMALL, "--steps", "10", "--sigma", "nan"],
    ["epsilon", "--method", "entity", *SMALL, "--steps", "-1", "--sigma", "1"],
    ["epsilon", "--method", "entity", *SMALL[:4], "--degree-cap", "0", *SMALL[6:], "--steps", "1", "--sigma", "1"],
    ["epsilon", "--method", "entity", "--nodes", "10", *SMALL[2:], "--steps", "1", "--sigma", "1"],
    ["epsilon", "--method", "entity", *SMALL[:-1], "0", "--steps", "1", "--sigma", "1"],
    ["epsilon", "--method", "entity", *SMALL[2:], "--steps", "1", "--sigma", "1"],
    ["epsilon", "--method", "edge", "--sampling-rate", "0.1", "--steps", "1", "--sigma", "1"],
    ["epsilon", "--method", "edge", "--sampling-rate", "0.1", "--steps", "1", "--sigma", "1", "--delta", "1e-5",
     "--k-neg", "3"],
    ["epsilon", "--method", "entity", *SMALL, "--steps", "1", "--sigma", "1", "--accountant", "edge_pld"],
    ["epsilon", "--method", "edge", "--sampling-rate", "0.1", "--steps", "1", "--sigma", "1", "--delta", "1e-5",
     "--accountant", "coupled_rdp"],
])
def test_bad_values_exit_2_with_one_line(host: PluginHost, capsys: pytest.CaptureFixture[str], argv: list) -> None:
    assert main(["privacy", *argv, "--json"], host=host) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    message = captured.err.strip()
    assert message.startswith("graphveil: error: ") and "\n" not in message


def test_run_privacy_raises_graphveil_errors(host: PluginHost) -> None:
    parser = argparse.ArgumentParser()
    add_privacy_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["privacy", "epsilon", "--method", "entity", *SMALL, "--steps", "1",
                              "--sigma", "-1"])
    with pytest.raises(GraphVeilError, match="--sigma"):
        run_privacy(args, host)


def test_malformed_numbers_are_usage_errors(host: PluginHost) -> None:
    with pytest.raises(SystemExit) as info:
        main(["privacy", "epsilon", "--method", "entity", "--edges", "5.5", "--steps", "1", "--sigma", "1",
              "--sampling-rate", "0.1"], host=host)
    assert info.value.code == 2


def test_framework_module_does_not_import_plugins() -> None:
    code = ("import sys, graphveil.apps.cli_privacy; "
            "bad = [m for m in sys.modules if m.startswith(('graphveil.plugins', 'graphveil.connectors'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
