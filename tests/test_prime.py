"""PRIME: the implicit PRM's rewards and loss worked by hand, the advantages on a two-group
toy batch worked by hand and against a plain loop of the paper's formula, one whole step on
a tiny gpt_mini, and a resumed run that steps exactly as an uninterrupted one."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math

import pytest
import torch

from posttrain.algorithms import make_algorithm
from posttrain.algorithms.prime import PRIME, leave_one_out_process_returns, prime_advantages
from posttrain.config import ConfigError, DistConfig
from posttrain.envs import make_env
from posttrain.models import save_checkpoint_model
from posttrain.pipelines.build import build_controller
from posttrain.pipelines.checks import check_config
from posttrain.algorithms.core import masked_mean
from posttrain.models.logprobs import response_logp
from posttrain.rewards.implicit_prm import (
    ImplicitPRM,
    implicit_outcome_logits,
    implicit_prm_loss,
    implicit_process_rewards,
    outcome_labels,
)
from posttrain.roles.hooks import ProcessRewards
from posttrain.types import PolicyOutputs, RolloutBatch
from tests.test_devices import tiny_config, tiny_policy

NAN = float("nan")

# Two groups of two rows, T = 4, the prompt at position 0. Responses of 2, 3, 1 and 2 tokens.
MASK = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]], dtype=torch.float)
GROUPS = torch.tensor([0, 0, 1, 1])
OUTCOME = torch.tensor([1.0, 0.0, 1.0, 1.0])  # group 0 mixed, group 1 all right
# per-token process rewards r_t (already × β); NaN where the mask is 0: it must never leak
PROCESS = torch.tensor([[NAN, 0.2, 0.4, NAN], [NAN, -0.1, 0.1, -0.3], [NAN, 0.6, NAN, NAN], [NAN, 0.0, 0.2, NAN]])


def toy_batch(process=PROCESS) -> RolloutBatch:
    B, T = MASK.shape
    return RolloutBatch(tokens=torch.zeros(B, T, dtype=torch.long), attention_mask=torch.ones(B, T),
                        response_mask=MASK, old_logp=-MASK, rewards=OUTCOME, group_ids=GROUPS,
                        ref_logp=-MASK, process_rewards=process)


# ---- the implicit PRM's rewards and loss, by hand ------------------------------------------


def test_implicit_process_rewards_by_hand():
    prm_logp = torch.tensor([[0.0, -0.5, -1.0], [0.0, -2.0, float("-inf")]])
    ref_logp = torch.tensor([[0.0, -1.5, -0.5], [0.0, -1.0, -3.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    r = implicit_process_rewards(prm_logp, ref_logp, mask, beta=0.5)
    # β (log π_φ − log π_ref): 0.5·(−0.5 + 1.5) = 0.5, 0.5·(−1 + 0.5) = −0.25; 0.5·(−2 + 1) = −0.5; padding 0 (not −inf)
    torch.testing.assert_close(r, torch.tensor([[0.0, 0.5, -0.25], [0.0, -0.5, 0.0]]))
    torch.testing.assert_close(implicit_outcome_logits(prm_logp, ref_logp, mask, 0.5), torch.tensor([0.25, -0.5]))


def test_implicit_prm_loss_by_hand():
    # row 0: Σ log-ratio = 2, β = 0.5 → z = 1, label 1: −log σ(1) = 0.3132617
    # row 1: Σ log-ratio = −1 → z = −0.5, label 0: −log(1 − σ(−0.5)) = −log σ(0.5) = 0.4740770
    prm_logp = torch.tensor([[0.0, 1.5, 0.5], [0.0, -1.0, 0.0]], requires_grad=True)
    ref_logp = torch.zeros(2, 3)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    loss = implicit_prm_loss(prm_logp, ref_logp, mask, torch.tensor([1.0, 0.0]), beta=0.5)
    assert loss.item() == pytest.approx((0.3132617 + 0.4740770) / 2, abs=1e-6)
    loss.backward()
    # d loss / d logp_t = β (σ(z) − l) / B on response tokens: 0.5·(0.7310586 − 1)/2, 0.5·(0.3775407 − 0)/2
    torch.testing.assert_close(prm_logp.grad, torch.tensor([[0.0, -0.0672354, -0.0672354],
                                                            [0.0, 0.0943852, 0.0943852]]), atol=1e-6, rtol=0)
    # a confident PRM still gives a finite loss (computed from the logit, not from σ)
    far = implicit_prm_loss(torch.tensor([[0.0, 4000.0]]), torch.zeros(1, 2), torch.tensor([[0.0, 1.0]]),
                            torch.tensor([0.0]), beta=0.05)
    assert far.item() == pytest.approx(200.0)


def test_outcome_labels_refuse_rewards_outside_zero_one():
    assert torch.equal(outcome_labels(torch.tensor([0.0, 1.0, 0.5])), torch.tensor([0.0, 1.0, 0.5]))
    with pytest.raises(ValueError, match=r"outcome labels in \[0, 1\].*1\.2.*--rl.reward.terms accuracy"):
        outcome_labels(torch.tensor([1.2, 0.0]))
    with pytest.raises(ValueError, match="nan"):
        outcome_labels(torch.tensor([NAN]))


# ---- advantages: by hand, against a loop, invariances --------------------------------------


def test_process_returns_by_hand_on_a_two_group_batch():
    # mean token reward per row: 0.3, −0.1, 0.6, 0.1; K = 2, so b_i is the sibling's: −0.1, 0.3, 0.1, 0.6
    # row 0: r − b = [0.3, 0.5] → returns [0.8, 0.5]
    # row 1: [−0.4, −0.2, −0.6] → [−1.2, −0.8, −0.6]
    # row 2: [0.5] → [0.5];  row 3: [−0.6, −0.4] → [−1.0, −0.4]
    returns = leave_one_out_process_returns(PROCESS, MASK, GROUPS)
    expected = torch.tensor([[0, 0.8, 0.5, 0], [0, -1.2, -0.8, -0.6], [0, 0.5, 0, 0], [0, -1.0, -0.4, 0]])
    torch.testing.assert_close(returns, expected)


def test_advantages_by_hand_outcome_plus_process():
    # outcome RLOO (K = 2: the sibling is the baseline): 1 − 0 = 1, 0 − 1 = −1, 1 − 1 = 0, 0
    # A = 1.0 · outcome + 0.5 · process returns (above)
    adv = prime_advantages(OUTCOME, PROCESS, MASK, GROUPS, outcome_coef=1.0, process_coef=0.5)
    expected = torch.tensor([[0, 1.4, 1.25, 0], [0, -1.6, -1.4, -1.3], [0, 0.25, 0, 0], [0, -0.5, -0.2, 0]])
    torch.testing.assert_close(adv, expected)
    # and PRIME's own compute_advantages: the same, without whitening
    algo = PRIME(process_coef=0.5, whiten_advantages=False)
    torch.testing.assert_close(algo.compute_advantages(toy_batch())["advantages"], expected)


def test_whitened_advantages_are_the_raw_ones_shifted_and_scaled():
    raw = prime_advantages(OUTCOME, PROCESS, MASK, GROUPS, 1.0, 1.0)
    adv = PRIME().compute_advantages(toy_batch())["advantages"]
    on = MASK > 0
    assert adv[on].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv[on].std().item() == pytest.approx(1.0, abs=1e-5)
    expected = (raw[on] - raw[on].mean()) / raw[on].std()
    torch.testing.assert_close(adv[on], expected, atol=1e-5, rtol=0)
    assert (adv[~on] == 0).all()


def loop_advantages(rewards, process, mask, groups, outcome_coef, process_coef):
    """The paper's formula read literally, one row and one token at a time."""
    B, T = mask.shape
    adv = torch.zeros(B, T)
    for i in range(B):
        others = [j for j in range(B) if groups[j] == groups[i] and j != i]
        if not others:
            continue
        tokens = [t for t in range(T) if mask[i, t]]

        def mean_token_reward(j):
            steps = [t for t in range(T) if mask[j, t]]
            return sum(process[j, t].item() for t in steps) / max(1, len(steps))

        outcome = rewards[i].item() - sum(rewards[j].item() for j in others) / len(others)
        baseline = sum(mean_token_reward(j) for j in others) / len(others)
        for t in tokens:
            future = sum(process[i, s].item() - baseline for s in tokens if s >= t)
            adv[i, t] = outcome_coef * outcome + process_coef * future
    return adv


def test_vectorised_advantages_match_a_loop_on_random_batches():
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        B, T = 9, 7
        mask = (torch.rand(B, T, generator=gen) > 0.3).float()
        mask[:, 0] = 0  # a prompt token; gaps inside a response (tool output) are allowed
        groups = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3])  # group 2 has one sample: advantage 0
        rewards = (torch.rand(B, generator=gen) > 0.5).float()
        process = torch.randn(B, T, generator=gen) * 0.1
        got = prime_advantages(rewards, process, mask, groups, 1.0, 0.7)
        torch.testing.assert_close(got, loop_advantages(rewards, process, mask, groups, 1.0, 0.7), atol=1e-5, rtol=0)
        assert (got[5] == 0).all()


def test_masked_values_never_leak_and_a_shift_of_a_groups_process_rewards_cancels():
    # NaN in padding (toy PROCESS) leaves every advantage finite
    assert torch.isfinite(PRIME().compute_advantages(toy_batch())["advantages"]).all()
    # equal-length rows: adding c to every token reward of a group adds c to each b_i too, so returns stay
    mask = torch.tensor([[0, 1, 1], [0, 1, 1]], dtype=torch.float)
    process = torch.tensor([[0, 0.3, -0.1], [0, 0.2, 0.5]])
    groups = torch.tensor([0, 0])
    torch.testing.assert_close(leave_one_out_process_returns(process + 0.7, mask, groups),
                               leave_one_out_process_returns(process, mask, groups))


def test_prime_refuses_a_batch_without_process_rewards_and_bad_fields():
    with pytest.raises(ValueError, match="batch.process_rewards.*implicit PRM"):
        PRIME().compute_advantages(toy_batch(process=None))
    with pytest.raises(ValueError, match="beta"):
        make_algorithm("prime", beta=0.0)
    with pytest.raises(ValueError, match="prm_update"):
        make_algorithm("prime", prm_update="during")
    assert PRIME().uses_reference and PRIME().implicit_prm_settings() == {"beta": 0.05, "lr": 2e-4, "update": "before"}
    assert make_algorithm("grpo").implicit_prm_settings() is None
    # process_coef 0 (the ablation) builds no PRM and needs no process rewards: RLOO, whitened, under the clip
    ablation = make_algorithm("prime", process_coef=0.0, whiten_advantages=False)
    assert ablation.implicit_prm_settings() is None
    torch.testing.assert_close(ablation.compute_advantages(toy_batch(process=None))["advantages"],
                               torch.tensor([[0, 1, 1, 0], [0, -1, -1, -1], [0, 0, 0, 0], [0, 0, 0, 0]]).float())


def test_the_loss_is_the_clipped_surrogate_on_the_advantages():
    batch = toy_batch()
    batch = dataclasses.replace(batch, **PRIME(whiten_advantages=False).compute_advantages(batch))
    # ratio e^0.5 on every token of row 0 (A > 0): clipped at 1.2; row 1 (A < 0) at ratio 1
    logp = batch.old_logp + torch.tensor([[0, 0.5, 0.5, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    loss, metrics = PRIME(whiten_advantages=False).compute_loss(
        PolicyOutputs(logp=logp, entropy=torch.zeros(4, 4)), batch)
    # token-mean over the 8 response tokens of −min(ρA, clip(ρ)A)
    adv = batch.advantages
    expected = -(1.2 * (adv[0, 1] + adv[0, 2]) + adv[1, 1:].sum() + adv[2, 1] + adv[3, 1:3].sum()) / 8
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert metrics["clipfrac"] == pytest.approx(2 / 8)


# ---- the online PRM and one whole step on gpt_mini ------------------------------------------


def prime_controller(tmp_path, **rl_changes):
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, algo="prime", **rl_changes)
    policy, tokenizer = tiny_policy()
    save_checkpoint_model(policy, tokenizer, tmp_path / "start")
    controller = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, tmp_path / "start")
    # an untrained policy never scores, and all-zero rewards give no gradient: reward odd lengths instead
    controller.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    return controller, policy


def implicit_prm(controller) -> ImplicitPRM:
    """The controller's implicit PRM: the object its ProcessRewards step hook steps."""
    return next(hook.prm for hook in controller.hooks if isinstance(hook, ProcessRewards))


def test_the_prm_starts_at_zero_reward_and_learns_the_labels(tmp_path):
    controller, policy = prime_controller(tmp_path)
    episodes = controller.rollout.sample(0, 0)
    for e in episodes:
        e.reward = float(len(e.completion) % 2)
    batch = controller.collate(episodes)
    batch.ref_logp = controller.reference.logp(batch)
    assert 0 < batch.rewards.mean() < 1
    prm = ImplicitPRM(policy, beta=0.5, lr=5e-3, update="after")
    rewards, metrics = prm(batch)
    assert torch.equal(rewards, torch.zeros_like(rewards))  # π_φ = π_ref before its first update: r_t = 0 exactly
    assert metrics["prm/loss"] == pytest.approx(math.log(2), abs=1e-6)  # σ(0) = ½ against every label
    for _ in range(12):
        rewards, metrics = prm(batch)
    assert metrics["prm/loss"] < 0.2 and metrics["prm/accuracy"] == 1.0
    score = rewards.sum(dim=1)  # Σ_t r_t, the outcome logit: positive on the rows labelled 1
    assert ((score > 0) == (batch.rewards > 0.5)).all()
    assert not any(torch.equal(a, b) for a, b in zip(prm.model.parameters(), policy.parameters())
                   if a.requires_grad and a.numel() > 1)


def test_one_prime_step_end_to_end(tmp_path):
    controller, policy = prime_controller(tmp_path)
    prm_before = [p.detach().clone() for p in implicit_prm(controller).model.parameters()]
    policy_before = [p.detach().clone() for p in policy.parameters()]
    metrics, episodes = controller.step(0)
    assert len(episodes) == 8 and 0 < metrics["reward_mean"] < 1
    for key in ("pg_loss", "grad_norm", "prm/loss", "prm/accuracy", "prm/process_reward_mean", "kl_ref"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["prm/loss"] == pytest.approx(math.log(2), abs=1e-5)  # its first update starts from π_ref
    assert metrics["prm/process_reward_mean"] != 0  # "before": scored after that update
    assert metrics["time/process_reward"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(prm_before, implicit_prm(controller).model.parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(policy_before, policy.parameters()))


def test_a_resumed_prime_run_steps_exactly_as_an_uninterrupted_one(tmp_path):
    controller, policy = prime_controller(tmp_path / "a")
    controller.step(0)
    saved = copy.deepcopy({"policy": policy.state_dict(), "trainer": controller.trainer.state_dict(),
                           "controller": controller.state_dict()})
    expected, _ = controller.step(1)

    resumed, resumed_policy = prime_controller(tmp_path / "b")  # fresh roles, as a new process builds them
    resumed_policy.load_state_dict(saved["policy"])
    resumed.trainer.load_state_dict(saved["trainer"])
    resumed.load_state_dict(saved["controller"])
    got, _ = resumed.step(1)
    timing = [k for k in expected if k.startswith("time/")]
    assert {k: v for k, v in got.items() if k not in timing} == {k: v for k, v in expected.items() if k not in timing}

    # without the PRM's state the step differs: the test can fail
    fresh, fresh_policy = prime_controller(tmp_path / "c")
    fresh_policy.load_state_dict(saved["policy"])
    fresh.trainer.load_state_dict(saved["trainer"])
    state = dict(saved["controller"])
    state["process_reward"] = implicit_prm(fresh).state_dict()  # the PRM as it was built, not as it was saved
    fresh.load_state_dict(state)
    differs, _ = fresh.step(1)
    assert differs["prm/loss"] != expected["prm/loss"]


# ---- the PRM trains through the one Trainer: today's numbers, today's checkpoints ---------


class PlainAdamWPRM:
    """ImplicitPRM as it was before it trained through the Trainer, its own AdamW step line
    for line: the reference the Trainer has to reproduce, and the writer of today's checkpoints."""

    def __init__(self, policy, beta, lr, update="before", grad_clip=1.0, micro_batch_size=0, share_prompt=True):
        self.model = copy.deepcopy(policy).train()
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(parameters, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.beta, self.update, self.grad_clip = beta, update, grad_clip
        self.micro_batch_size, self.share_prompt = micro_batch_size, share_prompt

    def logp(self, batch):
        return response_logp(self.model, batch, self.share_prompt)

    def micro_batches(self, batch):
        rows = torch.arange(batch.batch_size, device=batch.tokens.device)
        return list(rows.split(self.micro_batch_size or batch.batch_size))

    def __call__(self, batch):
        labels = outcome_labels(batch.rewards)
        mask = batch.response_mask
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        logp_before = torch.zeros_like(batch.old_logp)
        loss_sum = 0.0
        for rows in self.micro_batches(batch):
            micro = batch.select(rows)
            prm_logp = self.logp(micro)
            loss = implicit_prm_loss(prm_logp, micro.ref_logp, micro.response_mask, labels[rows], self.beta)
            share = len(rows) / batch.batch_size
            (loss * share).backward()
            loss_sum += loss.item() * share
            logp_before[rows] = prm_logp.detach()
        parameters = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, self.grad_clip if self.grad_clip > 0 else float("inf"))
        self.optimizer.step()
        logits_before = implicit_outcome_logits(logp_before, batch.ref_logp, mask, self.beta)
        accuracy = ((logits_before > 0) == (labels > 0.5)).float().mean().item()
        if self.update == "before":
            with torch.no_grad():
                self.model.eval()
                prm_logp = torch.cat([self.logp(batch.select(rows)) for rows in self.micro_batches(batch)])
        else:
            prm_logp = logp_before
        process_rewards = implicit_process_rewards(prm_logp, batch.ref_logp, mask, self.beta)
        return process_rewards, {
            "prm/loss": loss_sum, "prm/accuracy": accuracy, "prm/grad_norm": grad_norm.item(),
            "prm/process_reward_mean": masked_mean(process_rewards, mask).item(),
            "prm/outcome_score_mean": process_rewards.sum(dim=1).mean().item(),
        }

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}


@pytest.fixture(scope="module")
def scored_batch(tmp_path_factory):
    """A rollout batch of the tiny policy with 0/1 rewards and the reference's log-probs."""
    controller, policy = prime_controller(tmp_path_factory.mktemp("prm"))
    episodes = controller.rollout.sample(0, 0)
    for e in episodes:
        e.reward = float(len(e.completion) % 2)
    batch = controller.collate(episodes)
    batch.ref_logp = controller.reference.logp(batch)
    return policy, batch


def assert_same_steps(prm, reference, batch, steps) -> list[dict]:
    """Step both `steps` times on the batch: the same rewards, metrics and weights, exactly."""
    history = []
    for _ in range(steps):
        (rewards, metrics), (expected_rewards, expected) = prm(batch), reference(batch)
        assert torch.equal(rewards, expected_rewards) and metrics == expected
        history.append(metrics)
    for a, b in zip(prm.model.parameters(), reference.model.parameters()):
        assert torch.equal(a, b)
    return history


@pytest.mark.parametrize("update", ["before", "after"])
@pytest.mark.parametrize("micro_batch_size", [0, 3])
def test_the_trainer_steps_the_prm_bit_for_bit_as_its_own_adamw_did(scored_batch, update, micro_batch_size):
    policy, batch = scored_batch
    settings = dict(beta=0.5, lr=5e-3, update=update, grad_clip=0.1, micro_batch_size=micro_batch_size)
    prm, reference = ImplicitPRM(policy, **settings), PlainAdamWPRM(policy, **settings)
    history = assert_same_steps(prm, reference, batch, 2)
    assert history[0]["prm/grad_norm"] > 0.1  # clipping is in play


def test_a_checkpoint_written_before_the_trainer_resumes_exactly(scored_batch):
    policy, batch = scored_batch
    settings = dict(beta=0.5, lr=5e-3, grad_clip=0.1, micro_batch_size=3)
    reference = PlainAdamWPRM(policy, **settings)
    reference(batch)
    reference(batch)
    saved = torch.load(io_of(reference.state_dict()), weights_only=True)  # as a checkpoint file holds it
    prm = ImplicitPRM(policy, **settings)
    assert set(prm.state_dict()) == set(saved) == {"model", "optimizer"}  # the same keys as ever
    prm.load_state_dict(saved)
    assert_same_steps(prm, reference, batch, 2)


def io_of(state: dict):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_config_refuses_what_the_prm_cannot_run_with():
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, algo="prime")
    check_config(cfg)
    with pytest.raises(ConfigError, match="dist.topology.*'colocated'.*prime"):
        check_config(dataclasses.replace(cfg, dist=DistConfig(workers=2, topology="sync")))
    with pytest.raises(ConfigError, match="rl.reward.terms='r1'.*outcome label in \\[0, 1\\]"):
        check_config(dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, reward=dataclasses.replace(cfg.rl.reward, terms="r1"))))


# slow: the CLI path; one PRIME step end to end and its exact resume run in make test
@pytest.mark.slow
def test_posttrain_train_algo_prime_from_the_command_line(tmp_path):
    from tests.test_pipeline import TINY, only_run_dir, posttrain

    proc = posttrain("train", *TINY, "--algo", "prime", "--prime.beta", "0.1", "--rl.steps", "3",
                     "--out_dir", str(tmp_path))
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    run = only_run_dir(tmp_path)
    assert json.loads((run / "config.json").read_text())["rl"]["algo_params"] == {"beta": 0.1}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [r for r in rows if r["stage"] == "rl"]
    assert [r["step"] for r in rl_rows] == [0, 1, 2]
    for r in rl_rows:  # logged every step
        assert 0 <= r["prm/accuracy"] <= 1 and math.isfinite(r["prm/process_reward_mean"])
    assert "implicit PRM accuracy" in (run / "summary.md").read_text()
    # the PRM's state is in the checkpoint (checkpoint_every 2)
    latest = run / "checkpoints" / "rl" / (run / "checkpoints" / "rl" / "latest").read_text().strip()
    state = torch.load(latest / "trainer_state.pt", weights_only=False)
    assert set(state["process_reward"]) == {"model", "optimizer"}
