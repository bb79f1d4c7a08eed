"""`posttrain systems` and the wall-clock decision tree: does a model fit, where will the time
go, where did a run's time go; bad settings refused with the value and what to do."""

import json

import pytest

from posttrain.cli import main
from posttrain.systems.hardware import DEVICES, Cluster
from posttrain.systems.plan import JobSettings, engine_tensor_parallel, job_memory, plan
from posttrain.systems.shapes import PRESETS
from posttrain.systems.throughput import DEFAULT_LEVERS, Workload
from posttrain.systems.wallclock import open_levers, render, topology_of, where_time_goes

WORKLOAD = Workload(prompts=64, samples_per_prompt=8, prompt_tokens=512, mean_response_tokens=1024)


def rl_row(index, **times):
    base = {"stage": "rl", "step": index, "truncated_fraction": 0.0, "response_length": 40.0, "skipped_rows": 0.5}
    return {**base, **{f"time/{k}": v for k, v in times.items()}}


def test_tree_finds_the_long_tail_and_what_async_would_hide():
    rows = [rl_row(s, rollout=6.0, score=0.1, reference=1.0, train=2.5, sync=0.0, step=9.8) for s in range(4)]
    for r in rows:
        r["truncated_fraction"] = 0.4
    clock = where_time_goes(rows)
    assert clock.topology == "colocated" and clock.step_seconds == pytest.approx(9.8)
    assert clock.outside_seconds == pytest.approx(0.2)
    text = " ".join(clock.findings)
    assert "rollout takes 61%" in text and "40% of responses hit max_new_tokens" in text
    assert "async one step ahead would overlap" in text and "3.60 s" in text  # min(rollout, trainer side)
    assert "| rollout | 6.000 | 61% |" in render(clock)


def test_tree_sees_evaluation_ray_overhead_and_async():
    rows = [rl_row(s, rollout=2.0, rollout_compute=1.0, score=0.0, reference=0.2, train=0.5, sync=0.1, step=4.0,
                   dev_eval=1.0) for s in range(3)]
    clock = where_time_goes(rows)
    assert clock.topology == "sync" and clock.rollout_compute_seconds == 1.0
    text = " ".join(clock.findings)
    assert "30% of the step is outside the five roles" in text and "dev evaluation 1.00 s" in text
    assert "Ray's dispatch" in text
    stale = [{**r, "staleness_max": 1, "time/rollout_compute": 3.0, "time/rollout": 0.3} for r in rows]
    assert topology_of(stale) == "async"
    assert "the rollout (workers sampling) binds" in " ".join(where_time_goes(stale).findings)
    with pytest.raises(ValueError, match="time/step"):
        where_time_goes([{"stage": "rl", "step": 0}])


def test_plan_fits_and_the_first_fix():
    eight = Cluster(DEVICES["h100-80gb"], 8)
    assert plan(PRESETS["llama-3-8b"], eight, JobSettings(), WORKLOAD).fit.fits
    unsharded = plan(PRESETS["llama-3-8b"], eight, JobSettings(zero_stage=0), WORKLOAD)
    assert not unsharded.fit.fits and "ZeRO stage" in unsharded.fix
    stage = int(unsharded.fix.split("ZeRO stage ")[1][0])
    assert job_memory(PRESETS["llama-3-8b"], eight, JobSettings(zero_stage=stage), WORKLOAD).fits
    one = plan(PRESETS["llama-3-8b"], Cluster(DEVICES["a100-40gb"], 1), JobSettings(), WORKLOAD)
    assert not one.fit.fits and "add GPUs" in one.fix  # 8B × 16 bytes on one 40 GB card
    assert engine_tensor_parallel(70.6e9, 2, 80e9, 8) == 8 and engine_tensor_parallel(8e9, 2, 80e9, 8) == 1


def test_the_plan_prices_a_length_cap_for_its_own_lengths():
    p = plan(PRESETS["llama-3-8b"], Cluster(DEVICES["h100-80gb"], 8), JobSettings(), WORKLOAD)
    cap = next(g for g in p.levers if g.lever.name.startswith("length cap at 4,096"))
    assert 0 < cap.lever.factors["rollout"] < 1 and cap.saved_seconds > 0
    short = plan(PRESETS["llama-3-8b"], Cluster(DEVICES["h100-80gb"], 8), JobSettings(),
                 Workload(64, 8, 512, 1024, response_cv=0.1))  # nothing reaches 4 × the mean: the cap saves nothing
    assert next(g for g in short.levers if g.lever.name.startswith("length cap")).saved_seconds == pytest.approx(0)


def test_dpo_plans_no_rollout():
    p = plan(PRESETS["qwen2.5-0.5b"], Cluster(DEVICES["l4-24gb"], 1), JobSettings(algo="dpo"), WORKLOAD)
    assert p.times.rollout == 0 and p.fit.memory.kv_cache_bytes == 0
    assert all("rollout" not in c.role for c in p.fit.memory.copies)


def test_command_answers_for_a_preset(capsys):
    assert main(["systems", "--model", "llama-3-8b", "--gpus", "8", "--gpu", "h100-80gb"]) == 0
    out = capsys.readouterr().out
    assert "8.03B parameters" in out and "GQA (32 query heads, 8 KV heads of 128)" in out
    assert "fits: yes" in out and "## Where will the time go?" in out and "levers, alone" in out


def test_command_reads_a_config_json_and_a_run(tmp_path, capsys):
    config = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
              "num_attention_heads": 4, "num_key_value_heads": 1, "vocab_size": 1000, "max_position_embeddings": 512}
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    run = tmp_path / "run"
    run.mkdir()
    rows = [rl_row(s, rollout=1.0, score=0.0, reference=0.4, train=0.5, sync=0.0, step=2.0) for s in range(2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["systems", "--model", str(tmp_path / "model"), "--gpus", "1", "--gpu", "l4-24gb",
                 "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "MQA (4 query heads, 1 KV heads of 64)" in out and "## Where did the time go?" in out
    assert main(["systems", "--run", str(run)]) == 0  # the run alone: no plan
    assert "## Does it fit?" not in capsys.readouterr().out


@pytest.mark.parametrize("flags,message", [
    (["--model", "gpt-9"], "neither a preset"),
    (["--gpu", "tpu-v9"], "device 'tpu-v9' is not known"),
    (["--zero_stage", "4"], "zero_stage=4 is not allowed"),
    (["--precision", "fp4"], "precision='fp4'"),
    (["--dtype", "fp7"], "dtype 'fp7' is not known"),
    (["--algo", "sac"], "algo='sac' is not allowed"),
    (["--run", "/nonexistent"], "no metrics.jsonl"),
])
def test_command_refuses_bad_settings(flags, message, capsys):
    assert main(["systems", *flags]) == 2
    assert message in capsys.readouterr().err


def test_open_levers_leave_out_what_a_run_already_does():
    rows = [rl_row(s, rollout=6.0, reference=1.0, train=2.5, step=9.6) for s in range(2)]
    config = {"rl": {"update": {"share_prompt": True, "skip_inert_rows": False}, "sampling": {"weights": "float32"}},
              "dist": {"topology": "auto"}}
    names = [lever.name for lever in open_levers(config, rows, DEFAULT_LEVERS)]
    assert "each prompt once per group" not in names and "skip rows with no gradient" in names
    assert "async, one step ahead" in names and "low-precision rollout" in names
    assert not any(n.startswith("length cap") for n in names)  # nothing reached max_new_tokens: no tail to cut
    for r in rows:
        r["truncated_fraction"] = 0.3
    config["dist"]["topology"], config["rl"]["sampling"]["weights"] = "async", "int8"
    names = [lever.name for lever in open_levers(config, rows, DEFAULT_LEVERS)]
    assert any(n.startswith("length cap") for n in names)
    assert "async, one step ahead" not in names and "low-precision rollout" not in names
