"""posttrain/teach/forces.py, lesson 26's three-forces simulator: losses and scores worked
by hand on a fixed noise table, the measured inputs against their closed forms, and the
recipes each corner recovers."""

from __future__ import annotations

import pytest

from posttrain.teach import forces as F

# per-sample relative variances chosen so that v / (1 + v) is round: 1/3, 0.4, 0.75 (in the
# measured order: critic < group < DPO's assumed 0.5 < none)
NOISE = {"critic": 0.5, "group": 2 / 3, "none": 3.0}
DESIGN = {d.recipe: d for d in F.DESIGNS}


def test_method_losses_by_hand():
    # PPO on a reward model: signal 1 − 0.6; estimator 0.5 / 1.5; cost (4 copies + 2 for generating) / 6
    assert F.method_losses(F.PPO_RM, True, 1.0, NOISE) == pytest.approx(
        {"signal": 0.4, "estimator": 1 / 3, "cost": 1.0})
    # DPO: signal 1 − 0.6 · 0.75; the assumed 0.5; cost 2 / 6 (nothing generated)
    assert F.method_losses(F.DPO, True, 1.0, NOISE) == pytest.approx(
        {"signal": 0.55, "estimator": 0.5, "cost": 1 / 3})
    # a verifier pays nothing where it cannot check, and (1 − fidelity) of the truth where it can
    assert F.method_losses(F.GRPO_VERIFIER, False, 1.0, NOISE)["signal"] == 1.0
    assert F.method_losses(F.GRPO_VERIFIER, True, 0.75, NOISE) == pytest.approx(
        {"signal": 0.25, "estimator": 0.4, "cost": 4 / 6})


def test_design_losses_mix_by_coverage():
    # Tülu 3 on half checkable prompts: DPO on one half, PPO on a verifier on the other
    losses = F.design_losses(DESIGN["Tülu 3"], 0.5, 1.0, NOISE)
    assert losses == pytest.approx({"signal": 0.5 * 0.55 + 0.5 * 0.0, "estimator": 0.5 * 0.5 + 0.5 / 3,
                                    "cost": 0.5 * (2 / 6) + 0.5 * (5 / 6)})
    # R1 at coverage 0.8: the reward model's 0.4 on a fifth; cost 0.2 · 5/6 + 0.8 · 4/6 = 0.7
    assert F.design_losses(DESIGN["R1"], 0.8, 1.0, NOISE) == pytest.approx(
        {"signal": 0.08, "estimator": 0.4, "cost": 0.7})
    with pytest.raises(ValueError, match="coverage"):
        F.design_losses(DESIGN["R1"], 1.5, 1.0, NOISE)


def test_score_by_hand():
    losses = {"signal": 0.275, "estimator": 0.5, "cost": 7 / 12}
    # weights (1, 0, 1) are the point (½, 0, ½); plus 0.001 × the sum of the losses
    assert F.score(losses, (1, 0, 1)) == pytest.approx(0.5 * 0.275 + 0.5 * 7 / 12 + 1e-3 * (0.275 + 0.5 + 7 / 12))
    assert F.score(losses, (2, 0, 2)) == F.score(losses, (1, 0, 1))  # only the direction counts


def test_weights_are_checked():
    assert F.normalised((2, 1, 1)) == (0.5, 0.25, 0.25)
    with pytest.raises(ValueError, match="weight 0"):
        F.normalised((0, 0, 0))
    with pytest.raises(ValueError, match=">= 0"):
        F.normalised((1, -1, 0))


@pytest.mark.parametrize("noise", [NOISE, None], ids=["hand table", "measured"])
def test_the_corners_recover_the_recipes(noise):
    noise = noise or F.estimator_noise(groups=5_000)
    assert F.corners(1.0, noise) == {
        "all signal, every prompt checkable": "R1-Zero",
        "all signal, a fifth of the prompts uncheckable": "R1",
        "all estimator, nothing checkable": "RLHF (InstructGPT)",
        "all cost": "DPO (Zephyr)",
        "signal and cost, half the prompts checkable": "Tülu 3",
    }


def test_exact_ties_keep_the_listed_order():
    # every prompt checkable: R1 is R1-Zero, and the first listed wins
    top = F.rank((1, 0, 0), 1.0, 1.0, NOISE)
    assert top[0]["losses"] == top[1]["losses"]
    assert [row["design"].recipe for row in top[:2]] == ["R1-Zero", "R1"]


def test_a_verifier_that_pays_every_exploit_sends_the_signal_corner_to_a_reward_model():
    assert F.rank((1, 0, 0), 1.0, 0.0, NOISE)[0]["design"].recipe == "RLOO (back to basics)"


def test_verifier_fidelity_on_the_packs():
    assert F.verifier_fidelity("final_int/cot-v1") == 1.0
    assert F.verifier_fidelity("hackable/substring") == 0.0  # pays all 24 exploits
    assert F.verifier_fidelity("hackable/multi-final") == 0.75  # pays 6 of 24


def test_estimator_noise_matches_its_closed_forms():
    p = 0.3
    noise = F.estimator_noise(p=p, k=16, groups=20_000)
    # REINFORCE with r = a: g = a(1 − p), relative variance (1 − p) / p
    assert noise["none"] == pytest.approx((1 - p) / p, rel=0.05)
    # a perfect critic: g = (a − p)², relative variance ((1 − p)³ + p³) / (p(1 − p)) − 1
    assert noise["critic"] == pytest.approx(((1 - p) ** 3 + p ** 3) / (p * (1 - p)) - 1, rel=0.05)
    assert noise["critic"] < noise["group"] < noise["none"]
    assert noise["grpo"] < noise["critic"]  # the std division steadies the magnitude (docstring)
    assert F.estimator_noise(p=0.5, groups=20_000)["none"] == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="0 < p < 1"):
        F.estimator_noise(p=0.0)
