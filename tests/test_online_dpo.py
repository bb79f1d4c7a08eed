"""The preference stage: online (iterative) DPO splits one budget into rounds of fresh
on-policy pairs, logs where each round's pairs came from and how held-out pairs rank, and a
run killed anywhere in the stage resumes to the metrics of an uninterrupted run."""

import json
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, TrainConfig, from_dict

# A tiny policy that answers level-2 sums ("Q: 3+4+5" -> "Final: 12") right often enough
# at T = 1.5 that its 8 samples of a prompt disagree: verifier-built pairs exist.
TINY_PREF = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--env.level", "2", "--env.cot", "false",
    "--sft.num_examples", "200", "--sft.steps", "80", "--sft.batch_size", "32", "--sft.lr", "1e-2",
    "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "8", "--rl.sampling.temperature", "1.5",
    "--rl.eval_every", "5", "--rl.eval_size", "8", "--eval_size", "16", "--checkpoint_every", "2", "--threads", "1",
]


def only_run(out: Path) -> Path:
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    return run


def pref_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows if r["stage"] == "pref"]


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("sft")
    assert main(["train", *TINY_PREF, "--rl.steps", "0", "--out_dir", str(out)]) == 0
    return str(only_run(out) / "checkpoints" / "sft" / "step_000079")


def online(sft: str, out: Path, *extra: str) -> list[str]:
    return ["train", *TINY_PREF, "--init", sft, "--algo", "dpo", "--rl.steps", "9", "--rl.online_rounds", "3",
            "--rl.pair_prompts", "48", "--out_dir", str(out), *extra]


@pytest.fixture(scope="module")
def uninterrupted(sft, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("online")
    assert main(online(sft, out)) == 0
    return only_run(out)


def test_online_rounds_split_the_budget_and_resample_from_the_current_policy(uninterrupted):
    run = uninterrupted
    rounds = json.loads((run / "pref_rounds.json").read_text())
    # 48 prompts and 9 steps in 3 rounds: 16 prompts and 3 steps each
    assert [rounds[str(r)]["pair_prompts"] for r in range(3)] == [16, 16, 16]
    rows = pref_rows(run)
    assert [r["step"] for r in rows] == list(range(9))
    assert [r["step"] for r in rows if "round" in r] == [0, 3, 6] and [r["round"] for r in rows if "round" in r] == [0, 1, 2]
    for r in range(3):
        pairs = (run / f"pairs_round{r}.jsonl").read_text().splitlines()
        assert len(pairs) == rounds[str(r)]["pairs"] == rows[3 * r]["round_pairs"] > 0
    # each round drew its own prompts (from the policy as it was then), not round 0's again
    prompts = [{json.loads(line)["prompt"] for line in (run / f"pairs_round{r}.jsonl").read_text().splitlines()}
               for r in range(3)]
    assert prompts[0] != prompts[1] and prompts[1] != prompts[2]
    # checkpoints at the end of the stage (and each round); the summary knows the stage
    assert (run / "checkpoints" / "pref" / "latest").read_text().strip() == "step_000008"
    assert json.loads((run / "summary.json").read_text())["final_stage"] == "pref"


def test_preference_metrics_cover_accuracy_rewards_kl_length_and_held_out_pairs(uninterrupted):
    rows = pref_rows(uninterrupted)
    for r in rows:  # every step: the loss's own numbers on its training batch
        assert {"loss", "accuracy", "rewards_chosen", "rewards_rejected", "margin", "grad_norm"} <= set(r)
        assert 0.0 <= r["accuracy"] <= 1.0
        assert r["margin"] == pytest.approx(r["rewards_chosen"] - r["rewards_rejected"], abs=1e-5)
    evaluated = [r for r in rows if "dev_pass@1" in r]
    assert [r["step"] for r in evaluated] == [4, 8]  # eval_every 5, and the last step
    for r in evaluated:
        assert r["kl_ref"] >= 0 and r["response_length"] > 0 and 0 <= r["reward_mean"] <= 1
        assert 0.0 <= r["dev_pref_accuracy"] <= 1.0 and "dev_pref_margin" in r
    # step 0 starts at the reference: every implicit reward is exactly 0, so the loss is log 2
    assert rows[0]["loss"] == pytest.approx(0.693147, abs=1e-5) and rows[0]["accuracy"] == 0.0
    assert (uninterrupted / "pairs_dev.jsonl").stat().st_size > 0


class Killed(Exception):
    """Stands in for SIGKILL: nothing after it runs."""


@pytest.mark.parametrize("rounds, kill_after", [("3", 4), ("1", 6)])
def test_killed_preference_stage_resumes_to_identical_metrics(sft, uninterrupted, tmp_path, monkeypatch, rounds,
                                                              kill_after):
    from posttrain.algorithms import preference

    real = preference.train_preference
    calls = []

    def dies_mid_stage(*args, on_step, **kwargs):
        def step_then_die(step, metrics):
            on_step(step, metrics)  # logs the row (and checkpoints when due)
            calls.append(step)
            if len(calls) == kill_after + 1:
                raise Killed

        return real(*args, on_step=step_then_die, **kwargs)

    monkeypatch.setattr(preference, "train_preference", dies_mid_stage)
    with pytest.raises(Killed):
        main(online(sft, tmp_path, "--rl.online_rounds", rounds))
    monkeypatch.setattr(preference, "train_preference", real)
    run = only_run(tmp_path)
    # rows of steps after the last checkpoint were logged before the kill; resume drops them
    assert len(pref_rows(run)) == kill_after + 1
    assert main(["train", "--resume", str(run)]) == 0
    if rounds == "3":
        reference = uninterrupted
    else:
        out = tmp_path / "offline"
        out.mkdir()
        assert main(online(sft, out, "--rl.online_rounds", "1")) == 0
        reference = only_run(out)
    assert pref_rows(run) == pref_rows(reference)
    assert json.loads((run / "summary.json").read_text())["pref"] == json.loads(
        (reference / "summary.json").read_text())["pref"]


@pytest.mark.parametrize("rl, message", [
    ({"online_rounds": 0}, "rl.online_rounds=0"),
    ({"online_rounds": 2}, "preference loss"),  # grpo has no rounds
    ({"algo": "dpo", "online_rounds": 5, "steps": 4}, "at most rl.steps=4"),
    ({"algo": "dpo", "online_rounds": 2, "pairs": "PAIRS"}, "cannot be resampled"),
    ({"algo": "ppo", "rm": {"path": "no/such/dir"}}, r"rl.rm.path='no/such/dir' is not allowed: no such directory"),
    ({"algo": "dpo", "rm": {"path": "RUN"}}, "not a reward model directory"),
])
def test_online_rounds_and_reward_models_refuse_settings_they_cannot_honour(rl, message, tmp_path, sft):
    from posttrain.preference_data import PreferencePair, save_preference_jsonl

    save_preference_jsonl([PreferencePair("Q\n", "a", "b")], tmp_path / "pairs.jsonl")
    rl = json.loads(json.dumps(rl).replace("PAIRS", str(tmp_path / "pairs.jsonl")).replace("RUN", sft))
    with pytest.raises(ConfigError, match=message):
        from_dict(TrainConfig, {"rl": rl}).rl.validate()


def test_a_round_without_pairs_trains_on_the_previous_rounds_pairs(sft, tmp_path, monkeypatch):
    from posttrain.roles import controller

    real = controller.verifier_pairs

    def none_in_round_1(cfg, env, tokenizer, policy, round=0, n_prompts=0, split="train"):
        pairs, stats = real(cfg, env, tokenizer, policy, round, n_prompts, split)
        return ([], {**stats, "pairs": 0}) if (round, split) == (1, "train") else (pairs, stats)

    monkeypatch.setattr(controller, "verifier_pairs", none_in_round_1)
    assert main(online(sft, tmp_path, "--rl.online_rounds", "2", "--rl.steps", "4")) == 0
    run = only_run(tmp_path)
    rounds = json.loads((run / "pref_rounds.json").read_text())
    assert rounds["1"]["pairs"] == 0 and rounds["1"]["reused_round"] == 0
    assert (run / "pairs_round1.jsonl").read_text() == (run / "pairs_round0.jsonl").read_text()
    assert [r["step"] for r in pref_rows(run)] == [0, 1, 2, 3]
