"""Kimi k1.5's length reward (rewards/stack.py): its values by hand, its schedule, the stack's
group terms and details, the settings that refuse it, and a short run that pays it."""

from __future__ import annotations

import json

import pytest

from posttrain.cli import main
from posttrain.config import RLConfig, RewardConfig, TrainConfig
from posttrain.envs import make_env
from posttrain.pipelines.build import make_reward, reward_stack
from posttrain.pipelines.checks import ConfigError, check_config
from posttrain.rewards.length import KimiLength, kimi_length_reward
from posttrain.rewards.stack import Accuracy, RewardStack
from posttrain.types import Episode, Example
from tests.test_pipeline import TINY

ENV = make_env("arithmetic")
EXAMPLE = Example("Q: 1+2+3+4+5\n", "15")
RIGHT, WRONG = "1+2=3,3+3=6,6+4=10,10+5=15\nFinal: 15", "Final: 14"


def test_values_by_hand():
    # λ = 0.5 − (len − 10) / 30: 0.5, 0.1667, −0.1667, −0.5; the wrong ones keep min(0, λ)
    values = kimi_length_reward([10, 20, 30, 40], [True, True, False, False])
    assert values == pytest.approx([0.5, 0.5 - 1 / 3, 0.5 - 2 / 3, -0.5])
    # a short wrong answer earns nothing for its brevity; a long right one is charged
    assert kimi_length_reward([10, 40], [False, True]) == pytest.approx([0.0, -0.5])
    assert kimi_length_reward([25, 10, 40], [True, False, False]) == pytest.approx([0.0, 0.0, -0.5])
    # every length equal (or a group of one): no ranking, all 0
    assert kimi_length_reward([12, 12, 12], [True, False, True]) == [0.0, 0.0, 0.0]
    assert kimi_length_reward([7], [True]) == [0.0]
    with pytest.raises(ValueError, match="verdicts"):
        kimi_length_reward([1, 2], [True])


def test_the_schedule_pays_nothing_before_its_start_step():
    term = KimiLength(start_step=50)
    assert term([10, 40], [True, True], step=49) == [0.0, 0.0]
    assert term([10, 40], [True, True], step=50) == pytest.approx([0.5, -0.5])
    assert term.spec == "length_kimi(from_step=50)"
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="start_step"):
            KimiLength(start_step=bad)


def episodes(completions: list[str], group: int = 0) -> list[Episode]:
    return [Episode(example=EXAMPLE, group_id=group, prompt_ids=[1, 2], response_ids=[5] * len(text) + [0],
                    response_logp=[0.0] * (len(text) + 1), completion=text) for text in completions]


def test_the_stack_adds_it_per_group_and_shows_which_part_paid():
    stack = RewardStack([(1.0, Accuracy())], group_terms=[(0.5, KimiLength())])
    score = stack.wrap(ENV.score)
    batch = episodes([RIGHT, RIGHT + " ok", WRONG], group=0) + episodes([RIGHT, RIGHT], group=1)
    for e in batch:
        result = score(e.example, e.completion)
        e.reward, e.details = result["reward"], result["details"]
    assert [e.reward for e in batch] == [1.0, 0.0, 0.0, 1.0, 1.0]  # "ok" after the answer is wrong under the strict spec
    assert [e.details["solved"] for e in batch] == [True, False, False, True, True]
    metrics = stack.score_groups(batch, step=0)
    # group 0 lengths (tokens, EOS included): 37, 40, 10 -> λ = 0.5 − (L − 10)/30: −0.4, −0.5, 0.5
    assert batch[0].details["components"]["length_kimi"] == pytest.approx(0.5 - 27 / 30)
    assert batch[1].details["components"]["length_kimi"] == pytest.approx(-0.5)  # wrong and longest
    assert batch[2].details["components"]["length_kimi"] == 0.0  # wrong and shortest: min(0, 0.5)
    assert batch[0].details["weighted"]["length_kimi"] == pytest.approx(0.5 * (0.5 - 27 / 30))
    assert batch[0].reward == pytest.approx(1.0 + 0.5 * (0.5 - 27 / 30))
    assert batch[1].reward == pytest.approx(-0.25)
    assert [e.reward for e in batch[3:]] == [1.0, 1.0]  # group 1: equal lengths, nothing paid
    assert metrics == {"reward/length_kimi": pytest.approx(0.5 * (0.5 - 27 / 30 - 0.5) / 5)}
    assert batch[0].details["reward_spec"] == "1*accuracy + 0.5*length_kimi(from_step=0)"
    assert batch[0].details["components"]["accuracy"] == 1.0  # the verifier's part, unchanged
    with pytest.raises(ValueError, match="score the episodes with it first"):
        stack.score_groups(episodes([RIGHT]), step=0)


def test_names_must_differ_across_both_kinds_of_term():
    with pytest.raises(ValueError, match="unique"):
        RewardStack([(1.0, Accuracy(name="length_kimi"))], group_terms=[(1.0, KimiLength())])


def test_the_config_builds_it_and_the_default_reward_is_untouched():
    score = ENV.score  # one bound method: make_reward hands back this very object
    assert reward_stack(RLConfig()) is None and make_reward(RLConfig(), score) is score
    stack = reward_stack(RLConfig(reward=RewardConfig(length_reward=0.5, length_reward_start=7)))
    assert [t.name for _, t in stack.terms] == ["accuracy"]
    assert [(w, t) for w, t in stack.group_terms] == [(0.5, KimiLength(7))]


@pytest.mark.parametrize("settings, message", [
    ({"algo": "dpo"}, "a preference loss trains on pairs"),
    ({"samples_per_prompt": 1, "algo": "reinforce"}, "alone it is always 0"),
    ({"reward": {"length_reward_start": 200}}, "never be paid"),
    ({"reward": {"length_reward": -0.5}}, "rl.reward.length_reward=-0.5"),
])
def test_settings_it_cannot_work_with_are_refused(settings, message):
    reward = RewardConfig(**{"length_reward": 0.5, **settings.pop("reward", {})})
    with pytest.raises(ConfigError, match=message):
        check_config(TrainConfig(rl=RLConfig(reward=reward, **settings)))


def test_a_multi_turn_environment_refuses_it():
    from posttrain.config import EnvConfig

    with pytest.raises(ConfigError, match="rl.reward.length_reward"):
        check_config(TrainConfig(env=EnvConfig(name="tool_arithmetic"), rl=RLConfig(reward=RewardConfig(length_reward=0.5))))


def test_a_short_run_pays_it_from_its_start_step(tmp_path):
    assert main(["train", *TINY, "--rl.steps", "3", "--rl.reward.length_reward", "1.0", "--rl.reward.length_reward_start", "1",
                 "--out_dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [m for m in metrics if m.get("stage") == "rl"]
    assert len(rl) == 3 and rl[0]["reward/length_kimi"] == 0.0  # the mean paid per sample, step by step
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    paid = [s for s in samples if s["step"] >= 1 and s["details"]["components"]["length_kimi"] != 0.0]
    assert all(s["details"]["components"]["length_kimi"] == 0.0 for s in samples if s["step"] == 0)
    assert paid, "a tiny, barely trained policy's samples differ in length: someone is paid"
    for s in paid:
        assert s["reward"] == pytest.approx(s["details"]["components"]["accuracy"]
                                            + s["details"]["weighted"]["length_kimi"])
    assert "length_kimi(from_step=1)" in samples[0]["details"]["reward_spec"]
