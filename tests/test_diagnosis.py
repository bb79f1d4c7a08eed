"""A run that cannot learn is refused before it starts or named while it runs: a generation
budget shorter than the answers, each reward term logged and watched on its own, partial
credit stated, evaluation sets too small to measure, and `posttrain doctor` on a run
directory (runs/diagnosis.py, pipelines/data_checks.py)."""

import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.envs import make_env
from posttrain.pipelines.data_checks import partial_credit
from posttrain.rewards.stack import Accuracy, RewardStack
from posttrain.runs.diagnosis import LiveDiagnosis, diagnose, step_samples
from posttrain.runs.monitors import check_all, entropy_blowup, no_learning_signal, truncation
from posttrain.types import Episode, Example

# tests/fixtures/run_cut_at_budget is config.json, metrics.jsonl and samples.jsonl of this run:
# `posttrain train *CUT`, SFT teaching a ~40-character chain of thought that a 12-character budget cuts
CUT = ["--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
       "--sft.num_examples", "64", "--sft.steps", "60", "--sft.lr", "3e-3", "--sft.batch_size", "8",
       "--sft.warmup_steps", "2", "--rl.steps", "6", "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4",
       "--rl.eval_every", "5", "--rl.dev_size", "8", "--heldout_size", "16", "--checkpoint_every", "5",
       "--threads", "1", "--rl.sampling.max_new_tokens", "12"]
FIXTURE = Path(__file__).parent / "fixtures" / "run_cut_at_budget"


def brevity(prompts, completions, **columns):
    """TRL: 1 - len/48 for each completion: paid for being short, the term the issue saw gamed."""
    return [1 - len(c) / 48 for c in completions]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- before the run: the budget against the answers ------------------------------------------


def test_a_gcd_budget_shorter_than_its_answers_is_refused_naming_their_length(capsys, tmp_path):
    # gcd's demonstrations are "<answer>N</answer>", 17 characters and N's digits; the longest of the
    # 150 SFT demonstrations has 3 digits: 20 characters, 21 with EOS (gpt_mini: one token a character)
    demos = make_env("reasoning_gym:gcd").fixed_set("train", 150, seed=0)
    assert max(len(f"<answer>{e.expected_answer}</answer>") for e in demos) + 1 == 21
    argv = ["train", "--env.name", "reasoning_gym:gcd", "--rl.sampling.max_new_tokens", "16", "--dry_run", "true",
            "--out_dir", str(tmp_path)]
    assert main(argv) == 2
    err = " ".join(capsys.readouterr().err.split())
    # gpt_mini's 96 positions do not hold gcd's 146-character prompts either: one message names both lengths
    assert "takes 21 characters (gpt_mini's tokenizer: one token a character) with its EOS" in err
    assert "give --model.max_seq_len 167 and --rl.sampling.max_new_tokens 21" in err
    assert main([*argv, "--model.max_seq_len", "256"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "rl.sampling.max_new_tokens=16 is not allowed: expected at least 21" in err
    assert "'<answer>116</answer>', takes 21 characters" in err and "150 of the 150 do not fit in 16" in err
    assert main([*argv[:4], "21", *argv[5:], "--model.max_seq_len", "256"]) == 0  # the length named passes
    printed = capsys.readouterr().out
    assert "checked answer length: the longest answer the verifier reads, '<answer>116</answer>', takes 21" in printed
    # gcd's grader pays the default partial credit, len(answer)/len(reply): stated, with the one flag
    assert ("checked warning: partial credit: reasoning_gym/answer-tag-v1 pays 0.5 for the wrong answer '11' (the "
            "answer is '1')") in printed and "--env.spec_version reasoning_gym/answer-tag-exact-v1" in printed


def test_a_chain_of_thought_needs_only_its_answer_line_to_fit(capsys, tmp_path):
    # the arithmetic demonstrations are ~40 characters of work, then "Final: N": the answer line alone
    # earns full credit, so the budget must fit it (N <= 45 at level 3: 9 characters and EOS), not the work
    env = make_env("arithmetic")
    demos = env.fixed_set("train", 150, seed=0)
    assert max(len(f"Final: {e.expected_answer}") for e in demos) + 1 == 10
    out = ["--out_dir", str(tmp_path), "--dry_run", "true"]
    assert main(["train", "--rl.sampling.max_new_tokens", "9", *out]) == 2
    assert "expected at least 10" in capsys.readouterr().err
    assert main(["train", "--rl.sampling.max_new_tokens", "10", *out]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "150 of the 150 SFT demonstrations are longer than rl.sampling.max_new_tokens (10)" in printed
    # without SFT the task's own solutions stand in; a preference loss trained on a file of pairs is not
    # refused (it does not learn from what it samples)
    assert main(["train", "--sft.steps", "0", "--rl.sampling.max_new_tokens", "9", *out]) == 2
    assert "the longest of the 64 solutions of the task" in " ".join(capsys.readouterr().err.split())


# --- while it runs: truncation named, once, and `posttrain doctor` says the same -----------------


def test_a_run_whose_samples_are_cut_is_diagnosed_as_truncated(tmp_path, capsys):
    assert main(["train", *CUT, "--out_dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    first = json.loads((run / "summary.json").read_text())["diagnosis"][0]
    assert first["cause"] == "truncation" and first["evidence"]["max_new_tokens"] == 12
    # worked from the samples: the share cut in the 5 steps to the one it names (the fixture's run, made
    # here: 68 of the 80 samples of steps 0-4, 0.85)
    window = [s for s in read(run / "samples.jsonl") if first["step"] - 5 < s["step"] <= first["step"]]
    cut = sum(not s["finished"] for s in window) / len(window)
    assert cut > 0.5 and first["evidence"]["truncated_fraction"] == pytest.approx(cut)
    assert first["evidence"]["secondary"] == 0.0  # the few that ended within 12 characters are not evidence
    printed = capsys.readouterr().out
    assert printed.count(f"diagnosis truncation (step {first['step']})") == 1  # printed as it ran, once
    assert "## Diagnosis" in (run / "summary.md").read_text()


def test_doctor_names_the_causes_of_a_run_directory(capsys):
    assert main(["doctor", str(FIXTURE)]) == 1  # 1: a cause was named
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "rl: 6 steps, 96 samples: 3 causes, the earliest first"
    assert lines[2].startswith("- truncation (step 4): 85% of the samples of the 5 steps to 4 were cut at the "
                               "generation budget of 12 before they ended")
    assert lines[2].endswith("Change: rl.sampling.max_new_tokens (now 12): raise it to fit the answers (posttrain "
                             "train ... --dry_run true names the length the demonstrations need)")
    assert lines[3].startswith("- format_never_matched (step 4): none of the 80 samples of steps 0-4")
    assert lines[4].startswith("- no_variance (step 4)") and "(0% solved, 85% cut)" in lines[4]
    assert main(["doctor", str(FIXTURE), "--stage", "sft"]) == 0  # SFT's steps: nothing to diagnose
    assert "nothing found" in capsys.readouterr().out
    assert main(["doctor", str(FIXTURE), "--stage", "grpo"]) == 2
    assert "stage='grpo' is not allowed" in capsys.readouterr().err


# --- every reward term on its own --------------------------------------------------------------


def test_term_means_are_each_terms_share_of_the_reward():
    example = Example("Q: 1+1\n", "2")
    stack = RewardStack([(1.0, Accuracy()), (0.5, Accuracy(name="copy"))])
    episodes = []
    for reward in (1.0, 0.0, 0.0, 1.0):
        episode = Episode(example=example, group_id=0, prompt_ids=[1], response_ids=[2], response_logp=[0.0])
        scored = stack(example, "", {"reward": reward, "details": {}})
        episode.reward, episode.details = scored["reward"], scored["details"]
        episodes.append(episode)
    # accuracy: 2 of 4 right, 0.5 a sample; copy: half of that. Together the mean reward, 0.75
    assert stack.term_means(episodes) == {"reward/accuracy": 0.5, "reward/copy": 0.25}


def test_a_brevity_term_is_logged_apart_from_accuracy(tmp_path):
    terms = "accuracy + 0.5*tests.test_diagnosis:brevity"
    assert main(["train", *CUT[:-2], "--sft.steps", "0", "--rl.steps", "3", "--rl.reward.terms", terms,
                 "--out_dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    rows = [r for r in read(run / "metrics.jsonl") if r["stage"] == "rl"]
    samples = read(run / "samples.jsonl")
    for row in rows:
        mine = [s for s in samples if s["step"] == row["step"]]
        # worked from the samples: the function on each completion, the verifier's verdict of each
        assert row["reward/tests.test_diagnosis:brevity"] == pytest.approx(
            0.5 * sum(1 - len(s["completion"]) / 48 for s in mine) / len(mine))
        assert row["reward/accuracy"] == sum(s["details"]["components"]["accuracy"] for s in mine) / len(mine)
        assert row["reward/accuracy"] + row["reward/tests.test_diagnosis:brevity"] == pytest.approx(row["reward_mean"])
    assert (run / "rl_metrics.png").stat().st_size > 5_000  # with the terms' panel
    assert "| start |" in (run / "summary.md").read_text()  # no SFT ran: the first row is the start, not "sft"


def gamed_rows() -> list[dict]:
    """The issue's gamed brevity term: accuracy pays 0.125 a sample, brevity 0.1, until step 10,
    then accuracy 0 and brevity 0.45; dev pass@1 0.13 at steps 4 and 9, 0 from step 14."""
    rows = []
    for step in range(20):
        accuracy, brief = (0.125, 0.1) if step < 10 else (0.0, 0.45)
        rows.append({"step": step, "reward/accuracy": accuracy, "reward/brevity": brief,
                     "reward_mean": accuracy + brief, **({"dev_pass@1": 0.13 if step < 10 else 0.0}
                                                         if step % 5 == 4 else {})})
    return rows


def test_the_hacking_alerts_watch_each_term_against_dev_pass_at_1():
    alerts = [a for a in check_all(gamed_rows()) if a["monitor"] == "proxy_gold_divergence"]
    # at step 14 dev pass@1 is 0.13 below its best (step 4), and the sum (0.225 -> 0.45) and brevity
    # (0.1 -> 0.45) are above where they were then; accuracy (0.125 -> 0) fell with it
    assert [(a["step"], a["message"].split(" while ")[1].split(" (")[0]) for a in alerts] == [
        (14, "reward_mean"), (14, "reward/brevity")]
    findings = {(f.cause, f.subject): f for f in diagnose(gamed_rows(), {})}
    collapse = findings["term_collapse", "accuracy"]
    # 5-step means of accuracy: 0.125 to step 9, then 0.1, 0.075, 0.05 and 0.025 at step 13: a fifth of
    # its best, below the quarter line; brevity's mean rose from 0.1 to 0.38 meanwhile
    assert (collapse.step, collapse.evidence) == (13, {"best": 0.125, "best_step": 4, "now": pytest.approx(0.025)})
    assert collapse.message == "accuracy fell from 0.125 (mean of the 5 steps to 4) to 0.025 while brevity rose"
    assert collapse.setting.startswith("rl.reward.terms: lower the weight of brevity")
    assert findings["reward_up_heldout_down", "brevity"].step == 14
    assert findings["reward_up_heldout_down", "brevity"].setting.startswith("rl.reward.terms: lower brevity's weight")


# --- the monitors the diagnosis builds on ------------------------------------------------------


def test_truncation_fires_on_the_window_mean_and_names_the_budget():
    rows = [{"step": s, "truncated_fraction": f} for s, f in enumerate([0.0, 0.1, 0.2, 0.3, 0.5, 0.6, 0.0])]
    # 5-step means: 0.22 at step 4, 0.34 at 5 (over 0.25), 0.32 at 6
    (alert,) = truncation(rows)
    assert (alert["step"], alert["value"]) == (5, pytest.approx(0.34))
    flat = [{"step": s, "zero_variance_groups": 1.0, "reward_mean": 0.0, "truncated_fraction": 0.99} for s in range(5)]
    (quiet,) = no_learning_signal(flat)
    assert "99% of them were cut at the generation budget" in quiet["message"]
    assert "use prompts nearer" not in quiet["message"]  # not the easier-prompts advice: the budget decided


def test_entropy_blowup_is_a_rise_over_the_first_steps():
    # make run's entropy drifts 0.017 -> 0.044: no alert; a rise of more than 0.5 nats/token is one
    healthy = [{"step": s, "entropy": 0.017 + 0.027 * s / 199} for s in range(200)]
    assert entropy_blowup(healthy) == []
    rising = [{"step": s, "entropy": e} for s, e in enumerate([0.25] * 5 + [0.5, 0.7, 0.76, 0.9, 1.0])]
    assert [a["step"] for a in entropy_blowup(rising)] == [7]  # baseline 0.25: 0.76 is the first over 0.75


def test_live_diagnosis_reports_each_cause_once():
    live = LiveDiagnosis([], [], {"rl": {"sampling": {"max_new_tokens": 16}}})
    sample = {"completion": "<answer>2</answe", "finished": False, "reward": 0.0,
              "details": {"reason": "no_answer", "spec_version": "reasoning_gym/answer-tag-v1"}}
    reported = []
    for step in range(8):
        metrics = {"truncated_fraction": 1.0, "zero_variance_groups": 1.0, "reward_mean": 0.0, "grad_norm": 0.0}
        reported += live.after_step(step, metrics, [{**sample, "step": step}] * 4)
    assert [(f.cause, f.step) for f in reported] == [("truncation", 4), ("format_never_matched", 4),
                                                     ("no_variance", 4)]
    assert "e.g. ...'<answer>2</answe'" in reported[0].message and "(now 16)" in reported[0].setting


# --- partial credit and small evaluation sets, stated before the run ----------------------------


def test_partial_credit_is_stated_with_the_flag_that_turns_it_off():
    env = make_env("reasoning_gym:word_sorting")
    note = partial_credit(env, env.fixed_set("heldout", 16))
    # the right words in the wrong order: word_sorting's grader pays 0.2 for them
    assert note.startswith("partial credit: reasoning_gym/answer-tag-v1 pays 0.2 for the wrong answer")
    assert note.endswith("to pay only right answers: --env.spec_version reasoning_gym/answer-tag-exact-v1")
    exact = make_env("reasoning_gym:word_sorting", spec_version="reasoning_gym/answer-tag-exact-v1")
    assert partial_credit(exact, exact.fixed_set("heldout", 16)) is None
    arithmetic = make_env("arithmetic")  # final_int pays 1 or 0
    assert partial_credit(arithmetic, arithmetic.fixed_set("heldout", 16)) is None


def test_partial_credit_that_outpays_right_answers_is_named_from_the_samples():
    spec = {"spec_version": "reasoning_gym/answer-tag-v1"}
    partial = {"finished": True, "reward": 0.25, "completion": "<answer>b, a</answer>", "details": {"reason": "partial", **spec}}
    right = {"finished": True, "reward": 1.0, "completion": "<answer>a, b</answer>", "details": {"reason": "ok", **spec}}
    # a step: 6 wrong answers paid 0.25 each (1.5) and 1 right one paid 1.0: 60% of the pay is partial credit
    samples = [{**sample, "step": step} for step in range(5) for sample in [partial] * 6 + [right]]
    (finding,) = diagnose([], step_samples(samples))
    assert (finding.cause, finding.step) == ("partial_credit", 4)
    assert finding.message.startswith("60% of what the verifier paid in steps 0-4 was partial credit: 30 of 35 samples")
    assert finding.setting == "--env.spec_version reasoning_gym/answer-tag-exact-v1 (pays only full credit)"


def test_a_small_file_says_its_evaluation_means_little_and_how_to_have_more(tmp_path, capsys):
    path = tmp_path / "forty.jsonl"  # 40 problems: a hash of each prompt holds out 6 and keeps 4 for dev
    path.write_text("".join(json.dumps({"prompt": f"Q: {a}+{b}\n", "expected_answer": a + b,
                                        "meta": {"solution": f"Final: {a + b}"}}) + "\n"
                            for a in range(8) for b in range(5)))
    base = ["train", "--env.name", "jsonl", "--env.path", str(path), "--env.cot", "false", "--sft.num_examples", "30",
            "--dry_run", "true", "--out_dir", str(tmp_path / "runs")]
    assert main(base) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "heldout_size=500 is not allowed: expected at most 6" in err and "--env.heldout_path FILE" in err
    assert main([*base, "--heldout_size", "3", "--rl.dev_size", "2"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert ("3 heldout problems (heldout_size), fewer than 100: one problem moves pass@1 by 33.3 points and its 95% "
            "CI is up to ±57 points wide") in printed
    assert "your file's heldout split holds only 6: a held-out file of your own (--env.heldout_path FILE" in printed
    assert "2 dev problems (rl.dev_size), fewer than 100" in printed and "your file's dev split holds only 4" in printed
