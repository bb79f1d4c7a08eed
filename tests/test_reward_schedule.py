"""A term's weight over training (rl.reward.terms's START->END@STEPS): values by hand, the
reward rewritten at the step it is paid, parsing and its errors, and the controller wiring."""

from __future__ import annotations

import pytest

from posttrain.config import RLConfig, RewardConfig
from posttrain.envs import make_env
from posttrain.pipelines.build import reward_stack
from posttrain.pipelines.checks import ConfigError, check_rl
from posttrain.rewards.stack import Accuracy, Format, RewardStack, Schedule
from tests.test_length_reward import RIGHT, WRONG, episodes

ENV = make_env("arithmetic")


def test_a_schedule_by_hand():
    fade = Schedule(1.0, 0.2, 100)
    assert [fade.at(s) for s in (0, 25, 50, 100, 400)] == pytest.approx([1.0, 0.8, 0.6, 0.2, 0.2])
    assert str(fade) == "1->0.2@100" and fade.scaled(0.5) == Schedule(0.5, 0.1, 100)
    with pytest.raises(ValueError, match="steps >= 1"):
        Schedule(1.0, 0.0, 0)
    with pytest.raises(ValueError, match="finite"):
        Schedule(float("nan"), 0.0, 10)


def test_the_stack_pays_each_step_its_weight():
    # accuracy fixed at 1; format 0.5 at step 0 fading to 0 at step 10: at step 4, 0.5 · 0.6 = 0.3
    stack = RewardStack([(1.0, Accuracy()), (Schedule(0.5, 0.0, 10), Format())])
    score = stack.wrap(ENV.score)
    batch = episodes([RIGHT, WRONG], group=0)
    for e in batch:
        result = score(e.example, e.completion)
        e.reward, e.details = result["reward"], result["details"]
    assert [e.reward for e in batch] == [1.5, 0.5]  # scored with the step-0 weight (both well formatted)
    metrics = stack.score_groups(batch, step=4)
    assert [e.reward for e in batch] == pytest.approx([1.3, 0.3])
    assert batch[0].details["weighted"] == pytest.approx({"accuracy": 1.0, "format": 0.3})
    assert metrics == {"reward_weight/format": pytest.approx(0.3)}
    assert stack.version == "1*accuracy + (0.5->0@10)*format(details.format_ok)"
    stack.score_groups(batch, step=20)  # past the schedule: the end weight
    assert [e.reward for e in batch] == pytest.approx([1.0, 0.0])


def test_rl_reward_reads_schedules_and_the_controller_gets_the_hook():
    stack = reward_stack(RLConfig(reward=RewardConfig(terms="1->0.5@50*accuracy + 0.2->0@100*rubric")))
    assert [w for w, _ in stack.terms] == [Schedule(1.0, 0.5, 50), Schedule(0.2, 0.0, 100)]
    assert stack.needs_groups
    # a preset's own weights scale the schedule: r1 = accuracy + 0.2 × format
    r1 = reward_stack(RLConfig(reward=RewardConfig(terms="0.5->0@10*r1")))
    assert [w for w, _ in r1.terms] == [Schedule(0.5, 0.0, 10), Schedule(0.1, 0.0, 10)]
    assert reward_stack(RLConfig(reward=RewardConfig(terms="accuracy"))) is None


@pytest.mark.parametrize("reward, message", [
    ("1->x@5*accuracy", "the weight '1->x@5' is not a finite number or a schedule"),
    ("1->0@0*accuracy", "steps >= 1"),
    ("1->0*accuracy", "START->END@STEPS"),
])
def test_bad_schedules_are_refused_with_the_term_named(reward, message):
    with pytest.raises(ConfigError, match=message):
        check_rl(RLConfig(reward=RewardConfig(terms=reward)))
