"""The arithmetic environment: formats, disjoint splits, reference solutions."""

import random
from collections import Counter

import pytest

from posttrain.envs import ENVIRONMENTS, make_env
from posttrain.envs.arithmetic import (
    LEVELS,
    SPLIT_BUCKETS,
    ArithmeticEnv,
    all_expressions,
    split_of,
)
from posttrain.verifiers.final_int import SPECS
from posttrain.types import Example


def test_the_documented_example_format():
    env = ArithmeticEnv(level=3, cot=True)
    example = Example(prompt="Q: 7+5+9+3+1\n", expected_answer="25")
    assert env.solution(example) == "7+5=12,12+9=21,21+3=24,24+1=25\nFinal: 25"
    assert ArithmeticEnv(level=3, cot=False).solution(example) == "Final: 25"
    assert env.spec_version == "final_int/cot-v1"
    assert ArithmeticEnv(cot=False).spec_version == "final_int/strict-v1"


def test_level_5_chain_handles_subtraction_and_negative_sums():
    env = ArithmeticEnv(level=5)
    example = Example(prompt="Q: 2-9+3-0-8\n", expected_answer="-12")
    # 2-9=-7, -7+3=-4, -4-0=-4, -4-8=-12
    assert env.solution(example) == "2-9=-7,-7+3=-4,-4-0=-4,-4-8=-12\nFinal: -12"
    assert env.score(example, env.solution(example))["reward"] == 1.0


@pytest.mark.parametrize("level", list(LEVELS))
def test_examples_match_their_level(level):
    env = ArithmeticEnv(level=level)
    shape = LEVELS[level]
    for example in env.sample("train", 200, seed=1):
        terms, ops = example.meta["terms"], example.meta["ops"]
        assert len(terms) == shape.n_terms and all(0 <= t <= shape.max_term for t in terms)
        assert set(ops) <= ({"+", "-"} if shape.allow_minus else {"+"})
        expression = example.prompt[len("Q: ") : -1]
        assert example.id == f"arith-L{level}-{expression}"
        assert example.meta["level"] == level and example.meta["split"] == "train"
        # Independent check of the answer: Python's own evaluation of the expression.
        assert example.expected_answer == str(eval(expression))


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("cot", [True, False])
def test_every_reference_solution_scores_1(level, cot):
    env = ArithmeticEnv(level=level, cot=cot)
    for split in SPLIT_BUCKETS:
        for example in env.sample(split, 100, seed=2):
            result = env.score(example, env.solution(example))
            assert result["reward"] == 1.0, (example, result)


@pytest.mark.parametrize("version", [v for v in SPECS if v.startswith("hackable/")])
def test_hackable_specs_accept_the_cot_solutions_too(version):
    env = ArithmeticEnv(spec_version=version)
    assert not env.honest
    for example in env.sample("train", 50, seed=3):
        assert env.score(example, env.solution(example))["reward"] == 1.0


@pytest.mark.parametrize("level", [1, 2])
def test_splits_partition_small_levels_exhaustively(level):
    env = ArithmeticEnv(level=level)
    every = set(all_expressions(level))
    assert len(every) == LEVELS[level].n_problems
    ids = {}
    for split in SPLIT_BUCKETS:
        size = sum(split_of(e) == split for e in every)
        ids[split] = {x.id for x in env.fixed_set(split, size)}  # the whole split
        assert len(ids[split]) == size  # distinct
    assert not ids["train"] & ids["dev"]
    assert not ids["train"] & ids["heldout"]
    assert not ids["dev"] & ids["heldout"]
    assert len(ids["train"] | ids["dev"] | ids["heldout"]) == len(every)


def test_splits_never_overlap_on_large_level_3_samples():
    env = ArithmeticEnv(level=3)
    train = {x.id for x in env.sample("train", 20_000, seed=0)}
    dev = {x.id for x in env.sample("dev", 3_000, seed=0)}
    heldout = {x.id for x in env.fixed_set("heldout", 3_000)}
    assert not train & dev and not train & heldout and not dev & heldout


def test_split_sizes_are_roughly_80_10_10():
    rng = random.Random(0)
    counts = {split: 0 for split in SPLIT_BUCKETS}
    for _ in range(20_000):
        counts[split_of("+".join(str(rng.randint(0, 99)) for _ in range(5)))] += 1
    # binomial std for p=0.1, n=20000 is ~42, so ±300 is ~7 std: fails only on a real bug
    assert abs(counts["train"] - 16_000) < 300 and abs(counts["heldout"] - 2_000) < 300


def test_split_is_a_stable_hash_not_pythons_salted_hash():
    # Pinned values: if these change, every saved held-out set silently changed too.
    # sha256 buckets: 7+5+9+3+1 -> 81, 0+0+0+0+0 -> 91, 1+2 -> 56
    pinned = {"7+5+9+3+1": "dev", "0+0+0+0+0": "heldout", "1+2": "train"}
    assert {expression: split_of(expression) for expression in pinned} == pinned
    assert ArithmeticEnv().fixed_set("heldout", 3)[0].id == "arith-L3-9+7+8+5+2"


def test_fixed_set_is_deterministic_distinct_and_nested():
    env = ArithmeticEnv(level=4)  # sampled, not enumerated
    first = env.fixed_set("heldout", 300, seed=0)
    assert first == ArithmeticEnv(level=4, seed=99).fixed_set("heldout", 300, seed=0)
    assert len({x.id for x in first}) == 300
    assert env.fixed_set("heldout", 100, seed=0) == first[:100]
    assert env.fixed_set("heldout", 100, seed=1) != first[:100]
    small = ArithmeticEnv(level=2)  # enumerated
    assert small.fixed_set("dev", 50) == small.fixed_set("dev", 50)
    assert small.fixed_set("dev", 20) == small.fixed_set("dev", 50)[:20]


def test_fixed_set_too_large_for_the_split_says_so():
    with pytest.raises(ValueError, match=r"'heldout' of level 1 holds only 7 .* n=10"):
        ArithmeticEnv(level=1).fixed_set("heldout", 10)


def test_sample_seed_reproduces_and_none_continues_the_env_stream():
    env = ArithmeticEnv(seed=5)
    assert env.sample("train", 20, seed=1) == ArithmeticEnv(seed=6).sample("train", 20, seed=1)
    batch_1, batch_2 = env.sample("train", 20), env.sample("train", 20)
    assert batch_1 != batch_2
    assert batch_1 == ArithmeticEnv(seed=5).sample("train", 20)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"level": 6}, r"level must be one of \[1, 2, 3, 4, 5\], got 6"),
        ({"level": True}, r"level must be one of .* got True"),
        ({"level": "3"}, r"level must be one of .* got '3'"),
        ({"cot": "yes"}, r"cot must be one of \[True, False\], got 'yes'"),
        ({"seed": 1.5}, r"seed must be an int, got 1.5"),
        ({"spec_version": "strict"}, r"spec_version must be one of .*final_int/cot-v1.*'strict'"),
        ({"cot": True, "spec_version": "final_int/strict-v1"}, r"gives 0 .* cot=False"),
    ],
)
def test_bad_constructor_arguments_name_the_field_value_and_choices(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithmeticEnv(**kwargs)


def test_bad_split_and_count_are_rejected():
    env = ArithmeticEnv()
    expected = r"split must be one of \['train', 'dev', 'heldout'\], got 'test'"
    with pytest.raises(ValueError, match=expected):
        env.sample("test", 3)
    with pytest.raises(ValueError, match="n must be a non-negative int, got -1"):
        env.fixed_set("dev", -1)


def test_name_and_registry():
    assert ArithmeticEnv(level=2).name == "arithmetic-L2-cot"
    assert ArithmeticEnv(level=2, cot=False).name == "arithmetic-L2"
    assert ENVIRONMENTS["arithmetic"] is ArithmeticEnv
    assert make_env("arithmetic", level=2, cot=False).spec_version == "final_int/strict-v1"
    with pytest.raises(ValueError, match="unknown environment 'arith'; valid names: arithmetic"):
        make_env("arith")
    expected = r"no parameter\(s\) \['levle'\]; valid parameters: level, cot, seed, spec_version, levels"
    with pytest.raises(ValueError, match=expected):
        make_env("arithmetic", levle=2)


def test_a_mixed_task_draws_its_levels_uniformly_and_labels_each_example():
    env = ArithmeticEnv(levels="2,5")
    examples = env.sample("train", 2000, seed=0)
    levels = Counter(e.meta["level"] for e in examples)
    assert set(levels) == {2, 5} and abs(levels[2] - 1000) < 5 * 22  # binomial std sqrt(2000/4) ~ 22
    assert all(e.meta["split"] == "train" and e.id.startswith(f"arith-L{e.meta['level']}-") for e in examples)
    assert all(env.score(e, env.solution(e))["reward"] == 1.0 for e in examples[:50])
    assert env.name == "arithmetic-L2+5-cot" and "levels='2,5'" in repr(env)


def test_a_mixed_fixed_set_takes_the_levels_in_turn_distinct_and_nested():
    env = ArithmeticEnv(levels="1,3")
    heldout = env.fixed_set("heldout", 20)
    # level 1 holds 7 held-out problems: they come in turn with level 3's, then level 3 fills the rest
    assert [e.meta["level"] for e in heldout] == [1, 3] * 7 + [3] * 6
    assert heldout[::2][:7] == ArithmeticEnv(level=1).fixed_set("heldout", 7)
    assert [e for e in heldout if e.meta["level"] == 3] == ArithmeticEnv(level=3).fixed_set("heldout", 13)
    assert len({e.prompt for e in heldout}) == 20 and env.fixed_set("heldout", 9) == heldout[:9]
    with pytest.raises(ValueError, match=r"split 'heldout' of levels \[1, 2\] holds only 110 distinct problems"):
        ArithmeticEnv(levels="1,2").fixed_set("heldout", 111)


def test_one_level_draws_exactly_as_before():
    # pinned from the code before mixed tasks existed: one level draws no level, so its stream is unchanged
    assert [e.prompt for e in ArithmeticEnv(levels="3").sample("train", 3, seed=0)] == [
        "Q: 5+9+3+8+2\n", "Q: 8+9+2+4+1\n", "Q: 5+6+5+9+3\n"]
    assert [e.prompt for e in ArithmeticEnv(level=5).sample("dev", 3, seed=4)] == [
        "Q: 5+1+9+5-6\n", "Q: 1+6-3-7-4\n", "Q: 0+1-8+4+6\n"]


@pytest.mark.parametrize("kwargs, message", [
    ({"levels": "2,6"}, r"levels must list distinct levels of \[1, 2, 3, 4, 5\].*got '2,6'"),
    ({"levels": "2,2"}, r"levels must list distinct levels"),
    ({"levels": "2,3", "level": 4}, r"give level \(4\) or levels \('2,3'\), not both"),
])
def test_bad_levels_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ArithmeticEnv(**kwargs)
