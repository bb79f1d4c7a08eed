"""The code exercises of Part III (lessons 15-18), in the shape `posttrain check` runs them
(teach/exercises.py builds an `Exercise` from each entry of `PART_III`): the library's own
function adapted to the stub's signature, the cases, and the hint a failure prints.

    15  bt_loss          the Bradley-Terry loss of a reward model, with a margin
    16  dpo_loss         DPO on summed log-probs of both sides and the reference's
    17  pass_at_k        the unbiased pass@k estimator: best-of-k with a perfect verifier
    18  cot_v1_rewards   the honest spec final_int/cot-v1, written from its description

Every case is deterministic and runs in milliseconds; the awkward ones are the point
(rewards 400 apart, where log(sigmoid(x)) underflows to -inf; a problem with every sample
right; the golden exploit pack, which an honest verifier must refuse).
"""

from __future__ import annotations

import torch

from posttrain.algorithms.preference import PreferenceLogps, make_preference_loss
from posttrain.eval.packs import example_of, load_pack
from posttrain.eval.stats import pass_at_k
from posttrain.rewards.reward_model import bt_loss
from posttrain.verifiers.final_int import get_spec


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------
# 15 · the Bradley-Terry loss
# --------------------------------------------------------------------------------------


def _ref_bt(r_chosen, r_rejected, margin):
    return bt_loss(r_chosen, r_rejected, margin)


def _bt_cases():
    g = _gen(15)
    rc, rr = torch.randn(6, generator=g), torch.randn(6, generator=g)
    far = torch.tensor([200.0, -200.0, 0.0, 50.0])
    return [
        ("six pairs, no margin", (rc, rr, torch.zeros(6))),
        ("a margin per pair (Llama 2's rating gap)", (rc, rr, torch.rand(6, generator=g) * 2)),
        ("rewards 400 apart (σ underflows to 0 in float32)", (far, -far, torch.zeros(4))),
        ("every pair tied (the loss is exactly log 2)", (torch.ones(3), torch.ones(3), torch.zeros(3))),
    ]


# --------------------------------------------------------------------------------------
# 16 · the DPO loss
# --------------------------------------------------------------------------------------


def _ref_dpo(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    ones = torch.ones_like(policy_chosen)  # DPO sums over tokens: the lengths are never read
    logps = PreferenceLogps(policy_chosen, policy_rejected, ones, ones, ref_chosen, ref_rejected)
    return make_preference_loss("dpo", beta=beta).loss(logps)[0]


def _dpo_cases():
    g = _gen(16)
    side = lambda: -torch.rand(5, generator=g) * 20  # (B,) summed log-probs of whole answers: ≤ 0
    pc, pr, rc, rr = side(), side(), side(), side()
    return [
        ("five pairs, β = 0.1", (pc, pr, rc, rr, 0.1)),
        ("the same pairs, β = 1", (pc, pr, rc, rr, 1.0)),
        ("the policy is the reference (the loss is exactly log 2)", (rc, rr, rc, rr, 0.1)),
        ("log-ratios thousands of nats apart (σ underflows)",
         (torch.tensor([-1.0, -9000.0]), torch.tensor([-9000.0, -1.0]), torch.tensor([-5.0, -5.0]),
          torch.tensor([-5.0, -5.0]), 0.1)),
    ]


# --------------------------------------------------------------------------------------
# 17 · pass@k
# --------------------------------------------------------------------------------------


def _ref_pass_at_k(n, correct, k):
    return torch.tensor([pass_at_k(n, int(c), k) for c in correct], dtype=torch.float64)


def _pass_cases():
    eight = torch.arange(9)  # 0..8 right answers out of 8 samples
    return [
        ("n = 8, k = 1 (the mean of c / n)", (8, eight, 1)),
        ("n = 8, k = 4", (8, eight, 4)),
        ("n = 8, k = 8 (any right answer at all)", (8, eight, 8)),
        ("n = 200, k = 10 (binomials near 10^16)", (200, torch.tensor([0, 1, 5, 50, 190, 199, 200]), 10)),
    ]


# --------------------------------------------------------------------------------------
# 18 · the honest spec, final_int/cot-v1
# --------------------------------------------------------------------------------------

COT_V1 = get_spec("final_int/cot-v1")


def _ref_cot_v1(expected_answers, completions):
    return torch.tensor([COT_V1({"prompt": "", "expected_answer": e}, c)["reward"]
                         for e, c in zip(expected_answers, completions)])


def _pack_case(name: str) -> tuple[list[str], list[str]]:
    records = load_pack(name)
    return [example_of(r).expected_answer for r in records], [r["completion"] for r in records]


def _cot_cases():
    near_misses = [  # (expected, completion), each one character or one rule away from right
        ("5", "Final: 5"), ("5", "  2+3=5\nFinal: 5 \n"), ("5", "Final:  5"), ("5", "final: 5"),
        ("5", "Final: 05"), ("0", "Final: -0"), ("-3", "Final: -3"), ("5", "Final: +5"), ("5", "Final: 5."),
        ("5", "Final: 5\nFinal: 5"), ("5", "Final: 5\nso 5"), ("5", "Final: \u0665"), ("5", "Final:\n5"),
        ("5", ""), ("12", "Final: 1,2"), ("5", "2+3=5\r\nFinal: 5"),
    ]
    return [
        ("the golden correct set (every one must pass)", _pack_case("golden")),
        ("the golden exploit pack (every one must fail)", _pack_case("exploits")),
        ("the frozen rollouts (right, wrong and badly formatted)", _pack_case("frozen")),
        ("near misses: spacing, case, zeros, signs, two Final lines, a non-ASCII digit",
         ([e for e, _ in near_misses], [c for _, c in near_misses])),
    ]


# The Exercise fields of each (see teach/exercises.py::Exercise)
PART_III: dict[str, dict] = {
    "15": dict(function="bt_loss", lesson="15", reference=_ref_bt, cases=_bt_cases, grad_of_first=True,
               hint="loss = mean over pairs of −log σ(r_c − r_r − m). Use torch.nn.functional.logsigmoid: "
                    "log(torch.sigmoid(x)) is −inf once σ(x) underflows (x below about −100 in float32)."),
    "16": dict(function="dpo_loss", lesson="16", reference=_ref_dpo, cases=_dpo_cases, grad_of_first=True,
               hint="Δ = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r)); loss = mean of "
                    "−logsigmoid(β·Δ) over the pairs. logsigmoid, not log(sigmoid): see case 4."),
    "17": dict(function="pass_at_k", lesson="17", reference=_ref_pass_at_k, cases=_pass_cases,
               hint="pass@k = 1 − C(n − c, k) / C(n, k): the chance that k of the n samples, drawn without "
                    "replacement, include a right one; 1 when n − c < k. Not c / n, and not 1 − (1 − c/n)^k "
                    "(that draws with replacement). math.comb is exact; or the product form in eval/stats.py."),
    "18": dict(function="cot_v1_rewards", lesson="18", reference=_ref_cot_v1, cases=_cot_cases,
               hint="Strip ASCII whitespace. Exactly one line may start with 'Final:' and it must be the last; "
                    "it reads 'Final: ' then an integer: ASCII digits, an optional '-', no '+', no leading zero, "
                    "not '-0', nothing after it. Reward 1.0 iff that integer string equals the expected answer."),
}
