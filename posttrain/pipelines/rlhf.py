"""RLHF end to end: SFT → reward model → PPO against the reward model, with a gold scorer
watching (`posttrain rlhf`).

The recipe of Ziegler et al. 2019 and InstructGPT (Ouyang et al. 2022), on a task where
the truth is known:

    1. SFT          the policy learns the format from demonstrations (pipelines/sft.py)
    2. preferences  the SFT policy samples K completions per prompt; a "rater" ranks them.
                    Here the rater is the verifier, so every label is right: correct ≻ wrong
    3. reward model a Bradley–Terry model r_φ(x, y), initialised from the SFT policy, fit to
                    those pairs (rewards/reward_model.py); its pairwise accuracy on pairs from
                    held-out (dev) prompts is measured and saved with it
    4. RL           PPO maximises r_φ − β·KL(π ‖ π_ref) (pipelines/rl.py, unchanged)

The point of having a verifier is step 4's second line of numbers. r_φ is a *proxy*: a
small network fit to a few thousand pairs, right on most of what the SFT policy writes
and unconstrained elsewhere. PPO pushes the policy toward wherever r_φ is high, which
includes wherever r_φ is wrong, so the proxy reward keeps rising while the gold reward
(the verifier's, which never trains anything here) rises, then can stall or fall: reward
over-optimisation (Gao, Schulman & Hilton 2022, "Scaling Laws for Reward Model
Overoptimization"). The KL anchor is what limits how far the policy can chase the proxy.

How it plugs into the RL loop without forking it: `rewards/proxy.py::ProxyReward` has the
scorer contract `score(example, completion) -> {reward, details}`, with r_φ as the reward
and the verifier's verdict kept in the details. `rl.rm.path` makes `build.make_reward`
use it, so `posttrain train --algo grpo --rl.rm.path DIR` trains any algorithm against a
saved reward model too.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import torch

from posttrain.config import TrainConfig
from posttrain.config.files import to_dict
from posttrain.data.preference import save_preference_jsonl
from posttrain.envs import make_env
from posttrain.models import load_checkpoint_model, load_tokenizer, make_policy
from posttrain.models.device import place, resolve_device, use_threads
from posttrain.models.policy import SavablePolicy
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.pipelines.preference import verifier_pairs
from posttrain.pipelines.run import run_pipeline
from posttrain.pipelines.sft import sft_stage
from posttrain.rewards.reward_model import (
    RewardModel,
    check_reward_model_dir,
    load_reward_model,
    pairwise_accuracy,
    save_reward_model,
)
from posttrain.rewards.reward_model_training import train_reward_model
from posttrain.runs.checkpoints import latest_checkpoint
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed
from posttrain.types import Environment, PreferencePair, Tokenizer

Scored = dict[str, Any]


# ---------------------------------------------------------------------------------------
# steps 2 and 3: preference pairs from the SFT policy, a reward model fit to them
# ---------------------------------------------------------------------------------------


def reward_model_pairs(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer,
                       policy: SavablePolicy) -> tuple[list[PreferencePair], list[PreferencePair], dict]:
    """(train pairs, held-out pairs, stats): rm.prompts train prompts and rl.dev_size dev
    prompts, samples_per_prompt samples each at rm.temperature, ranked by the verifier."""

    hot = dataclasses.replace(cfg, rl=dataclasses.replace(
        cfg.rl, sampling=dataclasses.replace(cfg.rl.sampling, temperature=cfg.rl.rm.temperature)))
    train, train_stats = verifier_pairs(hot, env, tokenizer, policy, round=0, n_prompts=cfg.rl.rm.prompts)
    heldout, heldout_stats = verifier_pairs(hot, env, tokenizer, policy, round=0, n_prompts=cfg.rl.dev_size,
                                            split="dev")
    if not train or not heldout:
        raise ValueError(f"the SFT policy's samples gave {len(train)} training and {len(heldout)} held-out pairs: "
                         "its samples of a prompt were all right or all wrong. Raise rl.rm.temperature "
                         f"(now {cfg.rl.rm.temperature}), rl.samples_per_prompt or rl.rm.prompts")
    return train, heldout, {"train": train_stats, "heldout": heldout_stats}


def reward_model_dirs(cfg: TrainConfig, run: RunDir) -> list[Path]:
    """Where `posttrain rlhf` keeps its reward model(s): reward_model/, or reward_model_<i>/
    for each member of an rl.rm.ensemble_size ensemble."""
    size = cfg.rl.rm.ensemble_size
    return [run.path / "reward_model"] if size == 1 else [run.path / f"reward_model_{i}" for i in range(size)]


def train_and_save_reward_models(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer,
                                 policy: SavablePolicy) -> list[Path]:
    """Fit r_φ to the SFT policy's verifier-ranked pairs, report its held-out accuracy,
    save it to runs/<id>/reward_model/. An ensemble's members train on the same pairs, each
    on its own bootstrap resample of them and its own seed (bagging: the cheapest way to
    members whose errors differ; they still share the SFT body they start from)."""

    train, heldout, stats = reward_model_pairs(cfg, env, tokenizer, policy)
    save_preference_jsonl(train, run.path / "rm_pairs_train.jsonl")
    save_preference_jsonl(heldout, run.path / "rm_pairs_heldout.jsonl")
    console.print(f"reward model: {len(train)} training pairs, {len(heldout)} held-out pairs")
    rm = cfg.rl.rm
    run.truncate_jsonl("metrics.jsonl", lambda row: row.get("stage") != "rm")  # a retry after a kill starts over
    saved = []
    for member, directory in enumerate(reward_model_dirs(cfg, run)):
        seed = derive_seed(cfg.seed, "rm" if rm.ensemble_size == 1 else f"rm{member}")
        pairs = train
        if rm.ensemble_size > 1:
            draw = torch.Generator().manual_seed(seed)
            pairs = [train[i] for i in torch.randint(len(train), (len(train),), generator=draw).tolist()]
        # InstructGPT initialises the reward model from the SFT model: the body already reads the task
        model, history = train_reward_model(pairs, RewardModel.from_policy(policy, rm.pooling), tokenizer,
                                            steps=rm.steps, lr=rm.lr, batch_size=rm.batch_size, seed=seed,
                                            micro_batch_size=rm.micro_batch_size)
        run.append_jsonl("metrics.jsonl", [{"stage": "rm", "member": member, "step": i, **h}
                                           for i, h in enumerate(history)])
        info = {"train_pairs": len(train), "heldout_pairs": len(heldout),
                "train_accuracy": pairwise_accuracy(model, train, tokenizer),
                "heldout_accuracy": pairwise_accuracy(model, heldout, tokenizer),
                "pairs": stats, "steps": rm.steps, "lr": rm.lr, "batch_size": rm.batch_size, "pooling": rm.pooling,
                "temperature": rm.temperature, "seconds": history[-1]["seconds"], "member": member,
                "bootstrap": rm.ensemble_size > 1}
        console.print(f"[bold]reward model[/]{f' {member}' if rm.ensemble_size > 1 else ''}: pairwise accuracy "
                      f"{info['train_accuracy']:.3f} on its training pairs, {info['heldout_accuracy']:.3f} on "
                      f"{len(heldout)} held-out pairs (chance 0.5)")
        saved.append(save_reward_model(model, directory, tokenizer, info))
    return saved


# ---------------------------------------------------------------------------------------
# the whole job
# ---------------------------------------------------------------------------------------


def run_rlhf(cfg: TrainConfig, run: RunDir) -> dict:
    """SFT → reward model → RL against it → held-out eval → summary and the proxy-vs-gold
    plot. Safe to call again on a partly finished run directory."""

    use_threads(cfg.threads)
    if not cfg.rl.rm.path:
        rm_dirs = reward_model_dirs(cfg, run)
        try:
            for directory in rm_dirs:
                check_reward_model_dir(directory)
        except ValueError:  # not trained yet (or killed while training: it is short, so redo it)
            env = make_env(cfg.env.name, **cfg.env.kwargs())
            if cfg.init:  # a checkpoint or any transformers model, as run_pipeline reads it
                start = resolve_model_dir(cfg.init)
                policy, tokenizer = load_checkpoint_model(start, cfg.model), load_tokenizer(start, cfg.model)
                place(policy, resolve_device(cfg.device), cfg.dtype)
            else:  # the same SFT run_pipeline does; it finds the checkpoint and skips SFT
                torch.manual_seed(derive_seed(cfg.seed, "init"))
                policy, tokenizer = make_policy(cfg.model)
                place(policy, resolve_device(cfg.device), cfg.dtype)
                if cfg.sft.steps:  # without SFT the reward model reads the model as built
                    sft_stage(cfg, run, env, tokenizer, policy)
                    policy.load_state_dict(load_checkpoint_model(latest_checkpoint(run, "sft"),
                                                                 policy.config).state_dict())
            train_and_save_reward_models(cfg, run, env, tokenizer, policy)
        path = ",".join(str(directory) for directory in rm_dirs)
        cfg = dataclasses.replace(cfg, rl=dataclasses.replace(cfg.rl, rm=dataclasses.replace(cfg.rl.rm, path=path)))
        run.write_json("config.json", to_dict(cfg))  # a resumed run trains against this reward model
    summary = run_pipeline(cfg, run)
    return write_rlhf_report(run, cfg, summary)


def gold_trajectory(run: RunDir) -> list[dict]:
    """Per RL step: mean proxy reward, mean gold reward (from every sample's details), KL to
    the reference and dev pass@1 where measured."""
    gold: dict[int, list[float]] = {}
    for row in run.read_jsonl("samples.jsonl"):
        if row.get("stage") == "rl" and "gold_reward" in row.get("details", {}):
            gold.setdefault(row["step"], []).append(row["details"]["gold_reward"])
    out = []
    for row in run.read_jsonl("metrics.jsonl"):
        if row.get("stage") == "rl" and row["step"] in gold:
            out.append({"step": row["step"], "proxy_reward": row["reward_mean"],
                        "gold_reward": sum(gold[row["step"]]) / len(gold[row["step"]]),
                        "kl_ref": row.get("kl_ref", float("nan")),
                        **({"dev_pass@1": row["dev_pass@1"]} if "dev_pass@1" in row else {})})
    return out


def write_rlhf_report(run: RunDir, cfg: TrainConfig, summary: dict) -> dict:

    infos = [load_reward_model(directory)[1] for directory in cfg.rl.rm.paths()]
    info = infos[0] if len(infos) == 1 else ensemble_info(infos, cfg.rl.rm.ensemble)
    rows = gold_trajectory(run)
    if not rows:
        return summary
    write_rlhf_plot(rows, run.path / "rlhf_reward.png", info.get("heldout_accuracy"))
    # single steps of a few hundred samples are noisy: peaks and ends of 10-step moving averages
    proxy = moving_average([r["proxy_reward"] for r in rows])
    gold = moving_average([r["gold_reward"] for r in rows])
    peak_gold, peak_proxy = max(range(len(rows)), key=gold.__getitem__), max(range(len(rows)), key=proxy.__getitem__)
    report = {"reward_model": info, "trajectory": rows,
              "gold_peak": {"step": rows[peak_gold]["step"], "gold_reward": gold[peak_gold],
                            "proxy_reward": proxy[peak_gold]},
              "proxy_peak": {"step": rows[peak_proxy]["step"], "proxy_reward": proxy[peak_proxy],
                             "gold_reward": gold[peak_proxy]},
              "gold_last10": gold[-1], "proxy_last10": proxy[-1]}
    run.write_json("rlhf.json", report)
    accuracy = info.get("heldout_accuracy", float("nan"))
    lines = ["## RLHF", "",
             ("Reward model: " if "members" not in info else
              f"Reward models (an ensemble of {len(info['members'])}, combined by {info['ensemble']}), mean ")
             + f"pairwise accuracy {accuracy:.3f} on {info.get('heldout_pairs')} held-out pairs "
             f"(chance 0.5), {info.get('train_accuracy', float('nan')):.3f} on its {info.get('train_pairs')} "
             "training pairs.",
             "",
             "Training samples, 10-step moving averages: proxy (reward model) from "
             f"{proxy[0]:.3f} to a peak of {proxy[peak_proxy]:.3f} at step {rows[peak_proxy]['step']} (gold there "
             f"{gold[peak_proxy]:.3f}); gold (verifier) peaked at {gold[peak_gold]:.3f} at step "
             f"{rows[peak_gold]['step']}; last 10 steps: proxy {proxy[-1]:.3f}, gold {gold[-1]:.3f}. "
             "Plot: rlhf_reward.png."]
    # idempotent: a resumed run rewrites its own section instead of adding a second one
    text = (run.path / "summary.md").read_text().split("\n## RLHF\n")[0].rstrip("\n")
    (run.path / "summary.md").write_text(text + "\n\n" + "\n".join(lines) + "\n")
    return {**summary, "rlhf": {k: v for k, v in report.items() if k != "trajectory"}}


def ensemble_info(infos: list[dict], how: str) -> dict:
    """The report's reward-model line for an ensemble: its members' mean accuracies."""
    mean = lambda key: sum(i.get(key, float("nan")) for i in infos) / len(infos)  # noqa: E731
    return {**infos[0], "members": infos, "ensemble": how, "train_accuracy": mean("train_accuracy"),
            "heldout_accuracy": mean("heldout_accuracy")}


def moving_average(values: list[float], window: int = 10) -> list[float]:
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def write_rlhf_plot(rows: list[dict], path: Path, rm_accuracy: float | None = None) -> None:
    """Proxy and gold reward on one chart over RL steps (two y axes: the reward model's
    scale is arbitrary, the verifier's is 0..1), and both against KL to the reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    proxy, gold = moving_average([r["proxy_reward"] for r in rows]), moving_average([r["gold_reward"] for r in rows])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    left.plot(steps, proxy, color="tab:red", label="proxy: reward model")
    left.set_xlabel("RL step")
    left.set_ylabel("proxy reward (reward model)", color="tab:red")
    gold_axis = left.twinx()
    gold_axis.plot(steps, gold, color="tab:blue", label="gold: verifier, training samples")
    dev = [(r["step"], r["dev_pass@1"]) for r in rows if "dev_pass@1" in r]
    if dev:
        gold_axis.plot(*zip(*dev), "o--", color="tab:cyan", markersize=4, label="gold: dev pass@1 (greedy)")
    gold_axis.set_ylabel("gold reward (verifier)", color="tab:blue")
    gold_axis.set_ylim(0, 1)
    handles = left.get_legend_handles_labels()[0] + gold_axis.get_legend_handles_labels()[0]
    left.legend(handles, [h.get_label() for h in handles], loc="best", fontsize=8)
    title = "proxy vs gold reward, 10-step averages"
    left.set_title(title + (f" (RM held-out acc. {rm_accuracy:.2f})" if rm_accuracy is not None else ""), fontsize=10)
    left.grid(alpha=0.3)

    # Gao et al. plot reward against the distance from the start: sqrt(KL) on the x axis.
    # KL need not grow monotonically under a KL penalty, so points, not a line.
    kl = moving_average([math.sqrt(max(r["kl_ref"], 0.0)) if math.isfinite(r["kl_ref"]) else float("nan")
                         for r in rows])
    right.scatter(kl, proxy, color="tab:red", s=8, label="proxy")
    right.set_xlabel("sqrt(KL(π ‖ π_ref)) per token (10-step moving averages; one point per step)")
    right.set_ylabel("proxy reward", color="tab:red")
    gold_kl = right.twinx()
    gold_kl.scatter(kl, gold, color="tab:blue", s=8, label="gold")
    gold_kl.set_ylabel("gold reward", color="tab:blue")
    gold_kl.set_ylim(0, 1)
    right.set_title("against distance from the reference", fontsize=10)
    right.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
