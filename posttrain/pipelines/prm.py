"""`posttrain prm`: an outcome or process reward model, trained and measured.

    1. policy     --init (a checkpoint, a transformers directory, smollm2-135m), or a short
                  SFT of gpt_mini on arithmetic (pipelines/sft.py, `posttrain run`'s)
    2. labels     --data FILE (TRL's stepwise format, data/stepwise.py), split by prompt or
                  held out by --heldout_data; or the policy's own samples on its task (train
                  split for training, dev split held out), every step labelled by the step
                  checker (arithmetic) or by Monte-Carlo rollouts (any task), every completion
                  by the verifier (its outcome): pipelines/prm_labels.py
    3. training   a copy of the policy as the body, a zero scalar head, BCE on step labels
                  (prm) or outcomes (orm): rewards/process_reward_model.py
    4. report     on the held-out completions: step accuracy (prm), outcome AUROC (orm; prm
                  through each aggregation), ECE over 10 bins and the reliability table,
                  each with a 95% bootstrap CI over completions (eval/calibration.py);
                  beside them the untrained baseline, the policy's own step log-probability
                  (policy_confidence), which a trained model has to beat to be worth its cost

The run directory: config.json, meta.json, prm_train.jsonl / prm_heldout.jsonl (the
labelled data, re-readable with --data and --heldout_data), metrics.jsonl (one line per
training step), reward_model/ (load it with rewards.process_reward_model.load_step_scorer),
summary.json, summary.md.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

import torch

from posttrain.config.commands import PrmConfig
from posttrain.config.files import to_dict
from posttrain.data.stepwise import load_stepwise, save_stepwise_jsonl, split_by_prompt
from posttrain.envs import make_env
from posttrain.eval.calibration import (
    accuracy,
    auroc,
    expected_calibration_error,
    grouped_bootstrap_ci,
    reliability_table,
)
from posttrain.eval.loop_a import describe
from posttrain.models.device import autocast, model_device
from posttrain.models.logprobs import token_logp
from posttrain.models.policy import Policy
from posttrain.pipelines.prm_labels import labelled_samples, load_policy, prm_task
from posttrain.rewards.process_reward_model import (
    AGGREGATIONS,
    StepRecord,
    StepRewardScorer,
    encode_steps,
    get_step_format,
    save_step_reward_model,
    task_step_format,
    train_step_reward_model,
)
from posttrain.rewards.reward_model import RewardModel, collate_texts
from posttrain.runs.console import console
from posttrain.runs.rundir import RunDir
from posttrain.seeds import derive_seed
from posttrain.types import Tokenizer

# ---------------------------------------------------------------------------------------
# 4: the held-out report
# ---------------------------------------------------------------------------------------


@torch.no_grad()
def policy_confidence(policy: Policy, tokenizer: Tokenizer, records: list[StepRecord], step_format: str,
                      batch_size: int = 64) -> list[list[float]]:
    """The baseline a trained reward model has to beat, at no training cost: the policy's own
    mean token log-probability of each step (its separator included), as a running minimum
    over the steps so far, so that it follows the first-error labels (once an unlikely step
    was written, every later one is suspect too). A wrong sum is usually an unlikely token
    for the SFT policy (docs/guides/preference.md, "RLHF end to end"). One score per step; a ranking, not a
    probability, so it gets an AUROC and no calibration."""
    fmt = get_step_format(step_format)
    device = model_device(policy)
    out = []
    for first in range(0, len(records), batch_size):
        chunk = records[first : first + batch_size]
        rows = [encode_steps(tokenizer, r.prompt, r.steps, fmt, policy.config.max_seq_len) for r in chunk]
        tokens, _ = collate_texts([ids for ids, _ in rows], tokenizer.pad_id)
        with autocast(policy):
            logits = policy(tokens.to(device)).float()  # (B, T, V)
        logp = token_logp(logits, tokens.to(device)).cpu()  # (B, T): logp[:, t] = log π(tok_t | tok_<t)
        for b, (record, (_, positions)) in enumerate(zip(chunk, rows)):
            start = len(encode_steps(tokenizer, record.prompt, [], fmt, policy.config.max_seq_len)[0])  # the prompt
            scores, lowest = [], 0.0
            for end in positions:
                lowest = min(lowest, logp[b, start : end + 1].mean().item())  # mean over the step and its separator
                scores.append(lowest)
                start = end + 1
            out.append(scores)
    return out


def evaluate(scorer: StepRewardScorer, heldout: list[StepRecord], seed: int,
             baseline: list[list[float]] | None = None) -> dict:
    """Every measurement with a 95% CI from resampling whole completions; `baseline`
    (policy_confidence's scores) gets the same AUROCs."""
    prompts = [r.prompt for r in heldout]
    outcomes = [r.outcome for r in heldout]
    report: dict = {"heldout_completions": len(heldout), "outcome_positive_rate": sum(outcomes) / len(outcomes)}

    def ci(groups: Sequence[tuple[Sequence[float], Sequence[float]]],
           statistic: Callable[[list[float], list[float]], float]) -> dict[str, float]:
        return grouped_bootstrap_ci(groups, statistic, seed=seed)

    if scorer.kind == "prm":
        step_probs = scorer.score_steps(prompts, [r.steps for r in heldout])
        groups = [(p, r.labels) for p, r in zip(step_probs, heldout)]
        flat_probs = [p for row in step_probs for p in row]
        flat_labels = [y for r in heldout for y in r.labels]
        positive = sum(y > 0.5 for y in flat_labels) / len(flat_labels)
        report.update({
            "heldout_steps": len(flat_labels),
            "step_positive_rate": positive,
            "step_accuracy": ci(groups, accuracy),
            "step_accuracy_majority_baseline": max(positive, 1 - positive),
            "step_accuracy_on_wrong_steps": ci([(p, y) for p, y in groups], _accuracy_on(0.0)),
            "step_accuracy_on_right_steps": ci([(p, y) for p, y in groups], _accuracy_on(1.0)),
            "step_auroc": ci(groups, auroc),
            "step_ece": ci(groups, expected_calibration_error),
            "step_reliability": reliability_table(flat_probs, flat_labels),
            "outcome_auroc": {name: ci([([aggregate(p)], [o]) for p, o in zip(step_probs, outcomes)], auroc)
                              for name, aggregate in AGGREGATIONS.items()},
        })
        if baseline is not None:
            report["policy_confidence_step_auroc"] = ci([(b, r.labels) for b, r in zip(baseline, heldout)], auroc)
    else:
        probs = scorer.score_outcomes(prompts, [scorer.format.join(r.steps) for r in heldout])
        groups = [([p], [o]) for p, o in zip(probs, outcomes)]
        positive = report["outcome_positive_rate"]
        report.update({
            "outcome_accuracy": ci(groups, accuracy),
            "outcome_accuracy_majority_baseline": max(positive, 1 - positive),
            "outcome_auroc": {"orm": ci(groups, auroc)},
            "outcome_ece": ci(groups, expected_calibration_error),
            "outcome_reliability": reliability_table(probs, outcomes),
        })
    if baseline is not None:
        report["policy_confidence_outcome_auroc"] = ci([([b[-1]], [o]) for b, o in zip(baseline, outcomes)], auroc)
    return report


def _accuracy_on(label: float) -> Callable[[list[float], list[float]], float]:
    """Accuracy over the steps whose label is `label` only (NaN when there are none)."""
    def statistic(probs: list[float], labels: list[float]) -> float:
        kept = [(p, y) for p, y in zip(probs, labels) if (y > 0.5) == (label > 0.5)]
        return accuracy(*zip(*kept)) if kept else float("nan")
    return statistic


def _ci_text(value: dict, percent: bool = True) -> str:
    if value["mean"] != value["mean"]:  # NaN: AUROC or a subset accuracy with one class absent
        return "undefined: the held-out labels hold one class only"
    if percent:
        return f"{value['mean']:.1%} [{value['ci_low']:.1%}, {value['ci_high']:.1%}]"
    return f"{value['mean']:.3f} [{value['ci_low']:.3f}, {value['ci_high']:.3f}]"


def summary_markdown(cfg: PrmConfig, report: dict, data: dict) -> str:
    kind = cfg.kind
    lines = [f"# posttrain prm --kind {kind}", "",
             f"data: {data['source']}; {data['train_records']} training and {report['heldout_completions']} held-out "
             "completions", ""]
    if "samples" in data:
        s = data["samples"]["train"]
        line = (f"policy samples (train split, temperature {cfg.temperature}): {s['outcome_correct']:.1%} correct, "
                f"{s['completions_with_a_wrong_step']:.1%} with a step labelled wrong, {s['steps_labelled_wrong']:.1%} "
                f"of {s['steps']} steps labelled wrong")
        if "steps_whose_arithmetic_fails" in s:
            line += f" ({s['steps_whose_arithmetic_fails']:.1%} with false arithmetic)"
        if "mc_tokens" in s:
            line += (f"; the Monte-Carlo labels cost {s['mc_tokens']:,} sampled tokens "
                     f"({s['mc_tokens'] / s['completions']:.0f} a completion) and {s['mc_seconds']:.0f} s")
        if cfg.labels == "mc" and "labels_agree_with_the_step_checker" in s:
            line += (f"; they agree with the step checker on {s['labels_agree_with_the_step_checker']:.1%} of steps "
                     f"({s['labelled_right_but_wrong_by_the_checker']} labelled right that the checker calls wrong, "
                     f"{s['labelled_wrong_but_right_by_the_checker']} labelled wrong that it calls right)")
        lines += [line, ""]
    lines += ["| held-out measure | value (95% CI, resampling completions) |", "|---|---|"]
    if kind == "prm":
        lines += [f"| step accuracy (p > 0.5) | {_ci_text(report['step_accuracy'])} "
                  f"(majority baseline {report['step_accuracy_majority_baseline']:.1%}) |",
                  f"| ... on steps labelled wrong | {_ci_text(report['step_accuracy_on_wrong_steps'])} |",
                  f"| ... on steps labelled right | {_ci_text(report['step_accuracy_on_right_steps'])} |",
                  f"| step AUROC | {_ci_text(report['step_auroc'], False)} |",
                  f"| step ECE (10 bins) | {_ci_text(report['step_ece'], False)} |"]
        lines += [f"| outcome AUROC, {name} of step scores | {_ci_text(v, False)} |"
                  for name, v in report["outcome_auroc"].items()]
        if "policy_confidence_step_auroc" in report:
            lines += [f"| baseline, no training: step AUROC of the policy's own log-prob | "
                      f"{_ci_text(report['policy_confidence_step_auroc'], False)} |"]
        table = report["step_reliability"]
    else:
        lines += [f"| outcome accuracy (p > 0.5) | {_ci_text(report['outcome_accuracy'])} "
                  f"(majority baseline {report['outcome_accuracy_majority_baseline']:.1%}) |",
                  f"| outcome AUROC | {_ci_text(report['outcome_auroc']['orm'], False)} |",
                  f"| outcome ECE (10 bins) | {_ci_text(report['outcome_ece'], False)} |"]
        table = report["outcome_reliability"]
    if "policy_confidence_outcome_auroc" in report:
        lines += [f"| baseline, no training: outcome AUROC of the policy's own log-prob | "
                  f"{_ci_text(report['policy_confidence_outcome_auroc'], False)} |"]
    lines += ["", "Reliability (held out): predictions binned by probability", "",
              "| bin | n | mean probability | fraction right |", "|---|---|---|---|"]
    lines += [f"| {row['bin']} | {row['n']} | {row['mean_probability']:.3f} | {row['fraction_positive']:.3f} |"
              for row in table if row["n"]]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# the whole job
# ---------------------------------------------------------------------------------------


def run_prm(cfg: PrmConfig) -> dict:
    run = RunDir.create(cfg.out_dir, cfg.name)
    with run:
        run.write_json("config.json", to_dict(cfg))
        run.write_meta({"seed": cfg.seed, "kind": cfg.kind})
        started = time.perf_counter()
        env_cfg, max_new_tokens = prm_task(cfg)
        env = make_env(env_cfg.name, **env_cfg.kwargs())
        policy, tokenizer, sft_seconds = load_policy(cfg, run, env, env_cfg)
        step_format = cfg.step_format or task_step_format(env_cfg.name)
        data: dict = {"sft_seconds": sft_seconds}
        if cfg.data:
            if cfg.heldout_data:
                train, heldout = load_stepwise(cfg.data), load_stepwise(cfg.heldout_data)
                data["source"] = f"{cfg.data}, held out: {cfg.heldout_data}"
            else:
                train, heldout = split_by_prompt(load_stepwise(cfg.data), cfg.heldout_percent)
                data["source"] = f"{cfg.data} ({cfg.heldout_percent}% of prompts held out)"
        else:
            sample_start = time.perf_counter()
            train, train_stats = labelled_samples(cfg, env, step_format, max_new_tokens, policy, tokenizer, "train",
                                                  cfg.prompts)
            heldout, heldout_stats = labelled_samples(cfg, env, step_format, max_new_tokens, policy, tokenizer,
                                                      "dev", cfg.heldout_prompts)
            labels = ("the step checker" if cfg.labels == "checker" else
                      f"Monte-Carlo, {cfg.mc_rollouts} rollouts a step, {cfg.mc_label}")
            data["source"] = (f"the policy's samples, {describe(env_cfg)}: {cfg.prompts} train / {cfg.heldout_prompts} "
                              f"dev problems x {cfg.samples_per_prompt}, steps labelled by {labels}")
            data["samples"] = {"train": train_stats, "heldout": heldout_stats}
            data["sampling_seconds"] = time.perf_counter() - sample_start
        data["train_records"] = len(train)
        data["step_format"] = step_format
        save_stepwise_jsonl(train, run.path / "prm_train.jsonl")
        save_stepwise_jsonl(heldout, run.path / "prm_heldout.jsonl")
        console.print(f"prm: {len(train)} training and {len(heldout)} held-out completions ({data['source']})")

        model = RewardModel.from_policy(policy)  # the body starts as the policy, as InstructGPT's reward model does
        model.requires_grad_(True)

        def show(step: int, metrics: dict) -> None:
            if (step + 1) % 50 == 0 or step + 1 == cfg.steps:
                console.print(f"{cfg.kind} step {step + 1}/{cfg.steps}: loss {metrics['loss']:.4f}, batch accuracy "
                              f"{metrics['accuracy']:.3f}, {metrics['seconds']:.0f} s")

        history = train_step_reward_model(model, tokenizer, train, cfg.kind, step_format, steps=cfg.steps, lr=cfg.lr,
                                          batch_size=cfg.batch_size, seed=derive_seed(cfg.seed, "prm"), on_step=show,
                                          micro_batch_size=cfg.micro_batch_size)
        run.append_jsonl("metrics.jsonl", [{"stage": cfg.kind, "step": i, **h} for i, h in enumerate(history)])
        scorer = StepRewardScorer(model, tokenizer, cfg.kind, step_format)
        baseline = policy_confidence(policy, tokenizer, heldout, step_format) if not cfg.data else None
        report = evaluate(scorer, heldout, cfg.seed, baseline)
        report["train_seconds"] = history[-1]["seconds"]
        report["total_seconds"] = time.perf_counter() - started
        summary = {"kind": cfg.kind, "data": data, "heldout": report}
        save_step_reward_model(model, run.path / "reward_model", tokenizer, cfg.kind, step_format,
                               {"heldout": {k: v for k, v in report.items() if not k.endswith("reliability")}})
        run.write_json("summary.json", summary)
        text = summary_markdown(cfg, report, data)
        text += (f"\nTime: SFT {sft_seconds:.0f} s, sampling {data.get('sampling_seconds', 0.0):.0f} s, training "
                 f"{report['train_seconds']:.0f} s ({cfg.steps} steps), total {report['total_seconds']:.0f} s.\n")
        (run.path / "summary.md").write_text(text)
        console.print(f"\n[bold]done[/]: {run.path}/summary.md\n")
        console.print(text)
        return summary

