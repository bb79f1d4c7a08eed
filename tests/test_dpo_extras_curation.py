"""DPO's pair curation and diagnostics on numbers worked by hand: pairs balanced by length
gap, by topic and by prompt (exact duplicates dropped, then at most N pairs a prompt; the counts
kept per bucket), the template-mimicry monitor (fires on a policy
that learns one opening, quiet on a healthy one and on a task whose answers share a form),
the temperature table (its rows), the settings refused before a run, and one tiny run that
balances its pairs and writes the start-against-trained diagnostics into summary.md."""

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, MONITORS, PreferenceConfig, SamplingParams, TrainConfig
from posttrain.config.files import from_dict
from posttrain.data.pair_balance import LONGER, SAME, SHORTER, balance_pairs, dedupe_prompts, length_bucket, topic_of
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.eval.sensitivity import temperature_table
from posttrain.pipelines.checks import check_config
from posttrain.runs.monitors import RUN_MONITORS, check_all
from posttrain.runs.preference_monitors import template_mimicry, template_share
from posttrain.runs.preference_report import diagnostics_lines
from posttrain.types import Episode, PreferencePair, UnpairedExample


def pair(chosen_len, rejected_len, **meta):
    return PreferencePair("Q: x\n", "c" * chosen_len, "r" * rejected_len, meta)


# ------------------------------------------------------------------ length balancing


def test_length_bucket_by_hand():
    assert length_bucket(pair(40, 30)) == LONGER
    assert length_bucket(pair(30, 40)) == SHORTER
    # within 5% of the longer: 40 vs 38 differ by 2 ≤ 0.05·40, the same length; 40 vs 37 do not
    assert length_bucket(pair(40, 38)) == SAME and length_bucket(pair(38, 40)) == SAME
    assert length_bucket(pair(40, 37)) == LONGER


def test_length_balancing_keeps_equal_longer_and_shorter_counts():
    # 6 chosen-longer, 2 chosen-shorter, 3 same-length -> 2 + 2 + 3 kept
    pairs = [pair(50, 20 + i) for i in range(6)] + [pair(20, 50 + i) for i in range(2)] + [pair(30, 30)] * 3
    kept, report = balance_pairs(pairs, lengths=True, topics=False, seed=0)
    assert report == {"lengths": {LONGER: {"before": 6, "kept": 2}, SAME: {"before": 3, "kept": 3},
                                  SHORTER: {"before": 2, "kept": 2}}}
    assert len(kept) == 7
    buckets = [length_bucket(p) for p in kept]
    assert buckets.count(LONGER) == buckets.count(SHORTER) == 2  # "longer wins" is now a coin flip
    assert [pairs.index(p) for p in kept] == sorted(pairs.index(p) for p in kept)  # original order
    assert balance_pairs(pairs, True, False, seed=0)[0] == kept  # seeded: the same draw every time
    assert any(balance_pairs(pairs, True, False, seed=s)[0] != kept for s in range(1, 6))  # and a draw


def test_length_balancing_refuses_what_it_cannot_balance():
    with pytest.raises(ValueError, match="of 3 pairs 3 have the longer chosen response and 0 the shorter"):
        balance_pairs([pair(50, 20)] * 3, lengths=True, topics=False, seed=0)
    with pytest.raises(ValueError, match="record 1 is an unpaired example"):
        balance_pairs([pair(50, 20), UnpairedExample("Q\n", "a", True)], lengths=True, topics=False, seed=0)
    # topics alone balance unpaired examples too, and balancing nothing keeps everything
    assert balance_pairs([UnpairedExample("Q\n", "a", True)], lengths=False, topics=True, seed=0)[0] != []
    assert balance_pairs([pair(50, 20)] * 3, lengths=False, topics=False, seed=0) == ([pair(50, 20)] * 3, {})


# ------------------------------------------------------------------ topic balancing


def test_topic_key_rule():
    assert topic_of(pair(1, 1, topic="travel", level=3)) == "travel"
    assert topic_of(pair(1, 1, difficulty=2, level=3)) == "difficulty 2"
    assert topic_of(pair(1, 1, level=3)) == "level 3"
    assert topic_of(PreferencePair("Review the hotel:\n", "a", "b")) == "Review"
    assert topic_of(PreferencePair("", "a", "b")) == ""


def test_topic_balancing_caps_every_topic_at_the_median():
    # topics a: 6, b: 2, c: 3 -> median 3 -> a 3, b 2, c 3; four topics 1, 2, 4, 9 -> median ⌈3⌉ = 3
    pairs = [pair(30, 30, topic="a")] * 6 + [pair(30, 30, topic="b")] * 2 + [pair(30, 30, topic="c")] * 3
    kept, report = balance_pairs(pairs, lengths=False, topics=True, seed=0)
    assert report["topics"] == {"a": {"before": 6, "kept": 3}, "b": {"before": 2, "kept": 2},
                                "c": {"before": 3, "kept": 3}}
    assert [p.meta["topic"] for p in kept].count("a") == 3 and len(kept) == 8
    four = [pair(30, 30, topic=t) for t, n in (("w", 1), ("x", 2), ("y", 4), ("z", 9)) for _ in range(n)]
    counts = balance_pairs(four, lengths=False, topics=True, seed=0)[1]["topics"]
    assert [counts[t]["kept"] for t in "wxyz"] == [1, 2, 3, 3]


def test_topics_then_lengths():
    # topic a: 4 chosen-longer; topic b: 2 chosen-shorter. Topics (median 3) keep a 3, b 2; then
    # lengths keep 2 longer and 2 shorter: 4 pairs, 2 of each topic
    pairs = [pair(50, 20, topic="a")] * 4 + [pair(20, 50, topic="b")] * 2
    kept, report = balance_pairs(pairs, lengths=True, topics=True, seed=3)
    assert report["topics"]["a"] == {"before": 4, "kept": 3}
    assert report["lengths"] == {LONGER: {"before": 3, "kept": 2}, SHORTER: {"before": 2, "kept": 2}}
    assert sorted(p.meta["topic"] for p in kept) == ["a", "a", "b", "b"]


# ------------------------------------------------------------------ prompt deduplication


def test_duplicates_dropped_then_each_prompt_capped_by_hand():
    # prompt A: 5 distinct pairs and 2 exact duplicates of its first (one with other meta and scores);
    # prompt B: 2 distinct pairs. Cap 3: A keeps 3 of its 5, B both, no duplicate
    a = [PreferencePair("A\n", f"right {i}", "wrong") for i in range(5)]
    b = [PreferencePair("B\n", "right", f"wrong {i}") for i in range(2)]
    twins = [PreferencePair("A\n", "right 0", "wrong"),
             PreferencePair("A\n", "right 0", "wrong", {"level": 2}, score_chosen=1.0, score_rejected=0.0)]
    records = [a[0], b[0], *twins, *a[1:], b[1]]
    kept, report = balance_pairs(records, lengths=False, topics=False, seed=0, max_per_prompt=3)
    assert report == {"prompts": {"exact duplicates": {"before": 2, "kept": 0},
                                  "on prompts with more than 3": {"before": 5, "kept": 3},
                                  "on prompts with at most 3": {"before": 2, "kept": 2}}}
    assert len(kept) == 5 and sum(p.prompt == "A\n" for p in kept) == 3 and b[0] in kept and b[1] in kept
    assert len({(p.prompt, p.chosen, p.rejected) for p in kept}) == 5  # no two alike
    assert [records.index(p) for p in kept] == sorted(records.index(p) for p in kept)  # original order
    assert balance_pairs(records, False, False, seed=0, max_per_prompt=3)[0] == kept  # seeded
    assert any(balance_pairs(records, False, False, seed=s, max_per_prompt=3)[0] != kept for s in range(1, 6))
    # a cap no prompt reaches still drops the duplicates, and only them
    assert balance_pairs(records, False, False, seed=0, max_per_prompt=9)[0] == [a[0], b[0], *a[1:], b[1]]


def test_a_kto_example_is_a_duplicate_only_with_the_same_label_and_a_bad_cap_is_refused():
    up, down = UnpairedExample("Q\n", "a", True), UnpairedExample("Q\n", "a", False)
    kept, report = dedupe_prompts([up, down, up], 5, random.Random(0))
    assert kept == [up, down] and report["exact duplicates"] == {"before": 1, "kept": 0}
    with pytest.raises(ValueError, match="max_per_prompt 0 must be a whole number >= 1"):
        dedupe_prompts([up], 0, random.Random(0))
    with pytest.raises(ConfigError, match="rl.preference.max_pairs_per_prompt=-1 is not allowed: expected an integer >= 0"):
        PreferenceConfig(max_pairs_per_prompt=-1).validate()


def test_prompts_then_topics_count_what_deduplication_kept():
    # topic a: one prompt with 6 pairs, capped to 2; topic b: 3 prompts of 1. Topics then see a 2, b 3 (median
    # of two topics ⌈2.5⌉ = 3): nothing more to cut, where without the cap a's 6 would have been cut to 3
    pairs = ([PreferencePair("A\n", f"c{i}", "r", {"topic": "a"}) for i in range(6)]
             + [PreferencePair(f"B{i}\n", "c", "r", {"topic": "b"}) for i in range(3)])
    kept, report = balance_pairs(pairs, lengths=False, topics=True, seed=0, max_per_prompt=2)
    assert report["prompts"]["on prompts with more than 2"] == {"before": 6, "kept": 2}
    assert report["topics"] == {"a": {"before": 2, "kept": 2}, "b": {"before": 3, "kept": 3}}
    assert len(kept) == 5


# ------------------------------------------------------------------ template mimicry


def test_template_share_by_hand():
    assert template_share([]) == 0.0
    # openings: the first 16 characters, lowercased, whitespace collapsed: two of three alike
    assert template_share(["I'm sorry,  but I cannot", "i'm SORRY, but i cannot help", "7+5=12"]) == pytest.approx(2 / 3)
    assert template_share([f"{a}+{b}={a + b},Final" for a in range(4) for b in range(4)]) == pytest.approx(1 / 16)


def template_rows(shares):
    return [{"step": 10 * i, "template_share": s} for i, s in enumerate(shares)]


def test_template_mimicry_fires_where_the_share_first_rises_past_the_line():
    # first evaluation 0.05; line 0.05 + 0.3 = 0.35: step 20 (0.30) is under it, step 30 (0.50) fires,
    # it stays above (no second alert) until it falls back and crosses again at step 60
    rows = template_rows([0.05, 0.10, 0.30, 0.50, 0.90, 0.20, 0.60])
    alerts = template_mimicry(rows)
    assert [(a["step"], a["value"]) for a in alerts] == [(30, 0.50), (60, 0.60)]
    assert alerts[0]["threshold"] == pytest.approx(0.35) and alerts[0]["monitor"] == "template_mimicry"
    assert "0.50: that share of the policy's dev samples open with the same 16 characters" in alerts[0]["message"]
    # registered: the run's alerts (and rl.alerts.monitors) include it
    assert "template_mimicry" in MONITORS
    assert [a["step"] for a in check_all(rows, RUN_MONITORS) if a["monitor"] == "template_mimicry"] == [30, 60]


def test_template_mimicry_stays_quiet_on_a_healthy_policy_and_a_task_with_a_fixed_form():
    assert template_mimicry(template_rows([0.02, 0.03, 0.05, 0.03, 0.06])) == []
    assert template_mimicry(template_rows([0.90, 0.95, 1.0, 1.0])) == []  # every answer opens "Final: " from the start
    assert template_mimicry([{"step": 0, "reward_mean": 0.5}]) == []  # an RL run logs no template_share


# ------------------------------------------------------------------ the temperature table


class ColderIsBetterEngine:
    """Answers the first round((1 − T) · n) problems right and the rest wrong: pass@1 1, 0.5
    and 0 at T = 0, 0.5 and 1, worked out in advance."""

    def __init__(self, env, temperature):
        self.env, self.params = env, SamplingParams(temperature=temperature)

    def generate(self, examples, samples_per_prompt=1, generator=None, params=None):
        temperature = (params or self.params).temperature
        right = round((1 - temperature) * len(examples))
        return [Episode(e, i, [], [1] * (3 if i < right else 5), [0.0],
                        completion=self.env.solution(e) if i < right else "Final: -1")
                for i, e in enumerate(examples)]


def test_temperature_table_rows():
    env = ArithmeticEnv(level=2, cot=False)
    examples = env.fixed_set("heldout", 10)
    rows = temperature_table(lambda t: ColderIsBetterEngine(env, t), env, examples, [0.0, 0.5, 1.0], seed=0)
    assert [(r["temperature"], r["pass@1"], r["reward_mean"], r["n"]) for r in rows] == [
        (0.0, 1.0, 1.0, 10), (0.5, 0.5, 0.5, 10), (1.0, 0.0, 0.0, 10)]
    assert [r["response_length"] for r in rows] == [3.0, 4.0, 5.0]  # 3 tokens right, 5 wrong


def test_the_summary_table_puts_start_beside_trained():
    row = lambda t, p, r, n=10: {"temperature": t, "pass@1": p, "reward_mean": r, "response_length": 4.0, "n": n}
    record = {"start": {"temperatures": [row(0.0, 0.5, 0.5), row(1.0, 0.3, 0.3)]},
              "trained": {"temperatures": [row(0.0, 0.7, 0.7), row(1.0, 0.6, 0.6)]}}
    lines = diagnostics_lines(record)
    assert lines[0] == "| temperature | pass@1 start | pass@1 trained | length start | length trained |"
    assert lines[2:4] == ["| 0 | 50.0% | 70.0% | 4.0 | 4.0 |", "| 1 | 30.0% | 60.0% | 4.0 | 4.0 |"]
    # a graded verifier's mean reward differs from pass@1: then it gets its own columns
    record["trained"]["temperatures"][1]["reward_mean"] = 0.75
    assert diagnostics_lines(record)[3] == "| 1 | 30.0% | 60.0% | 0.300 | 0.750 | 4.0 | 4.0 |"


# ------------------------------------------------------------------ settings refused before the run


def config(**preference):
    return from_dict(TrainConfig, {"rl": {"algo": "dpo", "preference": preference}})


@pytest.mark.parametrize("preference, message", [
    ({"eval_temperatures": "0,hot"}, r"rl.preference.eval_temperatures='0,hot'.*non-negative numbers"),
    ({"eval_temperatures": "-1"}, "rl.preference.eval_temperatures"),
    ({"ood_level": 4, "ood_path": "x.jsonl"}, r"rl.preference.ood_path='x.jsonl'.*one out-of-distribution set"),
    ({"ood_level": 9}, "level"),
    ({"diagnostic_prompts": 0}, "rl.preference.diagnostic_prompts"),
    ({"ood_level": 3}, r"ood_level=3 is a level the run trains on \(3\)"),
])
def test_bad_diagnostics_settings_are_refused(preference, message):
    with pytest.raises(ConfigError, match=message):
        check_config(config(**preference))


def test_diagnostics_need_a_preference_loss_and_a_task_that_can_shift():
    grpo = from_dict(TrainConfig, {"rl": {"algo": "grpo", "preference": {"eval_temperatures": "0,1"}}})
    with pytest.raises(ConfigError, match="rl.preference.eval_temperatures.*unset unless rl.algo is a preference loss"):
        check_config(grpo)
    gym = from_dict(TrainConfig, {"env": {"name": "reasoning_gym:chain_sum"}, "rl": {"algo": "dpo",
                                                                                  "preference": {"ood_level": 4}}})
    with pytest.raises(ConfigError, match="ood_level=4 shifts an arithmetic task's level"):
        check_config(gym)


# ------------------------------------------------------------------ one tiny run


TINY = ["--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
        "--env.arithmetic.level", "2", "--env.cot", "false",
        "--sft.num_examples", "200", "--sft.steps", "80", "--sft.batch_size", "32", "--sft.lr", "1e-2",
        "--sft.warmup_steps", "2", "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "8",
        "--rl.sampling.temperature", "1.5", "--rl.eval_every", "2", "--rl.dev_size", "8", "--heldout_size", "16",
        "--threads", "1"]


def test_a_run_balances_its_pairs_and_reports_temperatures_and_ood(tmp_path):
    out = tmp_path / "out"
    assert main(["train", *TINY, "--algo", "dpo", "--rl.steps", "4", "--rl.preference.pair_prompts", "48",
                 "--rl.preference.balance_lengths", "true", "--rl.preference.balance_topics", "true",
                 "--rl.preference.max_pairs_per_prompt", "2",
                 "--rl.preference.eval_temperatures", "0,1", "--rl.preference.ood_level", "3",
                 "--rl.preference.diagnostic_prompts", "12", "--out_dir", str(out)]) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    balance = json.loads((run / "pref_pair_balance.json").read_text())["0"]
    rounds = json.loads((run / "pref_rounds.json").read_text())["0"]
    lengths = balance["lengths"]
    assert lengths.get(LONGER, {"kept": 0})["kept"] == lengths.get(SHORTER, {"kept": 0})["kept"]
    kept = sum(n["kept"] for n in lengths.values())
    assert kept == rounds["pairs"] == len((run / "pairs.jsonl").read_text().splitlines())
    # prompts first: every pair built is counted there, and topics count what it kept
    assert rounds["pairs_before_balance"] == sum(n["before"] for n in balance["prompts"].values())
    assert sum(n["kept"] for n in balance["prompts"].values()) == sum(n["before"] for n in balance["topics"].values())
    trained = [json.loads(line) for line in (run / "pairs.jsonl").read_text().splitlines()]
    per_prompt = Counter(p["prompt"] for p in trained)
    assert max(per_prompt.values()) <= 2 and len({(p["prompt"], p["chosen"], p["rejected"]) for p in trained}) == len(trained)
    assert list(balance["topics"]) == ["level 2"]  # verifier-built pairs carry arithmetic's level: one topic
    record = json.loads((run / "pref_diagnostics.json").read_text())
    for policy in ("start", "trained"):
        assert [(r["temperature"], r["n"]) for r in record[policy]["temperatures"]] == [(0.0, 12), (1.0, 12)]
        assert record[policy]["ood"]["n_ood"] == 12
        # the greedy held-out row and the OOD check's held-out number are one measurement
        assert record[policy]["ood"]["heldout_pass@1"] == record[policy]["temperatures"][0]["pass@1"]
    summary = (run / "summary.md").read_text()
    assert "## Preference diagnostics" in summary and "| 0 | " in summary and "| 1 | " in summary
    assert "out-of-distribution pass@1 (greedy)" in summary
    assert json.loads((run / "summary.json").read_text())["diagnostics"] == record
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    shares = [r["template_share"] for r in rows if r.get("stage") == "pref" and "template_share" in r]
    assert len(shares) == 2 and all(0 < s <= 1 for s in shares)  # evaluated at steps 1 and 3
