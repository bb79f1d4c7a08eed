"""The tiny end-to-end pipeline on a CUDA GPU, float32 and bfloat16. Skipped where no CUDA
device is visible (this repository's own machine: a CPU); run with `pytest -m gpu`.
What the CPU can check about devices without a GPU is in test_devices.py."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from posttrain.envs import make_env
from posttrain.models import save_checkpoint_model
from posttrain.models.device import place
from posttrain.pipelines.build import build_controller
from posttrain.pipelines.checks import check_config
from posttrain.config.scoring import EvalConfig
from tests.test_devices import tiny_config, tiny_policy

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device is visible")]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_tiny_pipeline_on_cuda(tmp_path, dtype):
    from posttrain.eval.loop_a import evaluate_checkpoint
    from posttrain.pipelines.run import run_pipeline, start_run

    cfg = tiny_config(out_dir=str(tmp_path / "runs"), device="cuda", dtype=dtype, name=dtype)
    check_config(cfg)
    run = start_run(cfg, "test")
    summary = run_pipeline(cfg, run)
    assert summary["final_stage"] == "rl" and 0 <= summary["rl"]["mean"] <= 1
    meta = json.loads((run.path / "meta.json").read_text())
    assert meta["device"]["resolved"].startswith("cuda") and meta["device"]["dtype"] == dtype and meta["device"]["name"]
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["entropy"]) for r in rows if r["stage"] == "rl")

    checkpoint = sorted((run.path / "checkpoints").glob("rl/step_*"))[-1]
    eval_cfg = EvalConfig(checkpoint=str(checkpoint), size=8, out_dir=str(tmp_path / "eval"), device="cuda",
                          dtype=dtype)
    check_config(eval_cfg)
    ci = evaluate_checkpoint(eval_cfg)
    assert ci["n"] == 8


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_an_rl_step_keeps_everything_on_the_gpu(tmp_path, algo):
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, algo=algo)
    policy, tokenizer = tiny_policy()
    save_checkpoint_model(policy, tokenizer, tmp_path / "start")
    place(policy, "cuda", "bfloat16")
    controller = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, tmp_path / "start")
    controller.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    metrics, _ = controller.step(0)
    assert math.isfinite(metrics["pg_loss"]) and metrics["grad_norm"] > 0
    assert all(p.device.type == "cuda" for p in policy.parameters())
    assert all(p.device.type == "cuda" for p in controller.reference.model.parameters())
