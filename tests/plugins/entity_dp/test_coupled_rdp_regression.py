"""The batched quadrature of Thm 3 / Thm C.1 (issue 10, item 5) against the values before it.

REFERENCE holds per-step RDP computed by the previous implementation (one adaptive trapezoid
per order and per row: coupled_rdp.py as of commit e630123) at the orders ORDERS and the
settings SETTINGS; the new one must agree to 1e-9 relative (it agrees to ~1e-11). The
independent cross-checks (opacus, dp-accounting, mpmath, brute force over ℓ) stay in
tests/plugins/entity_dp/test_accountant_coupled.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from graphveil.plugins.entity_dp import coupled_rdp as C
from graphveil.plugins.entity_dp.coupled_rdp import thm3_rdp, thmc1_rdp
from graphveil.privacy import DEFAULT_ORDERS, rdp_to_epsilon

ORDERS = np.array([1.1, 1.5, 2.0, 2.7, 4.0, 6.3, 10.0, 10.9, 24.0, 64.0, 256.0])
PAPER = dict(sigma=0.5, gamma=1e-5, m=5_000_000, n=1_000_000, K=5, k_neg=4)
SETTINGS = {
    "paper": PAPER,
    "paper_s1.3": {**PAPER, "sigma": 1.3},
    "small": dict(sigma=0.8, gamma=1e-3, m=20_000, n=5_000, K=3, k_neg=2),
    "tails": dict(sigma=2.0, gamma=0.2, m=3_000, n=2_000, K=3, k_neg=1),  # lower and upper tail blocks
}
REFERENCE = {
    "thm3/paper": [1.701604783245481e-06, 2.4048790366971672e-06, 3.3924576485967883e-06, 5.207974288884942e-06,
                   4.747696059206006e-05, 2.77983984677729, 10.844500518905967, 12.733311358644446,
                   39.47807985384273, 119.99484821364096, 505.0537093247772],
    "thm3/paper_s1.3": [2.8089609017844198e-08, 3.8308031039852074e-08, 5.1084075365958835e-08, 6.897617281468e-08,
                        1.0222181624899598e-07, 1.6109675066593513e-07, 2.5595848710891217e-07,
                        2.7906100265619695e-07, 6.16583153924011e-07, 10.929759456244577, 68.79335429519135],
    "thm3/small": [0.0002398541197620204, 0.00033632224434965613, 0.0004658973042507804, 0.0006692969728211305,
                   0.0011771500277436505, 0.031237101111323703, 2.9166792321013206, 3.6746411329803634,
                   14.287550594846852, 46.15554563875729, 197.1739818512693],
    "thm3/tails": [0.05780949864513372, 0.08062255397316663, 0.11058221129344932, 0.15535760388588313,
                   0.24782208796452787, 0.4422059547517518, 0.8258031896634491, 0.9283326401831663,
                   2.5396881761596783, 7.551614765775956, 31.626153518724312],
    "thmc1/paper": [0.00031702638363259036, 0.002055700981438106, 63.85616209012345, 159.6730121532847,
                    303.9295164973611, 538.9090739295592, 906.6658984913323, 995.5405837228152,
                    2283.235293262945, 6205.478545350579, 25023.225839264196],
    "thmc1/paper_s1.3": [2.4131440320689364e-07, 3.3003221549115887e-07, 4.4170907013295465e-07,
                         5.996189237678748e-07, 8.985522199664439e-07, 12.840608752292724, 71.63631269255161,
                         85.35833520210598, 279.1642873457853, 861.2891962381528, 3646.4684428144956],
    "thmc1/small": [0.0038324689543495077, 0.008585265098722943, 0.04064962434664062, 12.225093051782206,
                    44.14808361987158, 92.81052672490534, 167.1210643183195, 184.97132273078577,
                    442.46831562135173, 1225.0689163351024, 4976.335430543957],
    "thmc1/tails": [0.2316832798551034, 0.37302316246571215, 0.6479570862582988, 1.444221467699412,
                    4.869914985702196, 12.54034191556119, 24.554251934686373, 27.428155797610778,
                    68.72111197936393, 193.91225136638596, 794.7212745791826],
}
#: ε after T = 7812 steps at δ = 1/m on the whole default grid, previous implementation (bench setting)
PAPER_EPSILON = {"thm3": (4.762759313452888, 4.0), "thmc1": (44.999490502906795, 1.5)}
FUNCTIONS = {"thm3": thm3_rdp, "thmc1": thmc1_rdp}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("theorem", sorted(FUNCTIONS))
def test_matches_the_previous_implementation(theorem: str, setting: str) -> None:
    ours = FUNCTIONS[theorem](ORDERS, **SETTINGS[setting])
    np.testing.assert_allclose(ours, REFERENCE[f"{theorem}/{setting}"], rtol=1e-9, atol=0)


@pytest.mark.parametrize("theorem", sorted(FUNCTIONS))
def test_paper_epsilon_on_the_full_grid_unchanged(theorem: str) -> None:
    orders = np.asarray(DEFAULT_ORDERS)
    eps, alpha = rdp_to_epsilon(orders, 7812 * FUNCTIONS[theorem](orders, **PAPER), 1 / PAPER["m"])
    assert eps == pytest.approx(PAPER_EPSILON[theorem][0], rel=1e-9)
    assert alpha == PAPER_EPSILON[theorem][1]


@pytest.mark.parametrize("theorem", sorted(FUNCTIONS))
def test_an_order_does_not_depend_on_the_others_asked(theorem: str) -> None:
    """σ calibration evaluates a few orders at a time; they must equal the full curve's values."""
    numbers = SETTINGS["small"]
    full = FUNCTIONS[theorem](ORDERS, **numbers)
    for part in ([2.7], [1.1, 64.0], [4.0, 6.3, 10.0, 10.9]):
        index = np.searchsorted(ORDERS, part)
        np.testing.assert_allclose(FUNCTIONS[theorem](np.asarray(part), **numbers), full[index], rtol=1e-12)


def test_batched_quadrature_equals_one_beta_at_a_time() -> None:
    """Both directions, several rows: each β alone gives the batch's values."""
    log_w = C.thmc1_log_weights(1e-2, 3, np.array([0.0, 2e-4, 0.3, 1.0]))
    for betas in ([1.5, 2.5, 4.3, 10.9], [-0.5, -3.3, -31.0, -255.0]):
        batch = C.log_psi_excess_quad_many(betas, log_w, 0.6)
        alone = np.stack([C.log_psi_excess_quad(b, log_w, 0.6) for b in betas])
        np.testing.assert_allclose(batch, alone, rtol=1e-12)


def test_mixed_or_forbidden_betas_raise() -> None:
    log_w = C.thmc1_log_weights(1e-2, 3, np.array([0.1]))
    with pytest.raises(ValueError, match="beta"):
        C.log_psi_excess_quad_many([0.5], log_w, 1.0)
