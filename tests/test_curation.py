"""The curated prompt pool (posttrain/data/curation.py): the pass-rate band on hand-made
pass rates, the curriculum's draw frequencies against its formula, the easy → hard
schedule, online filtering, the state a checkpoint saves, topic balance counted by hand; and
the measurement pass (pipelines/curation.py) on a stub engine whose answers are known."""

import dataclasses
import json
import math

import pytest

from posttrain.config import ConfigError, CurationConfig, TrainConfig
from posttrain.data.curation import KEPT, PromptPool, band_verdict, cap_topics, curriculum_weights, unlocked_labels
from posttrain.pipelines.curation import build_pool, measure_pass_rates, summary_line
from posttrain.types import Episode, Example


def pool_of(n, levels=None, **settings):
    levels = levels or [1] * n
    examples = [Example(prompt=f"Q: {i}+0\n", expected_answer=str(i), id=f"p{i}", meta={"level": level})
                for i, level in enumerate(levels)]
    return PromptPool(examples, seed=0, steps=settings.pop("steps", 10), **settings)


def group(pool, i, passes, tries, group_id):
    """`tries` scored episodes of pool prompt i, the first `passes` solved."""
    return [Episode(example=pool.examples[i], group_id=group_id, prompt_ids=[1], response_ids=[2], response_logp=[0.0],
                    completion="", reward=float(j < passes), details={}) for j in range(tries)]


def test_band_verdicts_worked_by_hand():
    band = (1 / 8, 7 / 8)  # drop the solved and the hopeless
    assert [band_verdict(p, 8, *band) for p in (0, 1, 4, 7, 8)] == ["hopeless", KEPT, KEPT, KEPT, "solved"]
    assert [band_verdict(p, 8, 0.25, 0.75) for p in (1, 2, 6, 7)] == ["too hard", KEPT, KEPT, "too easy"]
    assert [band_verdict(p, 8, 0.0, 0.0) for p in (0, 1)] == [KEPT, "too easy"]  # keep only what fails 8 of 8


def test_the_filter_keeps_what_the_band_holds_and_draws_nothing_else():
    pool = pool_of(9, band=(1 / 8, 7 / 8))
    pool.set_measurement(list(range(9)), 8)  # pass counts 0/8 .. 8/8
    assert pool.status == ["hopeless"] + [KEPT] * 7 + ["solved"]
    probabilities = pool.probabilities(0)
    assert probabilities[0] == probabilities[8] == 0 and probabilities[1:8] == pytest.approx([1 / 7] * 7)
    drawn = {e.prompt for step in range(50) for e in pool.draw(step, 0, 8)}
    assert drawn == {e.prompt for e in pool.examples[1:8]}
    # the "fails k of k" band
    hardest = pool_of(9, band=(0.0, 0.0))
    hardest.set_measurement(list(range(9)), 8)
    assert [i for i, s in enumerate(hardest.status) if s == KEPT] == [0]


def test_curriculum_weights_worked_by_hand():
    rates = [0.0, 0.25, 0.5, 1.0, None]
    assert curriculum_weights("failure", rates) == [1.0, 0.75, 0.5, 0.0, 1.0]
    assert curriculum_weights("signal", rates) == [0.0, 0.1875, 0.25, 0.0, 0.25]
    assert curriculum_weights("uniform", rates) == [1.0] * 5
    pool = pool_of(5, weights="failure")
    pool.set_measurement([0, 2, 4, 6, 8], 8)  # weights 1, .75, .5, .25, 0 over a total of 2.5
    assert pool.probabilities(0) == pytest.approx([0.4, 0.3, 0.2, 0.1, 0.0])
    pool = pool_of(5, weights="signal")
    pool.set_measurement([0, 2, 4, 6, 8], 8)  # weights 0, 3/16, 4/16, 3/16, 0 over a total of 10/16
    assert pool.probabilities(0) == pytest.approx([0.0, 0.3, 0.4, 0.3, 0.0])


@pytest.mark.parametrize("weights, formula", [("failure", lambda p: 1 - p), ("signal", lambda p: p * (1 - p))])
def test_curriculum_draw_frequencies_match_the_formula(weights, formula):
    """P(prompt) ∝ 1 − pass rate (or p(1 − p)), inside the band, over 100,000 draws of 1,000
    steps. The tolerance: each prompt's frequency within 5 standard errors, sqrt(P(1 − P) / N),
    of its probability (a false alarm about once in 1.7 million per prompt), and a prompt of
    probability 0 never drawn."""
    pool = pool_of(8, weights=weights, band=(0.0, 7 / 8))
    passes = [0, 1, 2, 3, 5, 6, 7, 8]  # the last is solved: out of the band
    pool.set_measurement(passes, 8)
    expected = [formula(p / 8) for p in passes[:-1]] + [0.0]
    expected = [w / sum(expected) for w in expected]
    assert pool.probabilities(0) == pytest.approx(expected)
    counts = [0] * 8
    for step in range(1000):
        for example in pool.draw(step, 0, 100):
            counts[pool.index[example.prompt]] += 1
    N = sum(counts)
    for count, p in zip(counts, expected):
        assert abs(count / N - p) <= 5 * math.sqrt(p * (1 - p) / N), (counts, expected)
    assert all(count == 0 for count, p in zip(counts, expected) if p == 0)
    assert sum(pool.draws) == N  # what the record reports


def test_the_uniform_draw_is_uniform_over_the_kept_prompts():
    pool = pool_of(4, band=(0.5, 1.0))
    pool.set_measurement([8, 8, 1, 4], 8)
    counts = [0] * 4
    for step in range(500):
        for example in pool.draw(step, 0, 40):
            counts[pool.index[example.prompt]] += 1
    N, p = sum(counts), 1 / 3
    assert counts[2] == 0
    assert all(abs(counts[i] / N - p) <= 5 * math.sqrt(p * (1 - p) / N) for i in (0, 1, 3)), counts


def test_easy_to_hard_unlocks_one_label_per_stage():
    assert [unlocked_labels([1, 2, 3], step, 9) for step in range(9)] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [unlocked_labels([1, 2, 3], step, 10) for step in range(10)] == [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    pool = pool_of(6, levels=[3, 1, 2, 1, 3, 2], order="easy_to_hard", steps=9)
    assert pool.unlocked(0) == [1, 3] and pool.unlocked(4) == [1, 2, 3, 5] and pool.unlocked(8) == list(range(6))
    for step, allowed in ((2, {1}), (5, {1, 2}), (8, {1, 2, 3})):
        assert {e.meta["level"] for e in pool.draw(step, 0, 60)} == allowed
        assert pool.step_metrics(step)["curation/hardest_unlocked"] == max(allowed)
    with pytest.raises(ValueError, match=r"needs a difficulty label on every prompt .* 'Q: 0\+0' has none"):
        PromptPool([Example("Q: 0+0\n", "0")], seed=0, steps=4, order="easy_to_hard")


def test_online_filtering_drops_groups_and_prompts_outside_the_band():
    pool = pool_of(3, band=(1 / 4, 3 / 4), online=True)
    pool.set_measurement([2, 2, 2], 4)
    episodes = group(pool, 0, 4, 4, group_id=0) + group(pool, 1, 2, 4, group_id=1) + group(pool, 2, 0, 4, group_id=5)
    assert pool.keep_groups(episodes) == {1}
    pool.observe(3, episodes)
    assert pool.status == ["solved", KEPT, "hopeless"] and pool.changed_at == [3, -1, 3]
    assert pool.dropped_online == 2 and pool.measured[0].rate == 1.0
    assert [e.prompt for e in pool.draw(4, 0, 5)] == [pool.examples[1].prompt] * 5
    # a re-measurement brings a prompt back
    pool.set_measurement([1, 2, 3], 4, step=6)
    assert pool.status == [KEPT] * 3 and pool.first[0].step == -1  # the first measurement stays on record


def test_offline_the_band_holds_and_observations_only_update_the_weights():
    pool = pool_of(2, band=(1 / 4, 3 / 4), weights="failure")
    pool.set_measurement([2, 2], 4)
    episodes = group(pool, 0, 4, 4, group_id=0) + group(pool, 1, 1, 4, group_id=1)
    assert pool.keep_groups(episodes) == {0, 1}
    pool.observe(0, episodes)
    assert pool.status == [KEPT, KEPT] and pool.dropped_online == 0
    assert pool.probabilities(1) == pytest.approx([0.0, 1.0])  # prompt 0 now solved: weight 1 − 1 = 0


def test_with_nothing_in_the_band_every_unlocked_prompt_is_drawn():
    pool = pool_of(3, band=(1 / 4, 3 / 4), online=True)
    pool.set_measurement([0, 4, 4], 4)
    assert pool.probabilities(0) == pytest.approx([1 / 3] * 3)
    pool.draw(0, 0, 2)
    assert pool.fallback_steps == 1


def test_the_state_a_checkpoint_saves_makes_the_next_draws_equal():
    def used(pool):
        pool.set_measurement([1, 2, 3, 0], 4)
        pool.draw(0, 0, 4)
        pool.observe(0, group(pool, 0, 4, 4, 0) + group(pool, 2, 2, 4, 1))
        return pool

    settings = dict(band=(1 / 4, 3 / 4), online=True, weights="failure")
    saved = used(pool_of(4, **settings)).state_dict()
    a, b, fresh = used(pool_of(4, **settings)), pool_of(4, **settings), used(pool_of(4, **settings))
    b.load_state_dict(saved)
    assert [e.prompt for e in a.draw(1, 0, 50)] == [e.prompt for e in b.draw(1, 0, 50)]
    assert a.state_dict() == b.state_dict()
    fresh.status = [KEPT] * 4  # the pool as measured, without what step 0 observed: other draws
    assert [e.prompt for e in a.draw(2, 0, 50)] != [e.prompt for e in fresh.draw(2, 0, 50)]
    other = PromptPool(list(reversed(a.examples)), seed=0, steps=10)
    with pytest.raises(ValueError, match="not the pool this run built"):
        other.load_state_dict(saved)


class StubEngine:
    """Answers prompt "Q: i+0" right in the first (i mod 5) of its k samples: known pass counts."""

    max_rows = 12  # 3 groups of 4 per batch: the 10 prompts below take 4 batches

    def __init__(self):
        self.batches = []

    def generate(self, examples, k, generator):
        self.batches.append(len(examples))
        return [Episode(example=e, group_id=g, prompt_ids=[1], response_ids=[2], response_logp=[0.0],
                        completion=e.expected_answer if j < int(e.expected_answer) % 5 else "wrong")
                for g, e in enumerate(examples) for j in range(k)]


class ExactEnv:
    def score(self, example, completion):
        return {"reward": float(completion == example.expected_answer), "details": {}}


def test_measure_pass_rates_counts_each_prompt_across_batches():
    engine, pool = StubEngine(), pool_of(10)
    assert measure_pass_rates(engine, ExactEnv(), pool.examples, 4, seed=0) == [i % 5 for i in range(10)]
    assert engine.batches == [3, 3, 3, 1]


@pytest.mark.parametrize("settings, message", [
    ({"pool_size": 0, "weights": "failure"}, r"rl.curation.pool_size=0 .* with rl.curation.weights set"),
    ({"pool_size": 10, "online": True}, r"rl.curation.online=True .* unless a band is set"),
    ({"pool_size": 10, "online": True, "max_pass_rate": 0.0}, r"keeps only groups whose samples all scored alike"),
    ({"pool_size": 10, "min_pass_rate": 0.8, "max_pass_rate": 0.2}, r"0 <= min_pass_rate <= max_pass_rate=0.2"),
    ({"pool_size": 10, "remeasure_every": 5}, r"remeasure_every=5 .* 0 unless pass rates are read"),
    ({"pool_size": 10, "order": "hard_to_easy"}, r"rl.curation.order='hard_to_easy' .* \['none', 'easy_to_hard'\]"),
    ({"pool_size": 0, "balance_topics": True}, r"rl.curation.pool_size=0 .* with rl.curation.balance_topics set"),
])
def test_bad_curation_settings_are_refused_by_name(settings, message):
    with pytest.raises(ConfigError, match=message):
        CurationConfig(**settings).validate()


class TopicTask:
    """Training prompts of four sizes of topic, one that names only its level and one that names
    nothing: algebra 10, geometry 6, logic 2, "level 3" 4, "no topic" 1. One held-out and one dev
    problem, which match none of them."""

    def __init__(self, labels=True):
        sizes = {"algebra": 10, "geometry": 6, "logic": 2}
        self.train = [Example(f"{topic} problem {i}?", str(i), meta={"topic": topic} if labels else {})
                      for topic, n in sizes.items() for i in range(n)]
        self.train += [Example(f"Q: {i}+1\n", str(i + 1), meta={"level": 3} if labels else {}) for i in range(4)]
        self.train += [Example("An unlabelled riddle?", "7")]

    def fixed_set(self, split, n, seed=0):
        return self.train[:n] if split == "train" else [Example(f"held {split}", "0")]


def test_topic_balance_caps_every_topic_at_the_median_by_hand():
    # sizes 1, 2, 4, 6, 10: the median topic holds 4, so algebra keeps 4 of 10, geometry 4 of 6, the rest all
    kept, dropped = cap_topics(TopicTask().train, seed=0)
    topics = [e.meta.get("topic", "level 3" if e.meta else "none") for e in kept]
    assert {t: topics.count(t) for t in topics} == {"algebra": 4, "geometry": 4, "logic": 2, "level 3": 4, "none": 1}
    assert len(kept) == 15 and len(dropped) == 8
    assert {why for _, why in dropped} == {"topic balance: algebra held 10 prompts, capped at the median topic's 4",
                                           "topic balance: geometry held 6 prompts, capped at the median topic's 4"}
    assert [e.prompt for e in kept] == [e.prompt for e in TopicTask().train if e in kept]  # the pool's order kept
    assert cap_topics(TopicTask().train, seed=0)[0] == kept  # a seeded draw
    # an even number of topics: sizes 2, 4, 6, 10 -> the median is (4 + 6) / 2 = 5
    four = [e for e in TopicTask().train if e.meta]
    assert len(cap_topics(four, seed=1)[0]) == 5 + 5 + 2 + 4


def test_a_curated_pool_records_what_topic_balance_dropped():
    cfg = TrainConfig()
    cfg = dataclasses.replace(cfg, heldout_size=1, rl=dataclasses.replace(
        cfg.rl, dev_size=1, curation=dataclasses.replace(cfg.rl.curation, pool_size=23, balance_topics=True)))
    pool = build_pool(cfg, TopicTask())
    assert len(pool.examples) == 15 and len(pool.screened_out) == 8
    assert summary_line(pool).startswith("8 screened out (dedup, decontamination, guessable, topic balance), "
                                         "15 of 15 prompts")
    off = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, curation=dataclasses.replace(
        cfg.rl.curation, balance_topics=False)))
    assert len(build_pool(off, TopicTask()).examples) == 23
    with pytest.raises(ValueError, match="none of the 23 pool prompts names a topic"):
        build_pool(cfg, TopicTask(labels=False))


def test_an_unlabelled_pool_with_topic_balance_is_refused_before_a_run_directory_exists(tmp_path, capsys):
    """The refusal comes from the run's checks (pipelines/data_checks.py builds the pool as the
    run would), not from the RL stage after SFT has spent its compute."""
    from posttrain.cli import main

    data = tmp_path / "plain.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i}+{i + 1}?", "answer": str(2 * i + 1)}) + "\n"
                            for i in range(300)), encoding="utf-8")
    runs = tmp_path / "runs"
    code = main(["run", "--env.name", "jsonl", "--env.path", str(data), "--heldout_size", "30", "--rl.dev_size", "20",
                 "--sft.steps", "0", "--rl.curation.pool_size", "64", "--rl.curation.balance_topics", "true",
                 "--out_dir", str(runs)])
    said = capsys.readouterr()
    assert code != 0 and "none of the 64 pool prompts names a topic" in said.out + said.err
    assert not runs.exists() or not any(runs.iterdir())
