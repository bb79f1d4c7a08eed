"""reasoning-gym tasks as an environment (posttrain/envs/reasoning_gym_tasks.py) and their
graders behind our contract (posttrain/verifiers/reasoning_gym_answer.py): deterministic
splits, the grader's verdict with details, partial credit kept apart from pass@1, a
broken grader that costs a sample and never a run, clear errors, and a tiny training run."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.config import ConfigError, EnvConfig, ReasoningGymConfig
from posttrain.envs import make_env
from posttrain.envs.arithmetic import split_of
from posttrain.eval.completions import score_records
from posttrain.eval.evaluate import solved
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.data_checks import check_vocabulary
from posttrain.types import Episode
from posttrain.verifiers import get_verifier

pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'posttrain[tasks]')")

SMALL = {"min_terms": 2, "max_terms": 3, "max_digits": 1}  # ~2,900 distinct questions, ~295 held out


@pytest.fixture(scope="module")
def env():
    return make_env("reasoning_gym:chain_sum", task_config=SMALL)


def test_the_same_settings_give_the_same_problems_and_splits(env):
    again = make_env("reasoning_gym:chain_sum", task_config=json.dumps(SMALL))  # the CLI's JSON form
    heldout = env.fixed_set("heldout", 50)
    assert [e.prompt for e in heldout] == [e.prompt for e in again.fixed_set("heldout", 50)]
    assert [e.prompt for e in env.fixed_set("heldout", 20)] == [e.prompt for e in heldout[:20]]  # a prefix
    assert [e.prompt for e in env.sample("train", 30, seed=7)] == [e.prompt for e in again.sample("train", 30, seed=7)]
    assert len({e.prompt for e in heldout}) == 50  # distinct
    train = {e.prompt for e in env.fixed_set("train", 1000)}
    assert not train & {e.prompt for e in env.fixed_set("heldout", 200)}
    assert all(split_of(e.prompt) == "heldout" == e.meta["split"] for e in heldout)
    assert all(e.meta["split"] == "train" for e in env.sample("train", 100, seed=1))
    # another pool seed draws other items, and a question keeps its split whatever the seed
    other = make_env("reasoning_gym:chain_sum", task_config=SMALL, seed=1).fixed_set("heldout", 50)
    assert [e.prompt for e in other] != [e.prompt for e in heldout]
    assert all(split_of(e.prompt) == "heldout" for e in other)


def test_a_split_asked_for_more_than_it_holds_says_how_many(env):
    with pytest.raises(ValueError, match=r"holds only 29\d distinct problems .* raise pool_size"):
        env.fixed_set("heldout", 400)


def test_correct_scores_1_wrong_scores_0_with_details(env):
    example = env.fixed_set("heldout", 1)[0]
    answer = example.expected_answer
    right = env.score(example, f"the sum is {answer}\n{env.solution(example)}")
    assert right["reward"] == 1.0
    assert right["details"] | {"reason": "ok", "correct": True, "parsed": answer, "task": "chain_sum"} == right["details"]
    wrong = env.score(example, f"<answer>{int(answer) + 1}</answer>")
    assert wrong["reward"] == 0.0 and wrong["details"]["reason"] == "wrong_answer"
    assert wrong["details"]["correct"] is False and wrong["details"]["parsed"] == str(int(answer) + 1)
    untagged = env.score(example, answer)
    assert untagged["reward"] == 0.0 and untagged["details"]["reason"] == "no_answer"
    # the last pair counts, as reasoning-gym reads it
    assert env.score(example, f"<answer>x</answer> <answer>{answer}</answer>")["reward"] == 1.0


def test_partial_credit_is_the_reward_but_never_a_pass(env):
    examples = [e for e in env.fixed_set("heldout", 40) if e.expected_answer not in ("0", "1")][:4]
    completions = [
        f"<answer>{examples[0].expected_answer}</answer>",  # right: 1.0
        f"<answer>{examples[1].expected_answer}99</answer>",  # holds the answer: chain_sum pays a share
        f"<answer>7{examples[2].expected_answer}</answer>",
        "<answer>nothing</answer>",
    ]
    episodes = []
    for example, completion in zip(examples, completions):
        scored = env.score(example, completion)
        episodes.append(Episode(example, 0, [], [], [], completion, scored["reward"], scored["details"]))
    rewards = [e.reward for e in episodes]
    assert rewards[0] == 1.0 and 0 < rewards[1] < 1 and 0 < rewards[2] < 1 and rewards[3] == 0.0
    assert [e.details["reason"] for e in episodes] == ["ok", "partial", "partial", "wrong_answer"]
    pass_at_1 = sum(solved(e) for e in episodes) / len(episodes)
    mean_reward = sum(rewards) / len(rewards)
    assert pass_at_1 == 0.25 and mean_reward > 0.25 + 0.1  # the two numbers differ, as they should
    # `posttrain eval`'s report (a checkpoint's or a completions file's): its CI is the pass rate's
    records = [{"id": str(i), "prompt": e.prompt, "expected_answer": e.expected_answer, "meta": e.meta,
                "completion": c} for i, (e, c) in enumerate(zip(examples, completions))]
    report = score_records(records, "reasoning_gym/answer-tag-v1")
    assert report["pass_rate"] == report["ci"]["mean"] == 0.25
    assert report["mean_reward"] == pytest.approx(mean_reward)


def test_the_exact_spec_pays_only_full_credit(env):
    """chain_sum's grader pays a share to any reply that contains the answer: GRPO farmed it
    with "-111111..." (docs/guides/your-task.md). The exact spec keeps the grader's number in details only."""
    exact = make_env("reasoning_gym:chain_sum", task_config=SMALL, spec_version="reasoning_gym/answer-tag-exact-v1")
    example = next(e for e in env.fixed_set("heldout", 100) if e.expected_answer == "1")
    farmed = "<answer>111</answer>"
    assert env.score(example, farmed)["reward"] == pytest.approx(1 / 3)  # partial credit for a wrong answer
    scored = exact.score(example, farmed)
    assert scored["reward"] == 0.0 and scored["details"]["reason"] == "partial"
    assert scored["details"]["grader_reward"] == pytest.approx(1 / 3) and scored["details"]["correct"] is False
    assert exact.score(example, exact.solution(example))["reward"] == 1.0
    with pytest.raises(ValueError, match="cannot grade reasoning-gym items"):
        make_env("reasoning_gym:chain_sum", spec_version="final_int/cot-v1")


def test_a_grader_that_raises_or_misbehaves_scores_0_with_the_reason(env, monkeypatch):
    example = env.fixed_set("heldout", 1)[0]
    spec = get_verifier("reasoning_gym/answer-tag-v1")
    good = f"<answer>{example.expected_answer}</answer>"

    def raises(answer, entry):
        raise KeyError("metadata")

    monkeypatch.setitem(spec._graders, "chain_sum", raises)
    result = env.score(example, good)
    assert result["reward"] == 0.0 and result["details"]["reason"] == "grader_error"
    assert "score_answer raised KeyError" in result["details"]["error"] and result["details"]["correct"] is False
    for bad in (float("nan"), 2.0, -0.5, "1.0", None, True):
        monkeypatch.setitem(spec._graders, "chain_sum", lambda answer, entry, bad=bad: bad)
        result = env.score(example, good)
        assert result["reward"] == 0.0 and result["details"]["reason"] == "grader_error", bad
        assert "not a number in [0, 1]" in result["details"]["error"]
    monkeypatch.undo()
    assert env.score(example, good)["reward"] == 1.0  # control: the real grader pays


def test_a_grader_that_hangs_costs_its_sample_not_the_run(env, monkeypatch):
    """A grader stuck for longer than GRADER_TIMEOUT scores 0 with reason grader_timeout, and
    the next sample is graded at once by a fresh thread (the stuck one is abandoned)."""
    import threading
    import time

    from posttrain.verifiers import reasoning_gym_answer

    example = env.fixed_set("heldout", 1)[0]
    spec = get_verifier("reasoning_gym/answer-tag-v1")
    good = f"<answer>{example.expected_answer}</answer>"
    release = threading.Event()
    real = spec._grader("chain_sum")
    monkeypatch.setattr(reasoning_gym_answer, "GRADER_TIMEOUT", 0.2)
    monkeypatch.setitem(spec._graders, "chain_sum", lambda answer, entry: release.wait() and 1.0)
    start = time.perf_counter()
    result = env.score(example, good)
    assert time.perf_counter() - start < 2.0
    assert result["reward"] == 0.0 and result["details"]["reason"] == "grader_timeout"
    assert "did not return within 0.2 s" in result["details"]["error"] and result["details"]["correct"] is False
    monkeypatch.setitem(spec._graders, "chain_sum", real)
    assert env.score(example, good)["reward"] == 1.0  # the hung thread is not waited for
    release.set()


def test_the_contract_holds_for_bad_input(env):
    example = env.fixed_set("heldout", 1)[0]
    assert env.score(example, None)["details"]["reason"] == "not_text"
    no_entry = {"prompt": example.prompt, "expected_answer": "3", "meta": {}}
    result = get_verifier("reasoning_gym/answer-tag-v1")(no_entry, "<answer>3</answer>")
    assert result["reward"] == 0.0 and result["details"]["reason"] == "bad_entry"


def test_a_saved_sample_scores_the_same_from_its_json(env):
    """`posttrain eval --completions` reads samples back from JSON: the entry must survive."""
    spec = get_verifier("reasoning_gym/answer-tag-v1")
    for example in env.fixed_set("heldout", 5):
        record = json.loads(json.dumps({"prompt": example.prompt, "expected_answer": example.expected_answer,
                                        "meta": example.meta}))
        for completion in (env.solution(example), "<answer>1000</answer>"):
            assert spec(record, completion)["reward"] == env.score(example, completion)["reward"]


def test_names_and_settings_are_checked_with_what_to_do():
    with pytest.raises(ValueError, match=r"no task 'chain_sun'; did you mean chain_sum.*106 in all|in all: python"):
        make_env("reasoning_gym:chain_sun")
    with pytest.raises(ValueError, match="reasoning_gym:NAME"):
        make_env("reasoning_gym")
    with pytest.raises(ValueError, match=r"no setting\(s\) \['max_term'\]; its settings: min_terms, max_terms"):
        make_env("reasoning_gym:chain_sum", task_config='{"max_term": 3}')
    with pytest.raises(ValueError, match="not valid JSON"):
        make_env("reasoning_gym:chain_sum", task_config="max_terms=3")
    with pytest.raises(ValueError, match="environment 'arithmetic' takes no task"):
        make_env("arithmetic:chain_sum")
    with pytest.raises(ValueError, match="unknown environment 'reasoning-gym:chain_sum'"):
        make_env("reasoning-gym:chain_sum")
    # the CLI's settings reach the environment as keyword arguments
    cfg = EnvConfig(name="reasoning_gym:chain_sum", reasoning_gym=ReasoningGymConfig(pool_size=500, task_config=json.dumps(SMALL)))
    built = make_env(cfg.name, **cfg.kwargs())
    assert built.pool_size == 500 and built.task_config == SMALL and built.name == "reasoning_gym:chain_sum"
    with pytest.raises(ValueError, match="has no parameter"):
        make_env("arithmetic", **EnvConfig(reasoning_gym=ReasoningGymConfig(pool_size=500)).kwargs())


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'posttrain\[tasks\]'"):
        make_env("reasoning_gym:chain_sum")


def test_gpt_minis_vocabulary_refuses_what_it_cannot_read():
    env = make_env("reasoning_gym:emoji_mystery", pool_size=20)
    examples = env.fixed_set("train", 3)
    with pytest.raises(ConfigError, match="character tokenizer cannot encode"):
        check_vocabulary(CharTokenizer(), examples, [])
    ascii_env = make_env("reasoning_gym:chain_sum", task_config=SMALL)
    fine = ascii_env.fixed_set("train", 20)
    check_vocabulary(CharTokenizer(), fine, [ascii_env.solution(e) for e in fine])  # control: no error


TINY = ["--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
        "--model.max_seq_len", "144", "--rl.sampling.max_new_tokens", "20",
        "--sft.num_examples", "32", "--sft.steps", "30", "--sft.batch_size", "16", "--sft.warmup_steps", "2",
        "--sft.lr", "3e-3", "--rl.steps", "2", "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4",
        "--rl.dev_size", "8", "--heldout_size", "16", "--threads", "1"]


def test_train_runs_sft_then_grpo_on_a_reasoning_gym_task(tmp_path):
    command = [sys.executable, "-m", "posttrain", "train", "--env.name", "reasoning_gym:chain_sum",
               "--env.reasoning_gym.task_config", json.dumps(SMALL), *TINY, "--out_dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    run = next(p for p in Path(tmp_path).iterdir() if p.is_dir())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    sft = [r["loss"] for r in rows if r.get("stage") == "sft"]
    # from ln(100 characters) = 4.6, a uniform guess, to ~2.4 at seed 0: the demonstrations (the items'
    # answers in tags) are being learnt
    assert len(sft) == 30 and sft[0] == pytest.approx(math.log(100), abs=0.2) and sft[-1] < 0.6 * sft[0]
    rl = [r for r in rows if r.get("stage") == "rl" and "reward_mean" in r]
    assert len(rl) == 2 and all(0.0 <= r["reward_mean"] <= 1.0 for r in rl)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["details"]["spec_version"] == "reasoning_gym/answer-tag-v1" for s in samples)
    assert all(s["details"]["task"] == "chain_sum" for s in samples)
    meta = json.loads((run / "meta.json").read_text())
    assert meta["spec_version"] == "reasoning_gym/answer-tag-v1"
