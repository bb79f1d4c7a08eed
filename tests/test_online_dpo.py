"""The preference stage: online (iterative) DPO splits one budget into rounds of fresh
on-policy pairs, logs where each round's pairs came from and how held-out pairs rank, and a
run killed anywhere in the stage resumes to the metrics of an uninterrupted run."""

import json
import math
from pathlib import Path

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, TrainConfig
from posttrain.config.files import from_dict
from posttrain.pipelines.checks import check_config

# A tiny policy that answers level-2 sums ("Q: 3+4+5" -> "Final: 12") right often enough
# at T = 1.5 that its 8 samples of a prompt disagree: verifier-built pairs exist.
TINY_PREF = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--env.arithmetic.level", "2", "--env.cot", "false",
    "--sft.num_examples", "200", "--sft.steps", "80", "--sft.batch_size", "32", "--sft.lr", "1e-2",
    "--sft.warmup_steps", "2",
    "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "8", "--rl.sampling.temperature", "1.5",
    "--rl.eval_every", "5", "--rl.dev_size", "8", "--heldout_size", "16", "--checkpoint_every", "2", "--threads", "1",
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
    return ["train", *TINY_PREF, "--init", sft, "--algo", "dpo", "--rl.steps", "9", "--rl.preference.online_rounds", "3",
            "--rl.preference.pair_prompts", "96", "--out_dir", str(out), *extra]


@pytest.fixture(scope="module")
def uninterrupted(sft, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("online")
    assert main(online(sft, out)) == 0
    return only_run(out)


def test_online_rounds_split_the_budget_and_resample_from_the_current_policy(uninterrupted):
    run = uninterrupted
    rounds = json.loads((run / "pref_rounds.json").read_text())
    # 96 prompts and 9 steps in 3 rounds: 32 prompts and 3 steps each (counted as distinct
    # prompts: level 2 has few enough problems that a draw of 32 can repeat one or two)
    assert all(28 <= rounds[str(r)]["pair_prompts"] <= 32 for r in range(3))
    rows = pref_rows(run)
    assert [r["step"] for r in rows] == list(range(9))
    assert [r["step"] for r in rows if "round" in r] == [0, 3, 6] and [r["round"] for r in rows if "round" in r] == [0, 1, 2]
    for r in range(3):
        pairs = (run / f"pairs_round{r}.jsonl").read_text().splitlines()
        assert len(pairs) == rounds[str(r)]["pairs"] == rows[3 * r]["round_pairs"] > 0
        # 3 steps of min(4, pairs) pairs each: how often the round trains on each pair
        assert rows[3 * r]["round_passes"] == pytest.approx(3 * min(4, len(pairs)) / len(pairs))
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
        # the health checks: the held-out chosen answers' likelihood, the implicit reward's calibration
        assert r["dev_pref_logps_chosen_per_token"] < 0 and 0 <= r["dev_pref_implicit_reward_ece"] <= 1
        assert 0 < r["entropy"] < math.log(100)  # and its own samples' entropy: above 0, below uniform over 100 chars
    # step 0 starts at the reference: every implicit reward is 0 up to float rounding (the
    # policy and the reference score a pair in differently shaped batches, and BLAS kernels
    # round by shape), so the loss is log 2; "accuracy" there counts rounding noise, not learning
    assert rows[0]["loss"] == pytest.approx(0.693147, abs=1e-5)
    assert abs(rows[0]["rewards_chosen"]) < 1e-4 and abs(rows[0]["rewards_rejected"]) < 1e-4
    assert (uninterrupted / "pairs_dev.jsonl").stat().st_size > 0


class Killed(Exception):
    """Stands in for SIGKILL: nothing after it runs."""


def dies_at_step(monkeypatch, preference, step: int) -> None:
    """Kill the preference stage as step `step` starts to build its batch: every earlier
    step's row is logged (and checkpointed when due), nothing of this one is."""
    real, calls = preference.preference_batch, []

    def batch_or_die(*args, **kwargs):
        calls.append(1)
        if len(calls) == step + 1:
            raise Killed
        return real(*args, **kwargs)

    monkeypatch.setattr(preference, "preference_batch", batch_or_die)


@pytest.mark.parametrize("rounds, kill_after", [("3", 4), ("1", 6)])
def test_killed_preference_stage_resumes_to_identical_metrics(sft, uninterrupted, tmp_path, monkeypatch, rounds,
                                                              kill_after):
    from posttrain.pipelines import preference

    dies_at_step(monkeypatch, preference, kill_after + 1)  # after step kill_after's row was logged
    with pytest.raises(Killed):
        main(online(sft, tmp_path, "--rl.preference.online_rounds", rounds))
    monkeypatch.undo()
    run = only_run(tmp_path)
    # rows of steps after the last checkpoint were logged before the kill; resume drops them
    assert len(pref_rows(run)) == kill_after + 1
    assert main(["train", "--resume", str(run)]) == 0
    if rounds == "3":
        reference = uninterrupted
    else:
        out = tmp_path / "offline"
        out.mkdir()
        assert main(online(sft, out, "--rl.preference.online_rounds", "1")) == 0
        reference = only_run(out)
    assert pref_rows(run) == pref_rows(reference)
    assert json.loads((run / "summary.json").read_text())["pref"] == json.loads(
        (reference / "summary.json").read_text())["pref"]


@pytest.mark.parametrize("rl, message", [
    ({"preference": {"online_rounds": 0}}, "rl.preference.online_rounds=0"),
    ({"preference": {"online_rounds": 2}}, "preference loss"),  # grpo has no rounds
    ({"algo": "dpo", "preference": {"online_rounds": 5}, "steps": 4}, "at most rl.steps=4"),
    ({"algo": "dpo", "preference": {"online_rounds": 2, "pairs": "PAIRS"}}, "cannot be resampled"),
    ({"algo": "ppo", "rm": {"path": "no/such/dir"}}, r"rl.rm.path='no/such/dir' is not allowed: no such directory"),
    ({"algo": "dpo", "rm": {"path": "RUN"}}, "not a reward model directory"),
    ({"algo": "ppo", "rm": {"pooling": "max"}}, r"rl.rm.pooling='max' is not allowed: expected 'last', 'mean' or"),
])
def test_online_rounds_and_reward_models_refuse_settings_they_cannot_honour(rl, message, tmp_path, sft):
    from posttrain.data.preference import save_preference_jsonl
    from posttrain.types import PreferencePair

    save_preference_jsonl([PreferencePair("Q\n", "a", "b")], tmp_path / "pairs.jsonl")
    rl = json.loads(json.dumps(rl).replace("PAIRS", str(tmp_path / "pairs.jsonl")).replace("RUN", sft))
    with pytest.raises(ConfigError, match=message):
        check_config(from_dict(TrainConfig, {"rl": rl}))


def test_a_round_without_pairs_trains_on_the_previous_rounds_pairs(sft, tmp_path, monkeypatch):
    from posttrain.pipelines import preference_rounds

    real = preference_rounds.verifier_pairs

    def none_in_round_1(cfg, env, tokenizer, policy, round=0, n_prompts=0, split="train", score=None):
        pairs, stats = real(cfg, env, tokenizer, policy, round, n_prompts, split, score)
        return ([], {**stats, "pairs": 0}) if (round, split) == (1, "train") else (pairs, stats)

    monkeypatch.setattr(preference_rounds, "verifier_pairs", none_in_round_1)
    assert main(online(sft, tmp_path, "--rl.preference.online_rounds", "2", "--rl.steps", "4")) == 0
    run = only_run(tmp_path)
    rounds = json.loads((run / "pref_rounds.json").read_text())
    assert rounds["1"]["pairs"] == 0 and rounds["1"]["reused_round"] == 0
    assert (run / "pairs_round1.jsonl").read_text() == (run / "pairs_round0.jsonl").read_text()
    assert [r["step"] for r in pref_rows(run)] == [0, 1, 2, 3]


def test_an_alert_stops_the_preference_stage_where_it_fired_and_a_resume_keeps_it_stopped(sft, tmp_path):
    # lr 1e-2 wins the pairs by making the chosen answers unlikely too: the held-out chosen
    # log-likelihood falls from -0.248 nats/token at step 0 to -0.752 at step 2, more than the
    # 0.5 chosen_likelihood_collapse allows, and rl.alerts.action=stop makes step 2 the last
    assert main(online(sft, tmp_path, "--rl.steps", "12", "--rl.eval_every", "1", "--rl.optim.lr", "1e-2",
                       "--rl.alerts.action", "stop", "--rl.alerts.monitors", "chosen_likelihood_collapse")) == 0
    run = only_run(tmp_path)
    record = json.loads((run / "early_stop.json").read_text())["pref"]
    assert (record["step"], record["action"], record["monitor"]) == (2, "stop", "chosen_likelihood_collapse")
    rows = pref_rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["dev_pref_logps_chosen_per_token"] - rows[2]["dev_pref_logps_chosen_per_token"] > 0.5
    assert (run / "checkpoints" / "pref" / "latest").read_text().strip() == "step_000002"
    assert not (run / "pairs_round1.jsonl").exists()  # round 1 (steps 4-7) never started
    assert json.loads((run / "summary.json").read_text())["early_stop"]["step"] == 2

    assert main(["train", "--resume", str(run)]) == 0
    assert pref_rows(run) == rows and not (run / "pairs_round1.jsonl").exists()


# ------------------------------------------------------------------ iterative DPO: a fresh reference each round


def spy_on_reference(monkeypatch) -> list[dict]:
    """Record, for every round, the module π_ref was read from, the policy, and the policy's
    and the reference's log-probs of that round's pairs at the moment the round starts."""
    import torch

    from posttrain.models.logprobs import sequence_logps
    from posttrain.pipelines import preference, preference_rounds

    real_cache, real_trainer, calls, policies = preference_rounds.cache_reference_logps, preference.Trainer, [], []

    class RememberingTrainer(real_trainer):
        def __init__(self, model, *args, **kwargs):
            policies.append(model)
            super().__init__(model, *args, **kwargs)

    def spy(reference, rows, pad_id, *args, **kwargs):
        real_cache(reference, rows, pad_id, *args, **kwargs)
        batch = preference.preference_batch(rows, range(len(rows)), pad_id)
        with torch.no_grad():
            calls.append({"reference": reference, "policy": policies[-1],
                          "policy_logps": sequence_logps(policies[-1], batch).tolist(),
                          "reference_logps": sequence_logps(reference, batch).tolist()})

    monkeypatch.setattr(preference, "Trainer", RememberingTrainer)
    monkeypatch.setattr(preference_rounds, "cache_reference_logps", spy)
    return calls


def test_refresh_reference_makes_each_rounds_reference_the_policy_at_round_start(sft, uninterrupted, tmp_path,
                                                                                monkeypatch):
    calls = spy_on_reference(monkeypatch)
    assert main(online(sft, tmp_path, "--rl.preference.refresh_reference", "true")) == 0
    assert len(calls) == 3
    for call in calls:  # the reference's log-probs are the policy's as the round starts
        assert call["reference"] is not call["policy"]
        assert call["reference_logps"] == pytest.approx(call["policy_logps"], abs=1e-4)
    rows = pref_rows(only_run(tmp_path))
    # so the first step of every round starts at zero implicit reward: loss log 2 exactly ...
    assert [r["loss"] for r in rows if "round" in r] == pytest.approx([math.log(2)] * 3, abs=1e-5)
    # ... where without refresh, round 1 starts from a policy that has already moved from π_ref
    assert [r["loss"] for r in pref_rows(uninterrupted) if "round" in r][1] != pytest.approx(math.log(2), abs=1e-4)
    assert rows[:3] == pref_rows(uninterrupted)[:3]  # round 0 is the same run either way


# slow: the killed preference stage's exact resume is in make test
@pytest.mark.slow
def test_killed_run_with_refresh_reference_resumes_against_the_same_reference(sft, tmp_path, monkeypatch):
    from posttrain.pipelines import preference

    flags = ("--rl.preference.refresh_reference", "true")
    dies_at_step(monkeypatch, preference, 8)  # mid-way through round 2 (steps 6-8); last checkpoint step 7
    with pytest.raises(Killed):
        main(online(sft, tmp_path / "killed", *flags))
    monkeypatch.undo()
    assert main(["train", "--resume", str(only_run(tmp_path / "killed"))]) == 0
    assert main(online(sft, tmp_path / "whole", *flags)) == 0
    assert pref_rows(only_run(tmp_path / "killed")) == pref_rows(only_run(tmp_path / "whole"))


@pytest.mark.parametrize("rl, message", [
    # offline: no next round
    ({"algo": "dpo", "preference": {"refresh_reference": True}}, "unless rl.preference.online_rounds > 1"),
    ({"algo": "orpo", "preference": {"online_rounds": 2, "refresh_reference": True}}, "with a reference"),  # ORPO has none
    ({"algo": "dpo", "preference": {"online_rounds": 2, "refresh_reference": "maybe"}},
     "refresh_reference='maybe'.*true or false"),
])
def test_refresh_reference_refuses_settings_where_it_means_nothing(rl, message):
    with pytest.raises(ConfigError, match=message):
        check_config(from_dict(TrainConfig, {"rl": rl}))


# ------------------------------------------------------------------ LoRA: the reference is the adapters off


def test_lora_preference_stage_uses_the_adapter_off_base_as_reference(tmp_path, monkeypatch):
    """model.lora_r > 0 trains adapters only, and π_ref is the policy's own forward with them
    off: the base's logits, from the policy's own parameters (no second copy)."""
    pytest.importorskip("peft")
    import torch

    from posttrain.data.preference import save_preference_jsonl
    from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig
    from posttrain.roles.reference import AdapterOff
    from posttrain.types import PreferencePair

    torch.manual_seed(0)
    base = GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=4, hidden_dim=64, max_seq_len=64))
    base.save_pretrained(tmp_path / "tiny_llama", CharTokenizer())
    save_preference_jsonl([PreferencePair("Q: 1+2\n", "Final: 3", "Final: 4"),
                           PreferencePair("Q: 2+2\n", "Final: 4", "Final: 5")], tmp_path / "pairs.jsonl")
    calls = spy_on_reference(monkeypatch)
    assert main(["train", "--model.name", str(tmp_path / "tiny_llama"), "--model.lora_r", "4", "--algo", "dpo",
                 "--sft.steps", "0", "--rl.steps", "3", "--rl.optim.lr", "1e-2", "--rl.preference.pairs", str(tmp_path / "pairs.jsonl"),
                 "--rl.prompts_per_step", "2", "--rl.eval_every", "3", "--rl.dev_size", "4",
                 "--rl.sampling.max_new_tokens", "8", "--heldout_size", "4", "--threads", "1",
                 "--out_dir", str(tmp_path / "out")]) == 0
    (call,) = calls
    reference, policy = call["reference"], call["policy"]
    assert isinstance(reference, AdapterOff) and reference.policy is policy
    policy_params = {id(p) for p in policy.parameters()}
    assert {id(p) for p in reference.parameters()} <= policy_params  # no second copy of any weight
    assert all("lora_" in n for n, p in policy.named_parameters() if p.requires_grad)
    tokens = torch.tensor([[1, 20, 30, 40, 2]])
    with torch.no_grad():
        # after training: the reference is still exactly the base; the policy has moved
        torch.testing.assert_close(reference(tokens), base(tokens), atol=1e-5, rtol=0)
        assert (policy(tokens) - base(tokens)).abs().max() > 1e-3


def test_a_preference_run_with_no_steps_evaluates_the_start(sft, tmp_path):
    assert main(["train", *TINY_PREF, "--init", sft, "--algo", "dpo", "--rl.steps", "0", "--out_dir", str(tmp_path)]) == 0
    summary = json.loads((only_run(tmp_path) / "summary.json").read_text())
    assert summary["pref"] == summary["sft"]  # nothing trained, so the same policy on the same problems


def test_a_round_that_trains_many_times_on_few_pairs_warns(sft, tmp_path, capsys):
    # 8 prompts give a handful of pairs (13); 60 steps of 4 pairs go over each of them many times
    assert main(["train", *TINY_PREF, "--init", sft, "--algo", "dpo", "--rl.steps", "60", "--rl.preference.pair_prompts", "8",
                 "--out_dir", str(tmp_path)]) == 0
    (row,) = [r for r in pref_rows(only_run(tmp_path)) if "round" in r]
    out = capsys.readouterr().out
    assert row["round_passes"] > 8 and "trains on each pair" in out and "raise rl.preference.pair_prompts" in out
