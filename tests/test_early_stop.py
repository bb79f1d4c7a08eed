"""rl.alerts.action: a hacking monitor's alert stops the RL stage, or rolls it back to the best
dev pass@1; never on a healthy history, and a stopped run stays stopped when resumed."""

import json
import subprocess
import sys

import pytest
import torch

from posttrain.config import AlertsConfig, ConfigError, MONITORS, RLConfig, TrainConfig
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.alerts import AlertPolicy
from posttrain.runs import monitors
from posttrain.runs.checkpoints import latest_checkpoint, load_checkpoint_weights
from posttrain.runs.rundir import RunDir
from tests.test_pipeline import TINY, only_run_dir


def hacked_history():
    """Reward up while dev pass@1 falls 0.6 -> 0.4: proxy_gold_divergence fires at step 3."""
    return [
        {"reward_mean": 0.3, "dev_pass@1": 0.5},
        {"reward_mean": 0.4, "dev_pass@1": 0.6},
        {"reward_mean": 0.6},
        {"reward_mean": 0.8, "dev_pass@1": 0.4},
        {"reward_mean": 0.9},
    ]


def watch(tmp_path, rows, **alerts):
    tokenizer = CharTokenizer()
    model = GPTMini(GPTMiniConfig(vocab_size=tokenizer.vocab_size, dim=16, n_layer=1, n_head=2, hidden_dim=32,
                                  max_seq_len=16))
    run = RunDir.create(tmp_path, "run")
    policy = AlertPolicy(RLConfig(alerts=AlertsConfig(**alerts)), run, "rl", model, tokenizer)
    stopped = []
    for step, metrics in enumerate(rows):
        with torch.no_grad():  # the weights change every step, as training would change them
            next(model.parameters()).fill_(float(step))
        policy.after_step(step, dict(metrics))
        if policy.should_stop(step):
            stopped.append(step)
            break
    return run, model, stopped


def test_the_monitor_names_are_the_monitors():
    fired = {a["monitor"] for a in monitors.check_all([{"kl_ref": 9.0, "step": 0}])}
    assert fired <= set(MONITORS)
    assert {name for name in dir(monitors) if name in MONITORS} == set(MONITORS)


def test_stop_ends_at_the_alert_and_records_it(tmp_path):
    run, _, stopped = watch(tmp_path, hacked_history(), action="stop")
    assert stopped == [3]
    record = json.loads((run.path / "early_stop.json").read_text())["rl"]
    assert record["step"] == 3 and record["action"] == "stop" and record["monitor"] == "proxy_gold_divergence"
    assert AlertPolicy(RLConfig(), run, "rl", None, None).last_step(200) == 4  # a resume ends at the same step
    assert AlertPolicy(RLConfig(), run, "grpo", None, None).last_step(200) == 200  # another stage's own record


def test_rollback_puts_back_the_best_dev_weights(tmp_path):
    run, model, stopped = watch(tmp_path, hacked_history(), action="rollback")
    assert stopped == [3]
    record = json.loads((run.path / "early_stop.json").read_text())["rl"]
    assert record["restored_step"] == 1  # dev pass@1 0.6, the best before the fall
    assert next(model.parameters()).flatten()[0].item() == 1.0  # the weights as they were after step 1
    best = latest_checkpoint(run, "rl_best")
    assert best.name == "step_000001"
    saved = load_checkpoint_weights(best, model.config).state_dict()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())


def test_warn_and_a_healthy_run_never_stop(tmp_path):
    assert watch(tmp_path / "a", hacked_history(), action="warn")[2] == []
    healthy = [{"reward_mean": 0.1 * i, "dev_pass@1": 0.1 * i, "kl_ref": 0.01} for i in range(10)]
    run, _, stopped = watch(tmp_path / "b", healthy, action="rollback")
    assert stopped == [] and not (run.path / "early_stop.json").exists()
    # an alert of a monitor outside rl.alerts.monitors only warns
    assert watch(tmp_path / "c", hacked_history(), action="stop", monitors="kl_explosion")[2] == []


def test_bad_settings_are_refused_with_the_setting_named():
    with pytest.raises(ConfigError, match="rl.alerts.action"):
        TrainConfig(rl=RLConfig(alerts=AlertsConfig(action="halt"))).validate()
    with pytest.raises(ConfigError, match="rl.alerts.monitors.*kl_blowup"):
        TrainConfig(rl=RLConfig(alerts=AlertsConfig(monitors="proxy_gold_divergence,kl_blowup"))).validate()


def test_a_tiny_run_rolls_back_and_stays_stopped_when_resumed(tmp_path):
    # six SFT steps teach nothing: every sample is wrong, and no_learning_signal fires at step 4
    args = [*TINY, "--rl.steps", "12", "--rl.eval_every", "2", "--rl.alerts.action", "rollback",
            "--rl.alerts.monitors", "no_learning_signal", "--out_dir", str(tmp_path)]
    done = subprocess.run([sys.executable, "-m", "posttrain", "train", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run_dir(tmp_path)
    record = json.loads((run / "early_stop.json").read_text())["rl"]
    assert (record["step"], record["restored_step"], record["monitor"]) == (4, 1, "no_learning_signal")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["stage"] == "rl"] == [0, 1, 2, 3, 4]
    last = run / "checkpoints" / "rl" / "step_000004"
    best = run / "checkpoints" / "rl_best" / "step_000001"
    assert (last / "model.safetensors").read_bytes() == (best / "model.safetensors").read_bytes()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["early_stop"]["step"] == 4
    assert "RL stopped after step 4 of 12" in (run / "summary.md").read_text()

    resumed = subprocess.run([sys.executable, "-m", "posttrain", "train", "--resume", str(run)],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows_after = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_after if r["stage"] == "rl"] == [0, 1, 2, 3, 4]
