"""Loop A — measure: score a checkpoint's held-out completions and save everything.

Nothing is trained or selected here. The run directory records `loop: A`, the spec
version that scored it, and every raw completion with its score details, so a number
can always be traced back to the strings that produced it.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.config import EvalConfig, to_dict
from posttrain.envs import make_env
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.eval.rundir import RunDir
from posttrain.models import load_checkpoint_model
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.rollout import RolloutEngine, SamplingParams


def evaluate_checkpoint(cfg: EvalConfig) -> dict:
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    model = load_checkpoint_model(Path(cfg.checkpoint), None)
    tokenizer = CharTokenizer.load(cfg.checkpoint)
    examples = env.fixed_set(cfg.split, cfg.size, seed=cfg.seed)
    max_new = model.config.max_seq_len - max(len(tokenizer.encode(e.prompt)) + 1 for e in examples)
    engine = RolloutEngine(model, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=min(64, max_new),
                                                            stop_at_newline=not cfg.env.cot))
    result = evaluate_pass_at_1(engine, env, examples)

    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "A (eval)", "spec_version": env.spec_version, "checkpoint": str(cfg.checkpoint),
                    "dataset": {"env": cfg.env.name, "level": cfg.env.level, "split": cfg.split, "size": cfg.size},
                    "sampling": {"temperature": 0.0, "decoding": "greedy"}})
    run.write_jsonl("samples.jsonl", [
        {"id": e.example.id, "prompt": e.example.prompt, "completion": e.completion, "reward": e.reward,
         "details": e.details} for e in result["episodes"]])
    ci = result["ci"]
    run.write_json("summary.json", {"eval": ci, "spec_version": env.spec_version})
    print(f"{cfg.split} pass@1 = {ci['mean']:.3f} (95% CI {ci['ci_low']:.3f}–{ci['ci_high']:.3f}, n={ci['n']})")
    print(f"run directory: {run.path}")
    return ci
