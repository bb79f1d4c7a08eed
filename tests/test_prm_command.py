"""`posttrain prm` end to end on tiny models: a stepwise file in TRL's format, the policy's
own samples, and the errors a user gets for bad input."""

from __future__ import annotations

import json
import random

import pytest
import torch

from posttrain.cli import main
from posttrain.data.stepwise import load_stepwise, split_by_prompt
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.process_reward_model import load_step_scorer, train_step_reward_model


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("policy") / "gpt_mini"
    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=CharTokenizer().vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                          max_seq_len=96)).save_pretrained(directory, CharTokenizer())
    return directory


def write_toy_file(path, n=300):
    """TRL stepwise rows, one step per line: a step is right while no 'bad' step came before."""
    rng = random.Random(0)
    with open(path, "w") as f:
        for i in range(n):
            steps = [rng.choice(["good", "good", "bad"]) for _ in range(rng.randint(1, 3))]
            labels = [all(s == "good" for s in steps[: k + 1]) for k in range(len(steps))]
            f.write(json.dumps({"prompt": f"P{i}\n", "completions": steps, "labels": labels}) + "\n")


def run_dir(out):
    (path,) = [p for p in out.iterdir() if p.is_dir()]
    return path


def test_prm_from_a_trl_stepwise_file(tmp_path, tiny_checkpoint):
    write_toy_file(tmp_path / "steps.jsonl")
    code = main(["prm", "--data", str(tmp_path / "steps.jsonl"), "--step_format", "newline", "--init",
                 str(tiny_checkpoint), "--steps", "150", "--lr", "3e-3", "--heldout_percent", "20",
                 "--out_dir", str(tmp_path / "runs")])
    assert code == 0
    run = run_dir(tmp_path / "runs")
    summary = json.loads((run / "summary.json").read_text())
    heldout = summary["heldout"]
    assert heldout["step_accuracy"]["mean"] > 0.95  # the rule is learnable from 240 rows
    assert heldout["step_accuracy"]["ci_low"] <= heldout["step_accuracy"]["mean"] <= heldout["step_accuracy"]["ci_high"]
    assert sum(row["n"] for row in heldout["step_reliability"]) == heldout["heldout_steps"]
    assert set(heldout["outcome_auroc"]) == {"min", "product", "last"}
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 150
    # the split is by prompt, and the run wrote both halves back in the same format
    train, held = load_stepwise(run / "prm_train.jsonl"), load_stepwise(run / "prm_heldout.jsonl")
    assert not {r.prompt for r in train} & {r.prompt for r in held} and len(train) + len(held) == 300
    assert (train, held) == split_by_prompt(load_stepwise(tmp_path / "steps.jsonl"), 20)
    scorer = load_step_scorer(run / "reward_model")
    assert scorer.kind == "prm" and scorer.format.name == "newline"
    good, bad = scorer.score_steps(["P1\n", "P1\n"], [["good", "good"], ["bad", "good"]])
    assert good[1] > 0.5 > bad[1]
    assert "step accuracy" in (run / "summary.md").read_text()


def test_micro_batch_size_reaches_the_trainer(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    from posttrain.pipelines import prm as prm_pipeline

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["micro_batch_size"])
        return train_step_reward_model(*args, **kwargs)

    monkeypatch.setattr(prm_pipeline, "train_step_reward_model", spy)
    write_toy_file(tmp_path / "steps.jsonl", n=40)
    assert main(["prm", "--data", str(tmp_path / "steps.jsonl"), "--step_format", "newline", "--init",
                 str(tiny_checkpoint), "--steps", "2", "--micro_batch_size", "4", "--out_dir", str(tmp_path)]) == 0
    assert seen == [4]
    assert main(["prm", "--micro_batch_size", "-1"]) == 2
    assert "micro_batch_size=-1" in capsys.readouterr().err


def test_orm_from_the_policys_own_samples_after_a_short_sft(tmp_path):
    """Without --init the job runs SFT first (2 steps here: a policy that writes no valid
    chain). Every sampled completion is wrong, and the report says so instead of failing."""
    code = main(["prm", "--kind", "orm", "--sft_steps", "2", "--env.arithmetic.level", "2", "--prompts", "8",
                 "--heldout_prompts", "3", "--samples_per_prompt", "2", "--max_new_tokens", "12", "--steps", "3",
                 "--out_dir", str(tmp_path / "runs")])
    assert code == 0
    run = run_dir(tmp_path / "runs")
    assert (run / "sft_policy" / "checkpoints" / "sft").is_dir()  # the SFT, a run inside the run
    summary = json.loads((run / "summary.json").read_text())
    samples = summary["data"]["samples"]["train"]
    assert samples["completions"] == 16 and samples["outcome_correct"] == 0.0
    # every label is 0: after 3 steps p < 0.5 everywhere, so accuracy is 1 and AUROC undefined
    assert summary["heldout"]["outcome_accuracy"]["mean"] == 1.0
    assert summary["heldout"]["outcome_auroc"]["orm"]["resamples"] == 0
    assert "policy_confidence_outcome_auroc" in summary["heldout"]  # the untrained baseline is reported too


def test_bad_input_gets_a_clear_error(tmp_path, tiny_checkpoint, capsys):
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "P\n", "completions": ["a", "b"], "labels": [True]})
                                        + "\n")
    code = main(["prm", "--data", str(tmp_path / "bad.jsonl"), "--init", str(tiny_checkpoint), "--out_dir",
                 str(tmp_path / "runs")])
    assert code == 2 and "line 1: labels must be a list with one label per step (2 steps)" in capsys.readouterr().err
    assert main(["prm", "--kind", "bt"]) == 2 and "kind='bt' is not allowed" in capsys.readouterr().err
    assert main(["prm", "--step_format", "newline"]) == 2
    assert "are split by its own format" in capsys.readouterr().err


def test_policy_confidence_is_a_running_minimum_of_step_log_probs(tiny_checkpoint):
    from posttrain.models import load_checkpoint_model
    from posttrain.models.logprobs import token_logp
    from posttrain.pipelines.prm import policy_confidence
    from posttrain.rewards.process_reward_model import StepRecord

    policy, tok = load_checkpoint_model(tiny_checkpoint), CharTokenizer()
    record = StepRecord("Q: 1+2+3\n", ["1+2=3", "3+3=6", "Final: 6"], [1.0, 1.0, 1.0], 1.0)
    (scores,) = policy_confidence(policy, tok, [record], "arithmetic")
    ids = [tok.bos_id] + tok.encode("Q: 1+2+3\n1+2=3,3+3=6\nFinal: 6") + [tok.eos_id]
    with torch.no_grad():
        logp = token_logp(policy(torch.tensor([ids])).float(), torch.tensor([ids]))[0]
    prompt = 1 + len("Q: 1+2+3\n")
    by_hand = [logp[prompt : prompt + 6].mean().item(),  # "1+2=3,"
               logp[prompt + 6 : prompt + 12].mean().item(),  # "3+3=6\n"
               logp[prompt + 12 :].mean().item()]  # "Final: 6" <eos>
    running = [min(by_hand[: k + 1]) for k in range(3)]
    assert scores == pytest.approx(running, abs=1e-5)
