"""The run summary shows hacking and collapse warnings instead of hiding them."""

import json
from types import SimpleNamespace

from posttrain.runs.report import write_plots, write_summary
from posttrain.runs.rundir import RunDir


def test_summary_carries_monitor_warnings_and_separated_cis(tmp_path):
    run = RunDir.create(str(tmp_path), "r")
    # reward keeps rising while dev pass@1 falls from 0.8 to 0.5, and lengths triple
    rows = [{"stage": "rl", "step": i, "reward_mean": 0.5 + 0.02 * i, "response_length": 30 + 6 * i,
             "kl_ref": 0.01, "time/rollout": 1.0, **({"dev_pass@1": 0.8 - 0.1 * (i // 5)} if i % 5 == 4 else {})}
            for i in range(20)]
    run.append_jsonl("metrics.jsonl", rows)
    results = {"sft": {"mean": 0.5, "ci_low": 0.45, "ci_high": 0.55, "n": 500},
               "rl": {"mean": 0.7, "ci_low": 0.66, "ci_high": 0.74, "n": 500}}
    cfg = SimpleNamespace(rl=SimpleNamespace(algo="grpo"), seed=0)
    write_summary(run, results, cfg, "final_int/cot-v1")
    write_plots(run)
    summary = json.loads((run.path / "summary.json").read_text())
    assert abs(summary["rl_gain"] - 0.2) < 1e-9 and summary["cis_overlap"] is False
    assert summary["rl_wall_seconds"] == 20.0
    monitors = " ".join(summary["warnings"])
    assert "dev_pass@1 fell" in monitors and "response_length" in monitors
    assert "## Warnings" in (run.path / "summary.md").read_text()
    assert (run.path / "reward_curve.png").stat().st_size > 5_000


def test_summary_says_kl_was_not_measured_rather_than_nan(tmp_path):
    run = RunDir.create(str(tmp_path), "r")
    run.append_jsonl("metrics.jsonl", [{"stage": "rl", "step": 0, "reward_mean": 0.5, "response_length": 9.0,
                                        "time/step": 2.0}])
    results = {"sft": {"mean": 0.35, "ci_low": 0.28, "ci_high": 0.41, "n": 200},
               "rl": {"mean": 0.49, "ci_low": 0.42, "ci_high": 0.56, "n": 200}}
    write_summary(run, results, SimpleNamespace(rl=SimpleNamespace(algo="grpo"), seed=0), "final_int/cot-v1")
    text = " ".join((run.path / "summary.md").read_text().split())
    assert "KL to reference not measured (rl.kl.track false), entropy 0.000" in text and "nan" not in text
    run.append_jsonl("metrics.jsonl", [{"stage": "rl", "step": 1, "reward_mean": 0.5, "response_length": 9.0,
                                        "kl_ref": 0.0214, "time/step": 2.0}])
    write_summary(run, results, SimpleNamespace(rl=SimpleNamespace(algo="grpo"), seed=0), "final_int/cot-v1")
    assert "KL to reference 0.0214, entropy" in " ".join((run.path / "summary.md").read_text().split())


def test_summary_puts_the_noise_rule_beside_the_paired_before_after(tmp_path):
    run = RunDir.create(str(tmp_path), "r")
    results = {"sft": {"mean": 0.50, "ci_low": 0.38, "ci_high": 0.62, "n": 64},
               "rl": {"mean": 0.53, "ci_low": 0.41, "ci_high": 0.66, "n": 64},
               # as eval/comparison.py's paired_scores gives it: two of 64 problems moved
               "rl_vs_sft": {"mean_diff": 2 / 64, "ci_low": 0.0, "ci_high": 0.078, "verdict": "within noise",
                             "n_shared": 64, "noise_rule": {"verdict": "likely noise", "reason":
                                                            "N = 64 < 100 and |difference| = 3.1 <= 5 points"}}}
    write_summary(run, results, SimpleNamespace(rl=SimpleNamespace(algo="grpo"), seed=0), "final_int/cot-v1")
    text = " ".join((run.path / "summary.md").read_text().split())
    assert ("Paired over the 64 held-out problems both scored: +3.1 points (95% CI +0.0 to +7.8), within noise; "
            "noise rule: likely noise (N = 64 < 100 and |difference| = 3.1 <= 5 points).") in text
    assert json.loads((run.path / "summary.json").read_text())["rl_vs_sft"]["noise_rule"]["verdict"] == "likely noise"
