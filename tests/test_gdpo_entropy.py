"""GDPO (rl.reward.normalize per_term) and entropy control (rl.entropy) as a run uses them: the
settings refused where they cannot act, the reward terms carried on the batch, the adaptive
coefficient's hook and its checkpoint, and short runs that log what each control did. The
numbers against verl's and TRL's definitions are in test_gdpo_entropy_oracle.py."""

import json

import pytest
import torch

from posttrain.algorithms.entropy_control import AdaptiveEntropyController, TokenSelection
from posttrain.algorithms.grpo import GRPO, group_advantages, per_term_advantages, sequence_advantages
from posttrain.cli import main
from posttrain.config import ConfigError, EntropyConfig, RewardConfig, RLConfig, TrainConfig
from posttrain.pipelines.checks import check_config
from posttrain.rewards.length import KimiLength
from posttrain.rewards.stack import Accuracy, Format, RewardStack, Schedule
from posttrain.roles.hooks import AdaptiveEntropy, RewardTermTable
from posttrain.types import Episode, Example, RolloutBatch
from tests.test_pipeline import TINY


def refused(setting: str, *expected: str, **rl) -> None:
    with pytest.raises(ConfigError) as error:
        check_config(TrainConfig(rl=RLConfig(**rl)))
    message = str(error.value)
    assert setting in message and all(text in message for text in expected), message


# --- the settings, refused where they cannot act ---------------------------------------------------


def test_per_term_normalisation_needs_several_terms():
    refused("rl.reward.normalize", "has one term", "--rl.reward.terms r1", reward=RewardConfig(normalize="per_term"))


@pytest.mark.parametrize("algo, params, reason", [
    ("rloo", {}, "group-relative advantage normalised term by term"),
    ("dr_grpo", {}, "centring alone is linear"),  # adv_norm "none"
    ("grpo", {"adv_norm": "no-baseline"}, "'group-mean-pooled-std'"),
    ("dapo", {}, "overlong_cache 0"),  # its length penalty is added to the summed reward
    ("dpo", {}, "'sum' with rl.algo='dpo'"),
])
def test_per_term_normalisation_needs_a_group_algorithm_that_scales_each_term(algo, params, reason):
    refused("rl.reward.normalize", reason, algo=algo, algo_params=params,
            reward=RewardConfig(terms="r1", normalize="per_term"))


@pytest.mark.parametrize("algo, params", [("grpo", {}), ("lite_ppo", {}), ("cispo", {}), ("gspo", {}),
                                          ("dapo", {"overlong_cache": 0}), ("dr_grpo", {"adv_norm": "group"}),
                                          ("sapo", {}), ("gmpo", {}), ("dppo_tv", {}), ("dppo_kl", {})])
def test_per_term_normalisation_is_accepted_by_the_grpo_family(algo, params):
    check_config(TrainConfig(rl=RLConfig(algo=algo, algo_params=params,
                                         reward=RewardConfig(terms="r1", normalize="per_term"))))


@pytest.mark.parametrize("entropy, setting", [(EntropyConfig(cov="clip_cov"), "rl.entropy.cov"),
                                              (EntropyConfig(top_quantile=0.2), "rl.entropy.top_quantile")])
@pytest.mark.parametrize("algo", ["cispo", "rloo", "ppo", "kto"])
def test_token_selection_is_refused_outside_the_clipped_surrogate(entropy, setting, algo):
    refused(setting, f"rl.algo={algo!r}", "grpo and its family", algo=algo, entropy=entropy)


def test_the_adaptive_coefficient_is_refused_for_a_preference_loss_and_bad_values_by_name():
    refused("rl.entropy.target", "preference loss", algo="dpo", entropy=EntropyConfig(target=0.5))
    refused("rl.entropy.top_quantile", "[0, 1]", entropy=EntropyConfig(top_quantile=1.5))
    refused("rl.entropy.cov", "'clip_cov'", entropy=EntropyConfig(cov="clipcov"))
    refused("rl.entropy.clip_cov_high", "above rl.entropy.clip_cov_low=1.0", entropy=EntropyConfig(clip_cov_high=0.5))
    refused("rl.reward.normalize", "'per_term'", reward=RewardConfig(normalize="per-term"))
    check_config(TrainConfig(rl=RLConfig(algo="rloo", entropy=EntropyConfig(target=0.5))))  # any RL algorithm's bonus


# --- the reward terms on the batch ------------------------------------------------------------------


def scored_episodes(stack: RewardStack, step: int) -> list[Episode]:
    """Four scored samples of one prompt: right and formatted, wrong and formatted, wrong twice."""
    example = Example("Q: 2+3\n", "5")
    episodes = []
    for i, (completion, right) in enumerate([("Final: 5", True), ("Final: 4", False), ("4", False), ("?", False)]):
        scored = {"reward": float(right), "details": {"format_ok": completion.startswith("Final:"),
                                                     "reason": "ok" if right else "wrong"}}
        result = stack(example, completion, scored)
        episodes.append(Episode(example=example, prompt_ids=[1], response_ids=[2] * (i + 1), response_logp=[0.0] * (i + 1),
                                completion=completion, reward=result["reward"], details=result["details"], group_id=0))
    if stack.needs_groups:  # as the controller's GroupTerms hook does
        stack.score_groups(episodes, step)
    return episodes


def test_the_term_table_is_each_terms_raw_value_and_its_weight_at_the_step():
    stack = RewardStack([(1.0, Accuracy()), (Schedule(0.4, 0.0, 10), Format())], group_terms=[(0.5, KimiLength())])
    episodes = scored_episodes(stack, step=5)
    names, values, weights = stack.term_table(episodes, 5)
    assert names == ["accuracy", "format", "length_kimi"] and weights == [1.0, 0.2, 0.5]  # 0.4 → 0 over 10 steps
    assert [row[:2] for row in values] == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    for row, episode in zip(values, episodes):
        assert sum(w * v for w, v in zip(weights, row)) == pytest.approx(episode.reward)


def test_the_hook_puts_the_terms_on_the_batch_and_logs_where_each_is_flat():
    stack = RewardStack([(1.0, Accuracy()), (0.2, Format())])
    episodes = scored_episodes(stack, step=0)
    hook = RewardTermTable(stack.term_table)
    hook.scored(0, episodes)
    batch = RolloutBatch.collate(episodes, pad_id=0)
    metrics = hook.before_advantages(batch)
    assert batch.reward_terms is not None and batch.reward_term_weights is not None
    assert batch.reward_terms.tolist() == [[1.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert batch.reward_term_weights.flatten().tolist() == pytest.approx([1.0, 0.2] * 4)  # float32
    assert metrics == {"reward_flat_groups/accuracy": 0.0, "reward_flat_groups/format": 0.0}
    # the (B, K) columns are terms, not token positions: cutting trailing padding leaves them whole
    short = batch.select([0]).without_trailing_padding()
    assert short.tokens.shape[1] == 2 and short.reward_terms is not None and short.reward_terms.shape == (1, 2)


def test_terms_that_do_not_sum_to_the_reward_are_refused_rather_than_silently_dropped():
    stack = RewardStack([(1.0, Accuracy()), (0.2, Format())])
    episodes = scored_episodes(stack, step=0)
    hook = RewardTermTable(stack.term_table)
    batch = RolloutBatch.collate(episodes, pad_id=0)
    hook.before_advantages(batch)
    assert sequence_advantages(batch, "group", 1e-6).shape == (4,)
    shaped = RolloutBatch(**{**batch.__dict__, "rewards": batch.rewards - torch.tensor([0.0, 0.0, 0.0, 0.5])})
    with pytest.raises(ValueError, match="row 3: its reward terms sum to 0 .* its reward is -0.5"):
        sequence_advantages(shaped, "group", 1e-6)


def test_gdpo_keeps_apart_what_the_summed_reward_collapses_worked_by_hand():
    # two prompts, two samples each, two 0/1 terms of weight 1: (0,0) vs (1,0), and (0,0) vs (1,1)
    terms = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    groups = torch.tensor([0, 0, 1, 1])
    # GRPO on the sums [0, 1] and [0, 2]: both groups give ±0.5 / 0.7071 and ±1 / 1.4142 = ±1/√2
    summed = group_advantages(terms.sum(1), groups, "group", 1e-6)
    assert summed.tolist() == pytest.approx([-2 ** -0.5, 2 ** -0.5] * 2, abs=1e-5)
    # GDPO: per term ±1/√2 where the term varies, 0 where it is flat; sums −0.7071, 0.7071, −1.4142,
    # 1.4142; whitened by their Bessel std √(5/3) = 1.2910: one right term is worth half of two
    gdpo = per_term_advantages(terms, torch.ones(4, 2), groups, "group", 1e-6)
    assert gdpo.tolist() == pytest.approx([-0.5477, 0.5477, -1.0954, 1.0954], abs=1e-4)


# --- the algorithm side: every row is selected from ------------------------------------------------


def test_a_token_selection_keeps_the_inert_rows_in_the_update():
    mask = torch.ones(2, 3)
    batch = RolloutBatch(tokens=torch.zeros(2, 3, dtype=torch.long), attention_mask=mask, response_mask=mask,
                         old_logp=torch.zeros(2, 3), rewards=torch.zeros(2), group_ids=torch.zeros(2, dtype=torch.long),
                         advantages=torch.tensor([[1.0] * 3, [0.0] * 3]))
    algo = GRPO()
    assert algo.rows_with_gradient(batch).tolist() == [True, False]
    algo.token_selection = TokenSelection(top_quantile=0.2)  # the quantile is over every row's tokens
    assert algo.rows_with_gradient(batch) is None


# --- the adaptive coefficient's hook ------------------------------------------------------------------


def test_the_hook_logs_the_coefficient_each_step_trained_with_and_resumes_it():
    algo = GRPO(entropy_coef=0.01)
    hook = AdaptiveEntropy(AdaptiveEntropyController(algo.entropy_coef, target=1.0, delta=0.005, coef_max=1.0), algo)
    assert algo.entropy_coef == 0.0  # no bonus before any entropy is measured
    logged = []
    for step, entropy in enumerate([0.8, 0.9, 1.2, 0.7]):
        metrics = {"entropy": entropy}
        hook.finish_step(step, metrics)
        logged.append(metrics["entropy_coef"])
    assert logged == pytest.approx([0.0, 0.015, 0.02, 0.0]) and algo.entropy_coef == pytest.approx(0.02)
    state = json.loads(json.dumps(hook.state_dict()))  # plain numbers, as a checkpoint keeps them
    resumed_algo = GRPO()
    resumed = AdaptiveEntropy(AdaptiveEntropyController(0.0, target=1.0, delta=0.005, coef_max=1.0), resumed_algo)
    resumed.load_state_dict(state)
    assert resumed_algo.entropy_coef == algo.entropy_coef and resumed.controller.value == hook.controller.value
    with pytest.raises(ValueError, match="rl.entropy.target"):
        resumed.load_state_dict(None)


# --- short runs: each control logs what it did --------------------------------------------------------


def rl_metrics(tmp_path, *flags: str) -> list[dict]:
    assert main(["train", *TINY, "--sft.steps", "5", "--rl.steps", "2", *flags, "--out_dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [m for m in metrics if m.get("stage") == "rl"]


def test_a_short_run_with_gdpo_clip_cov_and_the_adaptive_coefficient(tmp_path):
    rows = rl_metrics(tmp_path, "--rl.reward.terms", "r1", "--rl.reward.normalize", "per_term",
                      "--rl.entropy.cov", "clip_cov", "--rl.entropy.cov_ratio", "0.05",
                      "--rl.entropy.target", "100", "--rl.entropy.delta", "0.01")
    assert len(rows) == 2
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.0, 0.01])  # entropy is below 100 nats: it rises
    for r in rows:
        assert 0.0 <= r["reward_flat_groups/accuracy"] <= 1.0 and 0.0 <= r["reward_flat_groups/format"] <= 1.0
        assert 0.0 <= r["clip_cov_frac"] <= 0.05 + 1e-6  # at most its share of the tokens


def test_a_short_run_with_kl_cov_on_the_top_entropy_tokens(tmp_path):
    rows = rl_metrics(tmp_path, "--rl.entropy.cov", "kl_cov", "--rl.entropy.cov_ratio", "0.1",
                      "--rl.entropy.top_quantile", "0.2")
    assert len(rows) == 2
    for r in rows:
        assert 0.15 <= r["entropy_kept_frac"] <= 0.3  # the top fifth by entropy, ties aside
        assert 0.0 < r["kl_cov_frac"] <= 0.1 + 1e-6 and r["clipfrac"] == 0.0  # KL-Cov has no clip


def test_with_a_target_every_row_is_trained_so_the_controller_reads_one_entropy(tmp_path):
    # step 0 pays no bonus yet (coefficient 0): skipping the rows with no gradient would make its
    # entropy the mixed groups' alone, and every later step's every row's (the bonus reads them all)
    rows = rl_metrics(tmp_path, "--rl.entropy.target", "100", "--rl.entropy.delta", "0.01")
    assert [r["entropy_coef"] for r in rows] == pytest.approx([0.0, 0.01])
    assert [r["skipped_rows"] for r in rows] == [0, 0]
    plain = rl_metrics(tmp_path / "plain")
    assert plain[0]["skipped_rows"] > 0  # without a target the inert rows are left out, as before
