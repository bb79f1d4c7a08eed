"""Loop A — measure: score a checkpoint's held-out completions and save everything.

Nothing is trained or selected here. The environment's own verifier scores (whichever
is registered: `--env.name math --env.path FILE` is scored by math/boxed-or-final-v2).
The run directory records `loop: A`, the spec version that scored it, and every raw
completion with its score details, so a number can always be traced back to the strings
that produced it.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.command_configs import EvalConfig
from posttrain.config import SamplingParams
from posttrain.config_file import to_dict
from posttrain.envs import make_env
from posttrain.eval.completions import print_report, score_records
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.roles.rollout import RolloutEngine, encode_prompt
from posttrain.runs.rundir import RunDir


def evaluate_checkpoint(cfg: EvalConfig) -> dict:
    env = make_env(cfg.env.name, **cfg.env.kwargs())
    model = load_checkpoint_model(Path(cfg.checkpoint), None)
    tokenizer = load_tokenizer(Path(cfg.checkpoint))
    examples = env.fixed_set(cfg.split, cfg.size, seed=cfg.seed)
    max_new = model.config.max_seq_len - max(len(encode_prompt(tokenizer, e.prompt)) for e in examples)
    # greedy: pass@1 becomes a property of the weights, not of a sampling seed
    engine = RolloutEngine(model, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=min(64, max_new),
                                                            stop_at_newline=not cfg.env.cot))
    episodes = engine.generate(examples, 1)
    # meta travels with the record: a code problem's tests are in it
    records = [{"id": e.example.id, "prompt": e.example.prompt, "expected_answer": e.example.expected_answer,
                "meta": e.example.meta, "completion": e.completion} for e in episodes]
    result = score_records(records, env.spec_version)  # the same report as for a completions file

    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "A (eval)", "spec_version": env.spec_version, "checkpoint": str(cfg.checkpoint),
                    "dataset": {"env": cfg.env.name, "level": cfg.env.level, "path": cfg.env.path,
                                "split": cfg.split, "size": cfg.size},
                    "sampling": {"temperature": 0.0, "decoding": "greedy"}})
    run.write_jsonl("samples.jsonl", result.pop("samples"))
    run.write_json("summary.json", {**result, "eval": result["ci"]})
    print_report(result)
    print(f"run directory: {run.path}")
    return result["ci"]
