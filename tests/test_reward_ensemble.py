"""Reward-model ensembles (mean, min, mean − λ·std) by hand, and the learned reward as one
layer of the stack on top of the verifier (rl.reward.terms "accuracy + 0.5*rm")."""

import math
from pathlib import Path

import pytest
import torch

from posttrain.config import ConfigError, RLConfig, RewardConfig, RewardModelConfig, TrainConfig
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import make_reward
from posttrain.pipelines.checks import check_rl
from posttrain.rewards.ensemble import COMBINES, RewardEnsemble, combine_scores
from posttrain.rewards.proxy import ProxyReward
from posttrain.rewards.reward_model import RewardModel, RewardModelScorer, load_reward_model, save_reward_model


def test_combine_scores_by_hand():
    scores = [1.0, 2.0, 3.0, 6.0]  # mean 3; deviations −2, −1, 0, 3: variance 14/4 = 3.5
    assert combine_scores(scores, "mean") == 3.0
    assert combine_scores(scores, "min") == 1.0
    assert combine_scores(scores, "mean-minus-std") == pytest.approx(3.0 - math.sqrt(3.5))
    assert combine_scores(scores, "mean-minus-std", 2.0) == pytest.approx(3.0 - 2 * math.sqrt(3.5))
    assert combine_scores([0.4, 0.4], "mean-minus-std") == pytest.approx(0.4)  # agreement is not charged
    with pytest.raises(ValueError, match="median"):
        combine_scores(scores, "median")
    with pytest.raises(ValueError, match="at least one"):
        combine_scores([], "mean")


def constant(value):
    return lambda example, completion: {"reward": value, "details": {"truncated": value < 0}}


def test_an_ensemble_is_a_scorer_that_keeps_every_members_score():
    ensemble = RewardEnsemble([constant(1.0), constant(-1.0), constant(3.0)], how="min")
    got = ensemble(None, "anything")
    assert got["reward"] == -1.0
    assert got["details"]["member_rewards"] == [1.0, -1.0, 3.0]
    assert got["details"]["member_std"] == pytest.approx(math.sqrt(8 / 3))  # mean 1, deviations 0, −2, 2
    assert got["details"]["truncated"] is True  # any member's text was cut
    assert ensemble.spec_version == "reward_ensemble/min-x3"
    with pytest.raises(ValueError, match="disagreement_coef"):
        RewardEnsemble([constant(1.0)], "mean-minus-std", disagreement_coef=-1)


@pytest.fixture(scope="module")
def reward_model_dirs(tmp_path_factory) -> list[Path]:
    """Two tiny reward models with different random heads: they disagree."""
    tok, dirs = CharTokenizer(), []
    for seed in (0, 1):
        torch.manual_seed(seed)
        rm = RewardModel(GPTMini(GPTMiniConfig(vocab_size=tok.vocab_size, dim=32, n_layer=1, n_head=2,
                                               hidden_dim=64, max_seq_len=96)))
        torch.nn.init.normal_(rm.head.weight)
        dirs.append(save_reward_model(rm, tmp_path_factory.mktemp(f"rm{seed}") / "reward_model", tok, {}))
    return dirs


def test_several_paths_make_an_ensemble_proxy(reward_model_dirs):
    env = ArithmeticEnv(level=2, cot=False)
    ex = env.fixed_set("train", 1)[0]
    members = [RewardModelScorer(load_reward_model(d)[0]) for d in reward_model_dirs]
    path = ",".join(str(d) for d in reward_model_dirs)
    proxy = make_reward(RLConfig(algo="ppo", rm=RewardModelConfig(path=path, ensemble="min")), env.score)
    assert isinstance(proxy, ProxyReward)
    for completion in (env.solution(ex), "Final: 99", ""):
        scores = [m.score(ex, completion)["reward"] for m in members]
        assert scores[0] != scores[1]
        got = proxy(ex, completion)
        assert got["reward"] == pytest.approx(min(scores))
        assert got["details"]["member_rewards"] == pytest.approx(scores)
        assert got["details"]["gold_reward"] == env.score(ex, completion)["reward"]


def test_the_rm_term_adds_the_learned_reward_on_top_of_the_verifier(reward_model_dirs):
    env = ArithmeticEnv(level=2, cot=False)
    ex = env.fixed_set("train", 1)[0]
    member = RewardModelScorer(load_reward_model(reward_model_dirs[0])[0])
    reward = make_reward(RLConfig(reward=RewardConfig(terms="accuracy + 0.5*rm"), rm=RewardModelConfig(path=str(reward_model_dirs[0]))),
                         env.score)
    assert not isinstance(reward, ProxyReward)  # the verifier stays the base reward
    for completion, right in ((env.solution(ex), 1.0), ("Final: 99", 0.0)):
        learned = member.score(ex, completion)["reward"]
        got = reward(ex, completion)
        assert got["reward"] == pytest.approx(right + 0.5 * learned)
        assert got["details"]["components"] == pytest.approx({"accuracy": right, "rm": learned})
        assert got["details"]["reason"] == env.score(ex, completion)["details"]["reason"]
    assert "0.5*rm(reward_model/bt-v1)" in reward.version


def test_rm_settings_are_checked_before_a_run():
    with pytest.raises(ConfigError, match="rl.reward.terms=.*needs its model: set rl.rm.path"):
        check_rl(RLConfig(reward=RewardConfig(terms="accuracy + 0.5*rm")))
    with pytest.raises(ConfigError, match="rl.rm.ensemble"):
        TrainConfig(rl=RLConfig(rm=RewardModelConfig(ensemble="median"))).validate()
    with pytest.raises(ConfigError, match="rl.rm.ensemble_size"):
        TrainConfig(rl=RLConfig(rm=RewardModelConfig(ensemble_size=0))).validate()


@pytest.mark.parametrize("how", COMBINES)
def test_the_config_accepts_exactly_the_combinations_the_ensemble_knows(how):
    # config/ imports nothing else from posttrain, so it spells the names out: this keeps the two lists one
    TrainConfig(rl=RLConfig(rm=RewardModelConfig(ensemble=how))).validate()
    assert combine_scores([0.1, 0.4], how, 1.0) <= 0.25  # each combination is known and none pays above the mean
    with pytest.raises(ConfigError, match="rl.rm.ensemble"):
        TrainConfig(rl=RLConfig(rm=RewardModelConfig(ensemble=how + "x"))).validate()
