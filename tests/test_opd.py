"""On-policy distillation's numbers on fixed tensors (algorithms/opd.py): the per-token
reverse-KL advantage (k1, k3) and the top-k forward KL worked by hand, then the same numbers
from the peers' definitions, transcribed below from their source:

    Thinking Machines' tinker-cookbook (9dfcc3a, 2026-08-19) distillation/train_on_policy.py
    prime-rl 0.8.0 (559b447, 2026-08-21)  trainer/rl/loss.py::ref_kl_loss_fn
    verl 0.10.0.dev (verl-project/verl 1dda039, 2026-08-22)  trainer/distillation/losses.py and
        fsdp/losses.py::compute_forward_kl_topk, trainer/ppo/core_algos.py::kl_penalty_forward
    TRL 1.10.0.dev0 (f2cd577, 2026-07-24)  experimental/distillation/distillation_trainer.py::_jsd_divergence

and the plumbing that feeds them: the student's log-probs at the teacher's top-k tokens
(models/logprobs.py::response_logp_at) against a loop over positions."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from posttrain.algorithms import make_algorithm
from posttrain.algorithms.core import masked_mean
from posttrain.algorithms.opd import OPD, reverse_kl_per_token, topk_forward_kl
from posttrain.models.logprobs import response_logp_at
from posttrain.types import PolicyOutputs, RolloutBatch

e = math.exp

# Three responses of 3, 2 and 3 tokens after a prompt token (column 0). The per-token log-ratio
# to the teacher, Δ = log π_T − log π_old, is exact in binary:
#   row 0   0.5  −0.25   1.5
#   row 1  −1.0   0.125  (pad)
#   row 2   0.0   2.0   −3.0
OLD = torch.tensor([[0.0, -1.0, -0.5, -2.0], [0.0, -0.25, -1.5, 0.0], [0.0, -0.5, -2.5, -0.125]])
DELTA = torch.tensor([[0.0, 0.5, -0.25, 1.5], [0.0, -1.0, 0.125, 0.0], [0.0, 0.0, 2.0, -3.0]])
TEACHER = OLD + DELTA
MASK = torch.tensor([[0.0, 1, 1, 1], [0, 1, 1, 0], [0, 1, 1, 1]])


def on_response(rows: list[list[float]]) -> torch.Tensor:
    """Per-response-token values back in the (3, 4) layout, 0 off the response."""
    out = torch.zeros(3, 4)
    for i, values in enumerate(rows):
        out[i, 1: 1 + len(values)] = torch.tensor(values)
    return out


def fixed_batch(old=OLD, teacher=TEACHER, mask=MASK, rewards=(1.0, 0.0, 1.0)) -> RolloutBatch:
    B, T = old.shape
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=(mask + (torch.arange(T) == 0)).clamp(max=1),
                        response_mask=mask, old_logp=old * mask, rewards=torch.tensor(rewards),
                        group_ids=torch.zeros(B, dtype=torch.long), teacher_logp=teacher * mask)


def k3(delta: float) -> float:
    """r − log r − 1 with r = π_T / π = e^Δ."""
    return e(delta) - delta - 1


# --- by hand ----------------------------------------------------------------------------------

def test_k1_advantage_is_the_log_ratio_to_the_teacher():
    # A_t = −(log π_old − log π_T) = Δ: a token the teacher likes more than the student did goes up
    adv = OPD(teacher="t", divergence="k1").compute_advantages(fixed_batch())["advantages"]
    torch.testing.assert_close(adv, on_response([[0.5, -0.25, 1.5], [-1.0, 0.125], [0.0, 2.0, -3.0]]),
                               atol=0, rtol=0)


def test_k3_advantage_is_minus_r_minus_log_r_minus_1():
    adv = OPD(teacher="t", divergence="k3").compute_advantages(fixed_batch())["advantages"]
    expected = on_response([[-k3(0.5), -k3(-0.25), -k3(1.5)], [-k3(-1.0), -k3(0.125)], [0.0, -k3(2.0), -k3(-3.0)]])
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=1e-6)
    assert (adv <= 0).all()  # k3 >= 0: every sampled token is pushed down, least where the teacher agrees


def test_the_clamp_bounds_one_runaway_token():
    # Δ = −15 (k1 = 15) and Δ = 3 (k3 = e³ − 4 = 16.09) both stop at kl_clip = 10
    delta = torch.tensor([[0.0, -15.0, 3.0]])
    old, mask = torch.full((1, 3), -1.0), torch.tensor([[0.0, 1.0, 1.0]])
    assert reverse_kl_per_token(old, old + delta, "k1", 10.0).tolist() == [[0.0, 10.0, -3.0]]
    torch.testing.assert_close(reverse_kl_per_token(old, old + delta, "k3", 10.0) * mask,
                               torch.tensor([[0.0, 10.0, 10.0]]))
    assert reverse_kl_per_token(old, old + delta, "k1", 0.0).tolist() == [[0.0, 15.0, -3.0]]  # 0: no clamp


def test_the_task_reward_adds_its_weighted_group_advantage_to_every_token():
    # one group, rewards 1, 0, 1: mean 2/3, std (Bessel) 0.57735; (r − mean)/std = 0.57735, −1.1547, 0.57735
    with_reward = OPD(teacher="t", divergence="k1", reward_weight=0.5).compute_advantages(fixed_batch())["advantages"]
    alone = OPD(teacher="t", divergence="k1").compute_advantages(fixed_batch())["advantages"]
    group = torch.tensor([1 / math.sqrt(3), -2 / math.sqrt(3), 1 / math.sqrt(3)])
    torch.testing.assert_close(with_reward - alone, 0.5 * group[:, None] * MASK, atol=1e-5, rtol=1e-5)


def test_a_teacher_equal_to_the_student_gives_advantages_of_exactly_zero():
    for divergence in ("k1", "k3", "topk"):
        adv = OPD(teacher="t", divergence=divergence).compute_advantages(fixed_batch(teacher=OLD))["advantages"]
        assert adv.abs().max().item() == 0.0, divergence


def test_topk_forward_kl_by_hand():
    # two positions, k = 2. Position 1: teacher log-probs log 0.5, log 0.25 on its top two; the
    # student's at those tokens log 0.25, log 0.25. KL terms 0.5·log 2 + 0.25·0 = 0.34657.
    # Position 2: the student holds more of the top-2 mass than the teacher (0.5, 0.4 against
    # 0.4, 0.3): 0.4·log 0.8 + 0.3·log 0.75 = −0.17556 < 0, clamped to 0.
    teacher = torch.log(torch.tensor([[[0.5, 0.25], [0.4, 0.3]]]))
    student = torch.log(torch.tensor([[[0.25, 0.25], [0.5, 0.4]]]))
    kl = topk_forward_kl(student, teacher, clip=10.0)
    torch.testing.assert_close(kl, torch.tensor([[0.5 * math.log(2), 0.0]]))
    # the floor: a student log-prob of −30 counts as −10 (0.5 · (log 0.5 + 10) + 0.25 · 0)
    floored = topk_forward_kl(torch.tensor([[[-30.0, math.log(0.25)]]]), teacher[:, :1], clip=0.0)
    torch.testing.assert_close(floored, torch.tensor([[0.5 * (math.log(0.5) + 10.0)]]))


def test_topk_loss_reads_the_students_logp_at_the_teachers_tokens_and_pulls_them_up():
    batch = fixed_batch()
    topk_teacher = torch.log(torch.tensor([0.6, 0.3]))[None, None, :].expand(3, 4, 2) * MASK[..., None]
    batch = dataclasses.replace(batch, teacher_topk_logp=topk_teacher,
                                teacher_topk_ids=torch.zeros(3, 4, 2, dtype=torch.long))
    algo = OPD(teacher="t", divergence="topk")
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    student = torch.log(torch.tensor([0.2, 0.2]))[None, None, :].expand(3, 4, 2).clone().requires_grad_(True)
    logp = batch.old_logp.clone().requires_grad_(True)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=torch.zeros(3, 4),
                                                    teacher_topk_logp=student), batch)
    per_token = 0.6 * math.log(3) + 0.3 * math.log(1.5)  # Σ p_T log(p_T / π) on every response token
    assert loss.item() == pytest.approx(per_token, rel=1e-6) and metrics["topk_kl"] == pytest.approx(per_token, rel=1e-6)
    assert metrics["topk_teacher_mass"] == pytest.approx(0.9) and metrics["topk_student_mass"] == pytest.approx(0.4)
    loss.backward()
    # ∂L/∂ log π(v) = −p_T(v) / (response tokens): the student's mass moves to the teacher's tokens
    assert student.grad is not None and logp.grad is not None
    torch.testing.assert_close(student.grad[1, 1], torch.tensor([-0.6, -0.3]) / MASK.sum())
    assert (student.grad[MASK == 0] == 0).all() and logp.grad.abs().max() == 0  # no advantage, no surrogate gradient


def test_without_the_teacher_the_algorithm_says_which_role_fills_it():
    batch = dataclasses.replace(fixed_batch(), teacher_logp=None)
    with pytest.raises(ValueError, match="teacher_logp.*roles/teacher.py"):
        OPD(teacher="t").compute_advantages(batch)


def test_bad_fields_are_refused_by_name():
    with pytest.raises(ValueError, match="divergence='k2'"):
        make_algorithm("opd", divergence="k2")
    with pytest.raises(ValueError, match="topk=0"):
        make_algorithm("opd", topk=0)
    assert make_algorithm("opd").teacher_settings() == {"teacher": "", "topk": 0}
    assert make_algorithm("opd", divergence="topk", teacher="x").teacher_settings() == {"teacher": "x", "topk": 32}
    assert not make_algorithm("opd").needs_groups and make_algorithm("opd", reward_weight=1.0).needs_groups


# --- Thinking Machines (tinker-cookbook, distillation/train_on_policy.py) ------------------------
# reverse_kl = (sampled_logprobs − teacher_logprobs) · mask; advantages += −kl_penalty_coef · mask ·
# reverse_kl (kl_discount_factor 0: no sum over later tokens); logged as teacher_kl, its masked mean.

def tinker_kl_advantages(sampled_logprobs, teacher_logprobs, mask, kl_penalty_coef=1.0):
    reverse_kl = (sampled_logprobs - teacher_logprobs) * mask
    advantages = -kl_penalty_coef * mask * reverse_kl
    return advantages, float(reverse_kl.sum() / mask.sum())


def test_tinker_cookbook_advantages_and_teacher_kl():
    theirs, teacher_kl = tinker_kl_advantages(OLD, TEACHER, MASK)
    ours = OPD(teacher="t", divergence="k1", kl_clip=0.0).compute_advantages(fixed_batch())["advantages"]
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    # our hook's teacher_kl_k1 is their teacher_kl (roles/teacher.py)
    assert masked_mean(OLD - TEACHER, MASK).item() == pytest.approx(teacher_kl)


# --- prime-rl (trainer/rl/loss.py::ref_kl_loss_fn) ----------------------------------------------
# ref_kl = ref_logprobs − trainer_logprobs; pg_loss = keep_mask · ref_kl.detach() · ratio with
# ratio = exp(trainer − inference) and keep_mask dropping tokens whose probability fell by more than
# 0.2; loss = Σ (−pg_loss + 1e-3 · mask · log_ratio²). Scalar advantages are not read.

def prime_rl_ref_kl_loss(trainer_logprobs, inference_logprobs, ref_logprobs, loss_mask):
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    is_masked = (torch.exp(trainer_logprobs) - torch.exp(inference_logprobs)) < -0.2
    keep_mask = loss_mask & ~is_masked
    ref_kl = ref_logprobs - trainer_logprobs
    pg_loss = keep_mask * ref_kl.detach() * importance_ratio
    kl_loss = loss_mask * log_importance_ratio ** 2
    return (-pg_loss + 1e-3 * kl_loss).sum()


def test_prime_rl_gradient_is_ours_on_policy():
    """On policy (the trainer's log-probs are the sampler's) prime-rl's per-token gradient is
    −(log π_T − log π): ours, times the token count (theirs sums, ours is a token mean)."""
    batch = fixed_batch()
    algo = OPD(teacher="t", divergence="k1", kl_clip=0.0)
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    ours_logp = OLD.clone().requires_grad_(True)
    loss, _ = algo.compute_loss(PolicyOutputs(logp=ours_logp, entropy=torch.zeros(3, 4)), batch)
    loss.backward()
    theirs_logp = OLD.clone().requires_grad_(True)
    prime_rl_ref_kl_loss(theirs_logp, OLD, TEACHER, MASK.bool()).backward()
    assert ours_logp.grad is not None and theirs_logp.grad is not None
    torch.testing.assert_close(ours_logp.grad * MASK.sum(), theirs_logp.grad * MASK, atol=1e-6, rtol=1e-6)


# --- verl (trainer/distillation/losses.py, fsdp/losses.py, ppo/core_algos.py) --------------------
# The estimator losses: kl_penalty_forward ("k1": logprob − ref_logprob; "k3": the log-ratio clamped
# to ±20, then ratio − kl − 1 clamped to ±10), clamped again to ±loss_max_clamp (10), and under
# use_policy_gradient the advantage is their negative. forward_kl_topk: log_softmax of the student's
# logits gathered at the teacher's top-k ids, both sides' log-probs floored at log_prob_min_clamp
# (−10), Σ p (log p − log q), clamp_min(0), then the ±10 clamp.

def verl_kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("low_var_kl", "k3"):
        kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
        return torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def verl_pg_advantages(student_log_probs, teacher_log_probs, loss_mode, loss_max_clamp=10.0):
    losses = verl_kl_penalty_forward(student_log_probs, teacher_log_probs, loss_mode)
    return -losses.clamp(min=-loss_max_clamp, max=loss_max_clamp).detach()


def verl_forward_kl_topk(student_logits, teacher_topk_log_probs, teacher_topk_ids, log_prob_min_clamp=-10.0,
                         loss_max_clamp=10.0):
    student_log_probs = F.log_softmax(student_logits, dim=-1)
    student_topk_log_probs = torch.gather(student_log_probs, dim=-1, index=teacher_topk_ids)
    student_topk_log_probs = student_topk_log_probs.clamp_min(log_prob_min_clamp)
    teacher_topk_log_probs = teacher_topk_log_probs.clamp_min(log_prob_min_clamp)
    p = teacher_topk_log_probs.float().exp()
    losses = (p * (teacher_topk_log_probs - student_topk_log_probs)).sum(dim=-1).clamp_min(0.0)
    return losses.clamp(min=-loss_max_clamp, max=loss_max_clamp)


@pytest.mark.parametrize("loss_mode", ["k1", "k3"])
def test_verl_estimator_advantages_are_ours(loss_mode):
    # Δ up to 15 in size, so both of verl's clamps act on some tokens
    old = OLD.clone()
    old[0, 3], old[2, 3] = -16.0, -0.5  # Δ = 1.5 → teacher −14.5; Δ = −3 → teacher −3.5
    teacher = old + DELTA * torch.tensor([1.0, 1.0, 1.0, 10.0])  # the last column's Δ: 15, (pad), −30
    theirs = verl_pg_advantages(old, teacher, loss_mode) * MASK
    ours = OPD(teacher="t", divergence=loss_mode).compute_advantages(fixed_batch(old, teacher))["advantages"]
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    assert theirs.abs().max().item() == 10.0  # a clamp was reached


def test_verl_forward_kl_topk_is_ours_from_the_same_logits():
    """Random student and teacher logits over V = 11 tokens at 3 × 5 positions, the teacher's
    top 4 as vLLM's prompt_logprobs give them (full-vocabulary log-probs, largest first); some
    student logits pushed far down so the −10 floor acts. Our response_logp_at reads the
    student's log-probs through an identity output layer, so its `hidden` are the logits."""
    gen = torch.Generator().manual_seed(0)
    B, T, V, k = 3, 5, 11, 4
    student_logits = 3 * torch.randn(B, T, V, generator=gen)
    student_logits[0, :, :3] -= 30.0
    teacher_logits = 3 * torch.randn(B, T, V, generator=gen)
    teacher = torch.topk(F.log_softmax(teacher_logits, -1), k, dim=-1)  # (B, T, k) values and ids
    # one position where the student is the teacher with the mass outside the top k moved into it:
    # every top-k term p log(p / q) is then below 0, and so is their sum, clamped to 0
    outside = torch.ones(V, dtype=torch.bool)
    outside[teacher.indices[1, 2]] = False
    student_logits[1, 2] = teacher_logits[1, 2] - 30.0 * outside
    theirs = verl_forward_kl_topk(student_logits, teacher.values, teacher.indices)  # (B, T)
    # ours: position t reads hidden[:, t − 1]; every position but 0 is a response position here
    head = torch.nn.Linear(V, V, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(V))
    hidden = torch.cat([student_logits, torch.zeros(B, 1, V)], dim=1)  # (B, T + 1, V): logits at t − 1
    ids = torch.cat([torch.zeros(B, 1, k, dtype=torch.long), teacher.indices], dim=1)  # (B, T + 1, k)
    mask = torch.ones(B, T + 1)
    mask[:, 0] = 0
    student_at_topk = response_logp_at(hidden, head, ids, mask)[:, 1:]  # (B, T, k)
    ours = topk_forward_kl(student_at_topk, teacher.values, clip=10.0)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert (theirs == 0).any() and (theirs > 0).any()  # the clamp at 0 acted somewhere, not everywhere


def test_response_logp_at_matches_a_loop_and_chunks_alike():
    gen = torch.Generator().manual_seed(1)
    B, T, D, V, k = 2, 6, 5, 7, 3
    hidden = torch.randn(B, T, D, generator=gen, requires_grad=True)
    head = torch.nn.Linear(D, V, bias=False)
    ids = torch.randint(0, V, (B, T, k), generator=gen)
    mask = torch.tensor([[0.0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]])
    expected = torch.zeros(B, T, k)
    for b in range(B):
        for t in range(1, T):
            if mask[b, t]:
                expected[b, t] = F.log_softmax(head(hidden[b, t - 1]) / 0.7, -1)[ids[b, t]]
    whole = response_logp_at(hidden, head, ids, mask, temperature=0.7)
    chunked = response_logp_at(hidden, head, ids, mask, temperature=0.7, logits_budget=V)  # one position a chunk
    torch.testing.assert_close(whole, expected.detach())
    torch.testing.assert_close(chunked, whole)
    chunked.sum().backward()  # recomputed in backward under checkpointing, and masked positions get no gradient
    assert hidden.grad is not None and (hidden.grad[0, 4:] == 0).all()


# --- TRL (experimental/distillation/distillation_trainer.py::_jsd_divergence, beta = 1) -------------
# TRL's DistillationTrainer with beta = 1 minimises the full-vocabulary reverse KL
# F.kl_div(teacher_log_probs, student_log_probs, log_target=True) = Σ_v π(v) (log π(v) − log π_T(v)).
# Our k1 and k3 score one sampled token; averaged over what the student samples they are that KL.

def test_the_expected_k1_and_k3_under_the_student_are_trls_reverse_kl():
    gen = torch.Generator().manual_seed(2)
    student = F.log_softmax(torch.randn(4, 9, generator=gen), -1)  # 4 positions, V = 9
    teacher = F.log_softmax(torch.randn(4, 9, generator=gen), -1)
    trl = F.kl_div(teacher, student, reduction="none", log_target=True).sum(-1)  # (4,)
    for estimator in ("k1", "k3"):
        per_token = reverse_kl_per_token(student, teacher, estimator, clip=0.0)  # every token as if sampled
        expected = (student.exp() * per_token).sum(-1)  # E_{y ~ π}[k(y)]
        torch.testing.assert_close(expected, trl, atol=1e-6, rtol=1e-5)
