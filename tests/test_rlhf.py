"""RLHF end to end: the proxy reward keeps the verifier's verdict as the gold, reward models
survive a save / load round trip, and `posttrain rlhf` leaves a reward model with its
held-out accuracy, an RL stage trained on the proxy with the gold logged, and the plot."""

import json
import math
from pathlib import Path

import pytest
import torch

from posttrain.cli import main
from posttrain.config import RewardModelConfig, RLConfig
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import make_reward
from posttrain.pipelines.checks import check_config
from posttrain.rewards.proxy import ProxyReward
from posttrain.rewards.reward_model import (
    RewardModel,
    RewardModelScorer,
    check_reward_model_dir,
    load_reward_model,
    save_reward_model,
)
from tests.test_online_dpo import TINY_PREF, only_run, sft  # noqa: F401  (sft: a module-scoped fixture)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    tok = CharTokenizer()
    rm = RewardModel(GPTMini(GPTMiniConfig(vocab_size=tok.vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                                           max_seq_len=96)))
    torch.nn.init.normal_(rm.head.weight)  # a non-zero head, so texts score differently
    return save_reward_model(rm, tmp_path_factory.mktemp("rm") / "reward_model", tok, {"heldout_accuracy": 0.75})


TEXTS = ["Final: 12", "Final: 13", "Final:12", "", "x" * 10_000, "\x00\ud800☃", "Final: 12\nFinal: 12"]


def test_reward_model_round_trip_and_directory_errors(reward_model_dir, tmp_path):
    model, info = load_reward_model(reward_model_dir)
    assert info == {"heldout_accuracy": 0.75}
    assert not list(reward_model_dir.parent.glob(".*.tmp"))  # renamed into place once complete
    again = save_reward_model(model, tmp_path / "copy", CharTokenizer(), info)
    ex = ArithmeticEnv(level=2, cot=False).fixed_set("train", 1)[0]
    first, second = RewardModelScorer(model), RewardModelScorer(load_reward_model(again)[0])
    rewards = [first.score(ex, t)["reward"] for t in TEXTS]
    assert rewards == [second.score(ex, t)["reward"] for t in TEXTS]
    assert len(set(rewards)) > 3  # the random head tells texts apart
    with pytest.raises(ValueError, match="no such directory"):
        check_reward_model_dir(tmp_path / "missing")
    # a policy checkpoint (config + weights, no head) is refused by name
    model.body.save_pretrained(tmp_path / "policy")
    with pytest.raises(ValueError, match=r"missing \['reward_head.pt', 'reward_model.json'\]"):
        check_reward_model_dir(tmp_path / "policy")


def test_proxy_reward_trains_on_the_model_and_keeps_the_verifier_as_gold(reward_model_dir):
    env = ArithmeticEnv(level=2, cot=False)
    ex = env.fixed_set("train", 1)[0]
    scorer = RewardModelScorer(load_reward_model(reward_model_dir)[0])
    # the config's adapter is the one rl_stage uses: rl.rm.path swaps the training reward
    proxy = make_reward(RLConfig(algo="ppo", rm=RewardModelConfig(path=str(reward_model_dir))), env.score)
    assert isinstance(proxy, ProxyReward)
    right = env.solution(ex)
    for completion in [right, *TEXTS]:
        gold, learned, got = env.score(ex, completion), scorer.score(ex, completion), proxy(ex, completion)
        assert got["reward"] == learned["reward"] and math.isfinite(got["reward"])
        # the verifier's details, untouched, so pass_rate and reason codes stay the verifier's
        assert {k: got["details"][k] for k in gold["details"]} == gold["details"]
        assert got["details"]["gold_reward"] == gold["reward"] and got["details"]["proxy_reward"] == got["reward"]
    assert proxy(ex, right)["details"]["gold_reward"] == 1.0 and proxy(ex, right)["details"]["reason"] == "ok"


@pytest.fixture(scope="module")
def rlhf_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("rlhf")
    assert main(["rlhf", *TINY_PREF, "--rl.rm.prompts", "48", "--rl.rm.steps", "20", "--rl.steps", "4",
                 "--out_dir", str(out)]) == 0
    return only_run(out)


def rows_of(run: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (run / name).read_text().splitlines()]


def test_rlhf_trains_a_reward_model_then_rl_on_it_with_gold_logged(rlhf_run):
    run = rlhf_run
    info = json.loads((run / "reward_model" / "reward_model.json").read_text())
    assert info["train_pairs"] == len((run / "rm_pairs_train.jsonl").read_text().splitlines()) > 0
    assert info["heldout_pairs"] == len((run / "rm_pairs_heldout.jsonl").read_text().splitlines()) > 0
    assert 0.0 <= info["heldout_accuracy"] <= 1.0 and 0.0 <= info["train_accuracy"] <= 1.0
    config = json.loads((run / "config.json").read_text())
    assert config["rl"]["algo"] == "ppo" and config["rl"]["algo_params"] == {"kl_coef": 0.05}
    assert config["rl"]["rm"]["path"] == str(run / "reward_model")  # what a resume trains against
    assert [r["step"] for r in rows_of(run, "metrics.jsonl") if r["stage"] == "rm"] == list(range(20))

    samples = [s for s in rows_of(run, "samples.jsonl") if s["stage"] == "rl"]
    metrics = [r for r in rows_of(run, "metrics.jsonl") if r["stage"] == "rl"]
    assert len(metrics) == 4
    for m in metrics:
        step = [s for s in samples if s["step"] == m["step"]]
        # the training reward is the proxy; the verifier's verdict rides along as the gold
        assert all(s["reward"] == s["details"]["proxy_reward"] for s in step)
        assert m["reward_mean"] == pytest.approx(sum(s["reward"] for s in step) / len(step), abs=1e-5)
        gold = sum(s["details"]["gold_reward"] for s in step) / len(step)
        assert m["pass_rate"] == pytest.approx(gold)  # 0/1 verifier: pass rate = gold mean
    report = json.loads((run / "rlhf.json").read_text())
    assert [r["step"] for r in report["trajectory"]] == [0, 1, 2, 3]
    assert report["trajectory"][-1]["gold_reward"] == pytest.approx(metrics[-1]["pass_rate"])
    assert report["reward_model"]["heldout_accuracy"] == info["heldout_accuracy"]
    assert (run / "rlhf_reward.png").stat().st_size > 10_000
    assert "## RLHF" in (run / "summary.md").read_text()
    # held-out pass@1 is the verifier's, whatever the training reward
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rl"]["mean"] * 16 == pytest.approx(round(summary["rl"]["mean"] * 16))


def test_rlhf_resume_keeps_the_trained_reward_model(rlhf_run):
    head = (rlhf_run / "reward_model" / "reward_head.pt").stat().st_mtime_ns
    before = rows_of(rlhf_run, "metrics.jsonl")
    assert main(["rlhf", "--resume", str(rlhf_run)]) == 0
    assert (rlhf_run / "reward_model" / "reward_head.pt").stat().st_mtime_ns == head
    assert rows_of(rlhf_run, "metrics.jsonl") == before


@pytest.mark.parametrize("argv, message", [
    (["rlhf", "--algo", "dpo"], "rlhf trains an RL algorithm"),
    (["train", "--algo", "ppo", "--rl.rm.path", "no/such/dir"], "rl.rm.path='no/such/dir' is not allowed"),
    (["rlhf", "--rl.rm.temperature", "0"], "rl.rm.temperature=0"),
    (["rlhf", "--rl.rm.micro_batch_size", "-1"], "rl.rm.micro_batch_size=-1"),
])
def test_rlhf_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_online_dpo_can_rank_its_pairs_with_a_reward_model(reward_model_dir, sft, tmp_path):
    assert main(["train", *TINY_PREF, "--init", sft, "--algo", "dpo", "--rl.steps", "4", "--rl.preference.online_rounds", "2",
                 "--rl.preference.pair_prompts", "16", "--rl.rm.path", str(reward_model_dir), "--out_dir", str(tmp_path)]) == 0
    run = only_run(tmp_path)
    rounds = json.loads((run / "pref_rounds.json").read_text())
    assert set(rounds) == {"0", "1"}
    for r in ("0", "1"):
        pairs = [json.loads(line) for line in (run / f"pairs_round{r}.jsonl").read_text().splitlines()]
        # the reward model's scores, best against worst: one pair per prompt, never a 0/1 verdict pair
        assert 0 < len(pairs) == len({p["prompt"] for p in pairs}) <= 8
        assert all(p["score_chosen"] > p["score_rejected"] for p in pairs)
        assert any(p["score_chosen"] not in (0.0, 1.0) for p in pairs)
        assert 0 <= rounds[r]["sampled_gold_mean"] <= 1  # the verifier's view of the same samples
    dev = [json.loads(line) for line in (run / "pairs_dev.jsonl").read_text().splitlines()]
    assert dev and {p["score_chosen"] for p in dev} == {1.0}  # held-out pairs stay the verifier's


def test_rlhf_trains_an_ensemble_each_member_on_its_own_bootstrap(sft, tmp_path):
    assert main(["rlhf", *TINY_PREF, "--init", sft, "--rl.rm.prompts", "48", "--rl.rm.steps", "6",
                 "--rl.rm.ensemble_size", "2", "--rl.rm.ensemble", "min", "--rl.steps", "2",
                 "--out_dir", str(tmp_path)]) == 0
    run = only_run(tmp_path)
    members = [run / "reward_model_0", run / "reward_model_1"]
    infos = [json.loads((m / "reward_model.json").read_text()) for m in members]
    assert [i["member"] for i in infos] == [0, 1] and all(i["bootstrap"] for i in infos)
    heads = [torch.load(m / "reward_head.pt", weights_only=True)["weight"] for m in members]
    assert not torch.equal(*heads)  # different resamples and seeds: different models
    config = json.loads((run / "config.json").read_text())
    assert config["rl"]["rm"]["path"] == ",".join(str(m) for m in members)
    samples = [s for s in rows_of(run, "samples.jsonl") if s["stage"] == "rl"]
    # the training reward is the worse of the two members' scores, both kept
    assert all(s["reward"] == pytest.approx(min(s["details"]["member_rewards"])) for s in samples)
    report = json.loads((run / "rlhf.json").read_text())
    assert report["reward_model"]["ensemble"] == "min" and len(report["reward_model"]["members"]) == 2
    assert "an ensemble of 2, combined by min" in (run / "summary.md").read_text()


def test_rl_rm_micro_batch_size_reaches_the_trainer(sft, tmp_path, monkeypatch):
    from posttrain.pipelines import rlhf
    from posttrain.rewards.reward_model_training import train_reward_model

    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs["micro_batch_size"])
        return train_reward_model(*args, **kwargs)

    monkeypatch.setattr(rlhf, "train_reward_model", spy)
    assert main(["rlhf", *TINY_PREF, "--init", sft, "--rl.rm.prompts", "48", "--rl.rm.steps", "2",
                 "--rl.rm.micro_batch_size", "4", "--rl.steps", "1", "--out_dir", str(tmp_path)]) == 0
    assert seen == [4]


def test_a_reward_model_cannot_rank_a_pairs_file(reward_model_dir, tmp_path):
    from posttrain.config import ConfigError, TrainConfig
    from posttrain.config.files import from_dict
    from posttrain.data.preference import save_preference_jsonl
    from posttrain.types import PreferencePair

    save_preference_jsonl([PreferencePair("Q\n", "a", "b")], tmp_path / "pairs.jsonl")
    rl = {"algo": "dpo", "preference": {"pairs": str(tmp_path / "pairs.jsonl")}, "rm": {"path": str(reward_model_dir)}}
    with pytest.raises(ConfigError, match="a pairs file is already ranked"):
        check_config(from_dict(TrainConfig, {"rl": rl}))


# slow: a transformers body; test_reward_model.py's transformers reward model and the gpt_mini RLHF run are in make test
@pytest.mark.slow
def test_rlhf_on_a_transformers_model_trains_a_transformers_reward_model(tmp_path):
    from posttrain.models.hf import HFPolicy
    from posttrain.models.tokenizer import CharTokenizer

    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=4, hidden_dim=64, max_seq_len=128)).save_pretrained(
        tmp_path / "llama", CharTokenizer())  # a tiny local Llama: `--model DIR` loads it through transformers
    assert main(["rlhf", "--model", str(tmp_path / "llama"), "--env.arithmetic.level", "2", "--env.cot", "false",
                 "--sft.steps", "200", "--sft.lr", "1e-2", "--sft.batch_size", "32", "--sft.num_examples", "400",
                 "--rl.steps", "2", "--rl.rm.steps", "5", "--rl.rm.prompts", "32", "--heldout_size", "16",
                 "--rl.dev_size", "16", "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "8",
                 "--threads", "1", "--out_dir", str(tmp_path / "runs")]) == 0
    run = only_run(tmp_path / "runs")
    model, info = load_reward_model(run / "reward_model")
    assert isinstance(model.body, HFPolicy) and info["heldout_pairs"] > 0 and 0 <= info["heldout_accuracy"] <= 1
    samples = [s for s in rows_of(run, "samples.jsonl") if s["stage"] == "rl"]
    assert len(samples) == 2 * 2 * 8  # 2 PPO steps of 2 prompts x 8 samples, trained on the proxy
    assert all(s["reward"] == s["details"]["proxy_reward"] and s["details"]["gold_reward"] in (0.0, 1.0)
               for s in samples)
