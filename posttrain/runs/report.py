"""What a finished run shows a person: summary.md, summary.json and PNG plots."""

from __future__ import annotations

import math

from posttrain.runs.diagnosis import Finding, diagnose, step_samples
from posttrain.runs.monitors import RUN_MONITORS, TERM_PREFIX, check_all
from posttrain.runs.preference_report import preference_section
from posttrain.runs.rundir import RunDir

# the curves that teach: is reward rising, is the held-out metric following it, is the
# policy drifting from where it started, is it gaming length
PANELS = [
    ("reward_mean", "train reward (mean)"),
    ("dev_pass@1", "dev pass@1 (greedy)"),
    ("kl_ref", "KL(π ‖ π_ref), k3 estimate"),
    ("response_length", "response length (tokens)"),
    ("entropy", "entropy (nats/token)"),
    ("zero_variance_groups", "groups with no reward variance"),
    ("observed_episodes", "episodes with a tool call / observation"),  # multi-turn environments only
    ("model_turns", "model turns per episode"),
    # where the sampler is not the trainer (int8, bf16, async; roles/mismatch.py): how far apart the
    # two are, and what share of the batch the corrected update is still worth
    ("mismatch/logp_diff_mean", "sampler vs trainer: mean |Δ log π| per token"),
    ("mismatch/ess", "importance weights' effective sample size"),
    # PRIME only: the implicit PRM's mean per-token reward, and how often its outcome score
    # called the verifier's verdict on rollouts it had not yet trained on
    ("prm/process_reward_mean", "implicit PRM: mean process reward per token"),
    ("prm/accuracy", "implicit PRM: outcome accuracy (before its update)"),
]


TERMS_PANEL = "reward terms"  # the panel of every "reward/<term>" beside reward_mean


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def write_plots(run: RunDir, stage: str = "rl") -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and in CI
    import matplotlib.pyplot as plt

    rows = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == stage]
    if not rows:
        return
    panels = [(k, t) for k, t in PANELS if _series(rows, k)[0]]
    terms = [k for k in dict.fromkeys(k for r in rows for k in r) if k.startswith(TERM_PREFIX)]
    if terms:  # a reward stack: each term's mean per sample beside the sum, on one axis (a gamed term shows)
        panels.insert(1, (TERMS_PANEL, "reward terms (mean per sample) and their sum"))
    cols = 3
    fig, axes = plt.subplots(math.ceil(len(panels) / cols), cols, figsize=(12, 3.2 * math.ceil(len(panels) / cols)),
                             squeeze=False)
    for ax, (key, title) in zip(axes.flat, panels):
        for line in ["reward_mean"] + terms if key == TERMS_PANEL else [key]:
            steps, values = _series(rows, line)
            ax.plot(steps, values, marker="o" if len(steps) < 20 else None, markersize=3,
                    label=("sum" if line == "reward_mean" else line.removeprefix(TERM_PREFIX)))
        if key == TERMS_PANEL:
            ax.legend(fontsize=7)
        ax.set_title(title)
        ax.set_xlabel(f"{stage} step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(run.path / f"{stage}_metrics.png", dpi=100)
    plt.close(fig)

    # the one picture for the README: reward and dev pass@1 on one axis
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps, reward = _series(rows, "reward_mean")
    ax.plot(steps, reward, label="train reward (sampled, T=1)", alpha=0.8)
    steps, dev = _series(rows, "dev_pass@1")
    if steps:
        ax.plot(steps, dev, marker="o", label="dev pass@1 (greedy)")
    ax.set_xlabel(f"{stage} step")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(run.path / "reward_curve.png", dpi=100)
    plt.close(fig)


def _fmt(ci: dict) -> str:
    return f"{100 * ci['mean']:.1f}% [{100 * ci['ci_low']:.1f}, {100 * ci['ci_high']:.1f}]"


def write_summary(run: RunDir, results: dict, cfg, spec_version: str, start: str = "sft") -> None:
    """summary.json keeps each stage's held-out pass@1 as {mean, ci_low, ci_high, n}, the
    policy RL started from under "sft" whatever it was; summary.md labels that row `start`
    ("start": no SFT ran, the model as built or --init's) or "sft"."""
    final = results.get("final_stage", "rl")
    rows = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == final]
    summary = dict(results)
    lines = [f"# {run.path.name}", "", f"spec `{spec_version}`, algorithm `{cfg.rl.algo}`, seed {cfg.seed}", "",
             "| stage | held-out pass@1 (95% CI) | n |", "|---|---|---|"]
    for stage in ("sft", final):
        if stage in results:
            lines.append(f"| {start if stage == 'sft' else stage} | {_fmt(results[stage])} | {results[stage]['n']} |")
    if "sft" in results and final in results:
        gain = results[final]["mean"] - results["sft"]["mean"]
        separated = results[final]["ci_low"] > results["sft"]["ci_high"] or results["sft"]["ci_low"] > results[final]["ci_high"]
        summary[f"{final}_gain"] = gain
        summary["cis_overlap"] = not separated
        lines += ["", f"{final.upper()} changed held-out pass@1 by {100 * gain:+.1f} points; the two 95% CIs "
                      f"{'do not overlap' if separated else 'overlap (the difference may be noise)'}."]
        paired = results.get(f"{final}_vs_sft")  # pipelines/run.py: eval/comparison.py's paired_scores
        if paired:
            rule = paired["noise_rule"]
            lines += ["", f"Paired over the {paired['n_shared']} held-out problems both scored: "
                          f"{100 * paired['mean_diff']:+.1f} points (95% CI {100 * paired['ci_low']:+.1f} to "
                          f"{100 * paired['ci_high']:+.1f}), {paired['verdict']}; noise rule: {rule['verdict']} "
                          f"({rule['reason']})."]
    used = [stage for stage in ("sft", final) if "observed_episodes" in results.get(stage, {})]
    if used:  # a multi-turn environment: did the policy use it (call the tool) more after RL?
        lines += ["", "| stage | held-out episodes with a tool call / observation (95% CI) |", "|---|---|"]
        lines += [f"| {stage} | {_fmt(results[stage]['observed_episodes'])} |" for stage in used]
    if rows:
        last = rows[-1]
        # time/step is the step's wall time; without it (older runs, preference stages) the
        # roles' times add up to it, as they cannot overlap outside the async topology
        wall = sum(r["time/step"] if "time/step" in r else
                   sum(v for k, v in r.items() if k.startswith("time/")) for r in rows)
        summary[f"{final}_steps"] = len(rows)
        summary[f"{final}_wall_seconds"] = wall
        lines += ["", f"{final.upper()}: {len(rows)} steps, {wall:.0f} s of step time; last step: reward "
                      f"{last.get('reward_mean', float('nan')):.3f}, response length {last.get('response_length', 0):.1f}, "
                      + (f"KL to reference {last['kl_ref']:.4f}" if "kl_ref" in last else
                         "KL to reference not measured (rl.kl.track false)")
                      + f", entropy {last.get('entropy', 0.0):.3f}"
                      + (f", implicit PRM accuracy {last['prm/accuracy']:.3f} and mean process reward "
                         f"{last['prm/process_reward_mean']:+.5f} per token" if "prm/accuracy" in last else "")]
    curation = run.read_json("curation.json")  # rl.curation's record (pipelines/curation.py)
    if curation is not None:
        lines += curation_lines(curation)
    preference_lines, preference_record = preference_section(run, final)  # pair balance, temperatures, OOD
    lines += preference_lines
    summary.update(preference_record)
    warnings = collapse_warnings(rows)
    if warnings:
        summary["warnings"] = warnings
        lines += ["", "## Warnings", ""] + [f"- {w}" for w in warnings]
    findings = stage_diagnosis(run, final)
    if findings:
        summary["diagnosis"] = [f.to_json() for f in findings]
        lines += diagnosis_lines(findings)
    stopped = (run.read_json("early_stop.json") or {}).get(final)  # pipelines/alerts.py: rl.alerts.action
    if stopped:
        summary["early_stop"] = stopped
        restored = stopped.get("restored_step")
        lines += ["", "## Stopped early", "",
                  f"{final.upper()} stopped after step {stopped['step']} of {cfg.rl.steps} "
                  f"(rl.alerts.action={stopped['action']}), "
                  f"on {stopped['monitor']}: {stopped['message']}"
                  + (f" The policy evaluated above is step {restored}'s, the best dev pass@1 before the alert."
                     if restored is not None else "")]
    run.write_json("summary.json", summary)
    (run.path / "summary.md").write_text("\n".join(lines) + "\n")


def curation_lines(report: dict) -> list[str]:
    """The "Data curation" section of summary.md, from curation.json."""
    screened = report["screened_out"]
    lines = ["", "## Data curation", "",
             f"Pool: {report['pool']} distinct training prompts" + (
                 f", after screening out {sum(screened.values())} ("
                 + "; ".join(f"{n} {why}" for why, n in screened.items()) + ")" if screened else
                 "; dedup and decontamination screened out none") + "."]
    measurement = report.get("measurement")
    if measurement:
        dropped = ", ".join(f"{n} {why}" for why, n in report["dropped_before_rl"].items())
        lines.append(f"Measured before RL: {measurement['k']} samples per prompt ({measurement['samples']:.0f} "
                     f"samples, {measurement['seconds']:.0f} s); prompts by pass count: "
                     + ", ".join(f"{count} {n}" for count, n in report["histogram_before_rl"].items())
                     + f". The band {report['band']} kept {report['kept_before_rl']}"
                     + (f" and dropped {dropped}" if dropped else "") + ".")
    lines.append(f"After RL: {report['kept_now']} in the pool"
                 + (f", {report['dropped_online']} dropped by the online filter" if report["dropped_online"] else "")
                 + f"; {report['draws']} draws of {report['distinct_prompts_drawn']} distinct prompts"
                 + (f"; {report['fallback_steps']} steps found no prompt in the band" if report["fallback_steps"]
                    else "") + ". Every prompt, kept or dropped and why: curation.jsonl.")
    if len(report["by_label"]) > 1:  # difficulty labels: what each held, and how often it was drawn
        measured = measurement is not None
        lines += ["", "| label | prompts |" + (" pass rate before RL |" if measured else "") + " in the pool now | draws |",
                  "|---|---|" + ("---|" if measured else "") + "---|---|"]
        for label, row in report["by_label"].items():
            rate = f" {row['first_pass_rate']:.2f} |" if measured else ""
            lines.append(f"| {label} | {row['prompts']} |{rate} {row['kept_now']} | {row['draws']} |")
    return lines



def stage_diagnosis(run: RunDir, stage: str) -> list[Finding]:
    """runs/diagnosis.py's findings on one stage of the run, from its files (as `posttrain doctor` reads them)."""
    rows = [r for r in run.read_jsonl("metrics.jsonl") if r.get("stage") == stage]
    samples = [s for s in run.read_jsonl("samples.jsonl") if s.get("stage") == stage]
    return diagnose(rows, step_samples(samples), run.read_json("config.json")) if rows else []


def diagnosis_lines(findings: list[Finding], title: str = "Diagnosis") -> list[str]:
    return ["", f"## {title}", "", "Why the run is not learning, as far as its metrics and samples show "
            "(`posttrain doctor RUN` prints the same):", ""] + [f"- {f.line()}" for f in findings]


def collapse_warnings(rows: list[dict]) -> list[str]:
    return [f"step {a['step']}: {a['message']}" for a in check_all(rows, RUN_MONITORS)]
