"""Self-rewarding rounds: the policy judges its own samples and its verdicts alone build the
pairs (a judge that disagrees with the verifier gets pairs that follow the judge), the
verifier's verdict only measures the judge (agreement numbers by hand), the judge
demonstrations SFT learns from, and the settings refused before a run."""

import json
import random
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, PreferenceConfig, RLConfig, SFTConfig, TrainConfig
from posttrain.data.judge_demos import carried_step_error, corrupt_one_digit, judge_demonstrations, wrong_solution
from posttrain.data.preference_rows import group_by_prompt
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.eval.ranker_agreement import ranker_agreement
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines import preference_rounds
from posttrain.pipelines.checks import check_config
from posttrain.pipelines import sft as sft_module
from posttrain.pipelines.sft import sft_demonstrations, sft_judge_rows
from posttrain.rewards.judge import COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, Judgement, judge_prompt_ids
from posttrain.rewards.self_judge import SELF_JUDGE_CRITERION, SelfJudgeReward, self_judge
from posttrain.types import Episode, Example, PreferencePair

TOK = CharTokenizer()


class Fixed:
    """An rng whose draws are given: randrange and choice return the next scripted value."""

    def __init__(self, *values):
        self.values = list(values)

    def randrange(self, n):
        return self.values.pop(0)

    def choice(self, options):
        return self.values.pop(0)


# ------------------------------------------------------------------ judge demonstrations


def test_a_wrong_step_is_carried_through_the_chain_by_hand():
    # 7+5+9: step 0's sum 12 off by +1 -> 13, then 13+9 = 22 carried on, and Final: 22
    assert carried_step_error([7, 5, 9], ["+", "+"], Fixed(0, 1)) == "7+5=13,13+9=22\nFinal: 22"
    # step 1 off by −10: 7+5=12, 12+9=21 − 10 = 11
    assert carried_step_error([7, 5, 9], ["+", "+"], Fixed(1, -10)) == "7+5=12,12+9=11\nFinal: 11"
    assert carried_step_error([7, 5, 9], ["+", "-"], Fixed(1, 2), cot=False) == "Final: 5"


def test_corrupt_one_digit_changes_exactly_one_digit():
    rng = random.Random(0)
    for _ in range(20):
        out = corrupt_one_digit("a1b22c", rng)
        assert len(out) == 6 and sum(x != y for x, y in zip(out, "a1b22c")) == 1
        assert all(x == y or (x.isdigit() and y.isdigit()) for x, y in zip(out, "a1b22c"))
    with pytest.raises(ValueError, match="no digit to corrupt"):
        corrupt_one_digit("no digits", rng)


def test_a_task_without_a_running_sum_gets_one_digit_corrupted():
    class Products:  # a task verifiers/steps.py cannot read: its solution is corrupted instead
        def solution(self, example):
            return "3*4=12\nFinal: 12"

    wrong = wrong_solution(Products(), Example("What is 3*4?\n", "12"), random.Random(0))
    assert len(wrong) == len("3*4=12\nFinal: 12") and wrong != "3*4=12\nFinal: 12"
    # an arithmetic prompt is read by verifiers/steps.py and gets the carried slip instead
    env = ArithmeticEnv(level=2)
    (example,) = env.fixed_set("train", 1, seed=0)
    assert env.score(example, wrong_solution(env, example, random.Random(0)))["reward"] == 0.0


def test_judge_demonstrations_pair_a_right_and_a_wrong_answer_in_the_judges_layout():
    env = ArithmeticEnv(level=3)
    examples = env.fixed_set("train", 20, seed=1)
    rows = judge_demonstrations(env, TOK, examples, seed=0)
    assert len(rows) == 40 and [r.completion for r in rows[:4]] == ["Y", "N", "Y", "N"]
    for i, example in enumerate(examples):
        right, wrong = rows[2 * i], rows[2 * i + 1]
        assert right.response_ids == TOK.encode("Y") + [TOK.eos_id] and wrong.response_ids == TOK.encode("N") + [2]
        # exactly the ids the self-judge reads, ending with "\nCorrect? "
        assert right.prompt_ids == judge_prompt_ids(TOK, CORRECT_YN, *SELF_JUDGE_CRITERION, example,
                                                    env.solution(example), COMPACT_JUDGE_PROMPT_VERSION)
        text = TOK.decode(wrong.prompt_ids)
        assert text.startswith(example.prompt) and text.endswith("\nCorrect? ")
        wrong_answer = text[len(example.prompt) : -len("\nCorrect? ")]
        assert env.score(example, env.solution(example))["reward"] == 1.0
        assert env.score(example, wrong_answer)["reward"] == 0.0  # the verifier agrees it is wrong
    assert rows == judge_demonstrations(env, TOK, examples, seed=0)  # deterministic


def test_sft_draws_judge_rows_on_top_of_the_same_demonstration_batches(tmp_path, monkeypatch):
    env = ArithmeticEnv(level=3)
    assert sft_judge_rows(TrainConfig(sft=SFTConfig(num_examples=10)), env, TOK) == []
    judge_rows = sft_judge_rows(TrainConfig(sft=SFTConfig(num_examples=10, judge_demos=6)), env, TOK)
    assert sorted(e.completion for e in judge_rows) == ["N"] * 6 + ["Y"] * 6
    batches = {}
    for name, extra in (("plain", None), ("judged", judge_rows)):
        seen = batches.setdefault(name, [])
        monkeypatch.setattr(sft_module, "run_stage", lambda run, stage, steps, step_fn, *a, **k: [
            step_fn(step) for step in range(steps)])
        monkeypatch.setattr(sft_module.Trainer, "update", lambda self, batch, loss: seen.append(batch) or {})
        demos = sft_demonstrations(TrainConfig(sft=SFTConfig(num_examples=10)), env, TOK)
        sft_module.fine_tune(None, "sft", demos, TOK, tiny_policy(), SFTConfig(steps=3, batch_size=4), 0, 0,
                             extra=extra)
    for plain, judged in zip(batches["plain"], batches["judged"]):
        assert plain.batch_size == 4 and judged.batch_size == 8
        assert judged.episodes[:4] == plain.episodes  # the demonstrations drawn exactly as without judge rows
        assert all(e.completion in ("Y", "N") for e in judged.episodes[4:])


# ------------------------------------------------------------------ pairs from the judge alone


class FakeJudge:
    """A judge whose score of each completion is scripted (and may contradict the verifier)."""

    def __init__(self, scores):
        self.scores = scores

    def rate(self, criterion, description, examples, completions):
        return [Judgement(self.scores[c], "scripted", 1.0, self.scores[c]) for c in completions]


class ScriptedEngine:
    """Stands in for the sampler: every prompt gets the same scripted completions."""

    completions = {}

    def __init__(self, *args, **kwargs):
        pass

    def generate(self, examples, k, generator):
        return [Episode(e, i, [1], [5], [0.0], completion) for i, e in enumerate(examples)
                for completion in self.completions[e.prompt]]


def test_pairs_follow_the_judge_even_against_the_verifier_and_agreement_is_measured(monkeypatch):
    env = ArithmeticEnv(level=1)
    a, b, c = env.fixed_set("train", 3, seed=0)
    sol = {e.prompt: env.solution(e) for e in (a, b, c)}

    def off(e, d):  # the solution with its final answer off by d (the verifier: wrong)
        answer = int(e.expected_answer)
        return sol[e.prompt].replace(f"Final: {answer}", f"Final: {answer + d}")

    ScriptedEngine.completions = {e.prompt: [sol[e.prompt], off(e, 1), off(e, 2)] for e in (a, b, c)}
    scores = {}
    scores.update({sol[a.prompt]: 0.1, off(a, 1): 0.9, off(a, 2): 0.5})  # a: the judge prefers a wrong answer
    scores.update({sol[b.prompt]: 0.8, off(b, 1): 0.3, off(b, 2): 0.8})  # b: it prefers the right one (tied)
    scores.update({sol[c.prompt]: 0.4, off(c, 1): 0.4, off(c, 2): 0.4})  # c: all tied, no pair
    monkeypatch.setattr(preference_rounds, "make_engine", ScriptedEngine)
    monkeypatch.setattr(env, "sample", lambda split, n, seed=None: [a, b, c])
    cfg = TrainConfig()
    cfg.rl.samples_per_prompt = 3
    pairs, stats = preference_rounds.verifier_pairs(cfg, env, TOK, None, 0, 3,
                                                    score=SelfJudgeReward(FakeJudge(scores), env.score))
    # one pair per prompt, the judge's best against its worst; of b's tied best, the first
    assert [(p.chosen, p.rejected) for p in pairs] == [(off(a, 1), sol[a.prompt]), (sol[b.prompt], off(b, 1))]
    assert [(p.score_chosen, p.score_rejected) for p in pairs] == [(0.9, 0.1), (0.8, 0.3)]
    # agreement by hand. AUROC over all 9 samples: positives (right) 0.1, 0.8, 0.4; negatives
    # 0.9, 0.5, 0.3, 0.8, 0.4, 0.4. 0.1 beats none; 0.8 beats 0.5, 0.3, 0.4, 0.4 and ties 0.8
    # (4.5); 0.4 beats 0.3 and ties 0.4 twice (2): (0 + 4.5 + 2) / 18
    assert stats["ranker_auroc"] == pytest.approx(6.5 / 18)
    assert stats["ranker_auroc_ci_low"] <= stats["ranker_auroc"] <= stats["ranker_auroc_ci_high"]
    # pairs: a's points the wrong way, b's the right way
    assert stats["ranker_pair_agreement"] == 0.5 and stats["ranker_pair_gold_ties"] == 0.0
    assert stats["sampled_gold_mean"] == pytest.approx(1 / 3) and stats["pairs"] == 2


def test_ranker_agreement_by_hand_and_undefined_numbers_left_out():
    ex = Example("Q\n", "")

    def ep(text, score, gold):
        return Episode(ex, 0, [1], [5], [0.0], text, reward=score, details={"gold_reward": gold})

    group = [ep("w", 0.9, 1.0), ep("x", 0.2, 0.0), ep("y", 0.6, 0.0), ep("z", 0.4, 1.0)]
    pairs = [PreferencePair("Q\n", "w", "x"), PreferencePair("Q\n", "y", "z"), PreferencePair("Q\n", "w", "z")]
    stats = ranker_agreement(group_by_prompt(group), pairs)
    # positives 0.9, 0.4 vs negatives 0.2, 0.6: 0.9 > both, 0.4 > 0.2 only -> 3 / 4
    assert stats["ranker_auroc"] == pytest.approx(0.75)
    # w≻x agrees, y≻z disagrees, w≻z is a tie for the verifier (both right)
    assert stats["ranker_pair_agreement"] == 0.5 and stats["ranker_pair_gold_ties"] == pytest.approx(1 / 3)
    all_right = ranker_agreement(group_by_prompt([ep("w", 0.9, 1.0), ep("z", 0.4, 1.0)]), [])
    assert all_right == {}  # one class and no pair: nothing is defined, nothing is written as NaN


def tiny_policy():
    return GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=96))


def test_the_self_judge_is_the_policy_reading_the_compact_prompt():
    policy = tiny_policy()
    judge = self_judge(policy, TOK)
    assert judge.model is policy and judge.scale == CORRECT_YN and "compact-judge-v1" in judge.version
    env = ArithmeticEnv(level=1)
    (example,) = env.fixed_set("train", 1)
    scored = SelfJudgeReward(judge, env.score)(example, env.solution(example))
    assert 0 <= scored["reward"] <= 1 and scored["details"]["gold_reward"] == 1.0
    assert scored["details"]["reward_source"] == "self_judge"


# ------------------------------------------------------------------ settings refused before a run


@pytest.mark.parametrize("cfg, message", [
    (TrainConfig(rl=RLConfig(algo="grpo", preference=PreferenceConfig(self_reward=True))), "rl.preference.self_reward=True is not allowed.*preference loss"),
    (TrainConfig(rl=RLConfig(algo="dpo", preference=PreferenceConfig(self_reward=True, pairs="x.jsonl"))), "rl.preference.self_reward=True.*rl.preference.pairs"),
    (TrainConfig(rl=RLConfig(algo="dpo", preference=PreferenceConfig(self_reward=True))), "sft.judge_demos=0 is not allowed.*gpt_mini"),
    (TrainConfig(init="runs/x", sft=SFTConfig(judge_demos=5)), "init="),
])
def test_bad_self_reward_settings_are_refused(cfg, message):
    with pytest.raises(ConfigError, match=message):
        check_config(cfg)


def test_self_reward_with_a_reward_model_and_a_too_long_budget_are_refused():
    cfg = TrainConfig(rl=RLConfig(algo="dpo", preference=PreferenceConfig(self_reward=True)))
    cfg.rl.rm.path = "some/reward_model"
    with pytest.raises(ConfigError, match="rl.preference.self_reward=True is not allowed.*one ranker"):
        check_config(cfg)
    cfg = TrainConfig(rl=RLConfig(algo="dpo", preference=PreferenceConfig(self_reward=True)), sft=SFTConfig(judge_demos=5))
    cfg.rl.sampling.max_new_tokens = 80  # fits the policy's 96 positions after a 14-token prompt, not the judge's:
    # <bos> + the 13-character prompt + "\n" + "Correct?" + " " = 24 tokens, + the sample + the verdict <= 96
    with pytest.raises(ConfigError, match="rl.sampling.max_new_tokens=80 is not allowed: expected at most 71"):
        check_config(cfg)
    cfg = TrainConfig(sft=SFTConfig(judge_demos=5, steps=0))
    with pytest.raises(ConfigError, match="sft.judge_demos=5 is not allowed.*without an SFT stage"):
        check_config(cfg)


# ------------------------------------------------------------------ a whole self-rewarding run

TINY = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--env.arithmetic.level", "2", "--env.cot", "false",
    "--sft.num_examples", "200", "--sft.steps", "60", "--sft.batch_size", "32", "--sft.lr", "1e-2",
    "--sft.warmup_steps", "2", "--sft.judge_demos", "100",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "8", "--rl.sampling.temperature", "1.5",
    "--rl.eval_every", "5", "--rl.dev_size", "8", "--heldout_size", "16", "--threads", "1",
]


def test_a_self_rewarding_run_writes_the_judges_pairs_and_its_agreement_per_round(tmp_path):
    assert main(["train", *TINY, "--algo", "dpo", "--rl.preference.self_reward", "true", "--rl.steps", "4",
                 "--rl.preference.online_rounds", "2", "--rl.preference.pair_prompts", "32", "--out_dir", str(tmp_path)]) == 0
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    rounds = json.loads((run / "pref_rounds.json").read_text())
    assert set(rounds) == {"0", "1"}
    for r in ("0", "1"):
        pairs = [json.loads(line) for line in (run / f"pairs_round{r}.jsonl").read_text().splitlines()]
        assert len(pairs) == len({p["prompt"] for p in pairs}) == rounds[r]["pairs"]  # best vs worst per prompt
        assert all(0 <= p["score_rejected"] < p["score_chosen"] <= 1 for p in pairs)  # the judge's P(Y)
        assert 0 <= rounds[r]["sampled_gold_mean"] <= 1
        if "ranker_auroc" in rounds[r]:
            assert rounds[r]["ranker_auroc_ci_low"] <= rounds[r]["ranker_auroc"] <= rounds[r]["ranker_auroc_ci_high"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("round_sampled_gold_mean" in row for row in rows if row["stage"] == "pref")
    assert Path(run / "pairs_dev.jsonl").exists()  # held-out pairs stay the verifier's
