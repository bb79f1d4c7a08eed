"""Why a run is not learning, named: causes read from its metric rows (metrics.jsonl) and its
samples (samples.jsonl), each with the setting to change and the numbers that showed it.

The monitors (monitors.py) detect a line crossed in the metrics; a diagnosis says why, and
what to change. Their alerts are its evidence for what the metrics show (KL, entropy, length,
reward against dev pass@1, flat groups); the samples add what the metrics cannot say: cut before
their answer, no answer where the verifier reads it, partial credit, a term that never paid.

    step_samples(samples)        each step's samples folded into counts (StepSamples)
    diagnose(rows, samples)      the findings, root causes first: a cause, the first step it
                                 held, what the numbers show, the setting to change
    LiveDiagnosis                the same as a stage runs: each finding reported once

The causes, in the order they are reported when they start at the same step (the earliest
is reported first: an earlier one often explains a later one):

    truncation              samples cut at the generation budget (monitors.truncation)
    format_never_matched    no sample of `window` steps put its answer where the verifier reads it
    partial_credit          most of what the verifier paid was partial credit to wrong answers
    no_variance             every group scored alike, step after step (monitors.no_learning_signal)
    term_silent             a term of the reward paid 0 to every sample of `window` steps
    term_collapse           a term's mean (or the reward's) fell to a quarter of its best
    reward_up_heldout_down  the reward, or one of its terms, held or rose while dev pass@1 fell
    kl_runaway, entropy_runaway, length_blowup, ...   the monitors' alerts (FROM_MONITORS)

Callers, which read the same rows and so name the same causes: the RL stage after each step
(pipelines/rl.py prints each finding once), summary.md (runs/report.py), `posttrain doctor`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from posttrain.runs.monitors import (RUN_MONITORS, TERM_PREFIX, TRUNCATION_MAX, MonitorConfig, check_all,
                                     proxy_gold_divergence, term_keys, truncation)
from posttrain.verifiers.reasoning_gym_answer import EXACT_SPECS

# the verifiers' reasons for "the answer is not where I read it" (verifiers/*.py REASONS), without format_ok
NO_FORMAT = frozenset({"no_answer", "no_final_line", "missing_int", "no_integer", "unclosed_think", "no_code", "empty"})
# the causes in the order they are reported
CAUSES = ("truncation", "format_never_matched", "partial_credit", "no_variance", "term_silent", "term_collapse",
          "reward_up_heldout_down", "kl_runaway", "entropy_runaway", "length_blowup", "entropy_collapse",
          "sampler_mismatch", "chosen_likelihood_collapse", "template_mimicry")
# the monitors whose alerts are findings as they are: monitor -> (cause, the setting to change)
FROM_MONITORS = {
    "kl_explosion": ("kl_runaway", "--{algo}.kl_coef (raise it, e.g. 0.04; or hold KL at --rl.kl.target) or "
                     "rl.optim.lr (lower it)"),
    "entropy_blowup": ("entropy_runaway", "rl.optim.lr (lower it: 3e-4 collapsed the prototype), or a KL term"),
    "length_blowup": ("length_blowup", "rl.reward.terms / rl.reward.length_penalty (a term that pays length is farmed)"),
    "entropy_collapse": ("entropy_collapse", "rl.sampling.temperature (raise it), or --{algo}.clip_eps_high 0.28"),
    "sampler_mismatch": ("sampler_mismatch", "rl.sampling.weights or --dtype (float32), or rl.mismatch"),
    "chosen_likelihood_collapse": ("chosen_likelihood_collapse", "--{algo}.beta (raise it) or --dpo.nll_coef"),
    "template_mimicry": ("template_mimicry", "--{algo}.beta (raise it) or rl.preference.balance_topics"),
}


@dataclass(frozen=True)
class Finding:
    """One named cause: where it first held, what showed it, what to change."""

    cause: str  # one of CAUSES
    step: int  # the first step at which it held
    message: str  # what the numbers show, with the numbers
    setting: str  # the setting to change, and which way
    subject: str = ""  # the reward term or metric it is about; "" for the run as a whole
    evidence: dict[str, float] = field(default_factory=dict)  # the numbers, by name

    @property
    def key(self) -> tuple[str, str]:  # what is reported once: the cause, for each term it names
        return self.cause, self.subject

    def line(self) -> str:
        return f"{self.cause} (step {self.step}): {self.message}. Change: {self.setting}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DiagnosisConfig:
    """Where each line of the diagnosis is, with its reason. The monitors' own lines are theirs."""

    monitors: MonitorConfig = RUN_MONITORS  # the lines the run's alerts use: the same alerts, the same steps
    # steps a sample-based cause must hold for in a row: the monitors' window (one flat or odd batch
    # happens in a healthy run; five in a row from the start mean the run as set up cannot learn)
    window: int = 5
    # a term whose window mean fell to a quarter of its best lost three quarters of what it paid: for a
    # window of make run's 1,280 samples, a rate of 0.1 falling to 0.025 is about 9 standard errors
    collapse_fraction: float = 0.25
    # half of what the verifier paid went to answers it does not count as solved: from there on the
    # gradient follows the partial credit more than being right (word_sorting pays 0.2-0.33 for
    # echoing the words unsorted)
    partial_share: float = 0.5


@dataclass
class StepSamples:
    """What one step's samples show, as counts (step_samples)."""

    n: int = 0
    cut: int = 0  # cut at the generation budget ("finished": false)
    matched: int = 0  # the answer where the verifier reads it (details format_ok, or a reason not in NO_FORMAT)
    ended_matched: int = 0  # of those, the ones that ended within the budget
    partial: int = 0  # paid partial credit (reason "partial")
    partial_paid: float = 0.0  # what the verifier paid those
    paid: float = 0.0  # what the verifier paid all of them (its term of a stack, else the reward)
    reasons: Counter[str] = field(default_factory=Counter)
    nonzero: Counter[str] = field(default_factory=Counter)  # term -> samples it paid something other than 0
    starts: dict[str, int] = field(default_factory=dict)  # term -> the step it is paid from (a group term's from_step)
    spec: str = ""  # the verifier's spec_version
    cut_example: str = ""  # the end of one cut completion
    unmatched_example: str = ""  # one completion whose answer the verifier did not find


def step_samples(samples: list[dict[str, Any]]) -> dict[int, StepSamples]:
    """samples.jsonl rows (one stage's) folded into a StepSamples per step."""
    steps: dict[int, StepSamples] = {}
    for sample in samples:
        add_sample(steps.setdefault(sample["step"], StepSamples()), sample)
    return steps


def add_sample(seen: StepSamples, sample: dict[str, Any]) -> None:
    details = sample.get("details") or {}
    components = details.get("components") or {}
    verdict = float(components.get("accuracy", sample.get("reward", 0.0)))
    seen.n += 1
    seen.paid += verdict
    reason = str(details.get("reason", ""))
    seen.reasons[reason] += 1
    seen.spec = seen.spec or str(details.get("spec_version", ""))
    if sample.get("finished") is False:
        seen.cut += 1
        seen.cut_example = seen.cut_example or sample.get("completion", "")[-40:]
    ok = details["format_ok"] if isinstance(details.get("format_ok"), bool) else reason not in NO_FORMAT
    seen.matched += ok
    seen.ended_matched += ok and sample.get("finished") is not False
    if not ok and not seen.unmatched_example:
        seen.unmatched_example = sample.get("completion", "")[-60:]
    if reason == "partial":
        seen.partial += 1
        seen.partial_paid += verdict
    for name, value in components.items():
        seen.nonzero[name] += value != 0
    for name, start in re.findall(r"(\w+)\(from_step=(\d+)\)", str(details.get("reward_spec", ""))):
        seen.starts[name] = int(start)


def diagnose(rows: list[dict[str, Any]], samples: dict[int, StepSamples], settings: dict[str, Any] | None = None,
             config: DiagnosisConfig = DiagnosisConfig()) -> list[Finding]:
    """Every cause one stage's metric `rows` and `samples` (step_samples) show, each at the
    first step it held: the earliest first (a cause comes before what it causes), and at one
    step the root causes first (CAUSES' order). `settings`: the run's config.json, for the
    values the settings to change have now (None: named without them)."""
    settings = settings or {}
    alerts = check_all(rows, dataclasses.replace(config.monitors, min_gold_drop=None))  # diverged() runs that one
    found = (truncated(rows, samples, settings, config) + never_matched(samples, config) + partial(samples, config)
             + flat(alerts, samples, config) + silent(samples, config) + collapsed(rows, config)
             + diverged(rows, config.monitors) + from_monitors(alerts, settings))
    first: dict[tuple[str, str], Finding] = {}
    for finding in sorted(found, key=lambda f: f.step):
        first.setdefault(finding.key, finding)
    return sorted(first.values(), key=lambda f: (f.step, rank(f), f.subject))


def rank(finding: Finding) -> float:
    """Where a finding is reported: CAUSES' order, but truncation after format_never_matched
    when the samples that ended had no answer either (truncated())."""
    if finding.cause == "truncation" and finding.evidence.get("secondary"):
        return CAUSES.index("format_never_matched") + 0.5
    return CAUSES.index(finding.cause)


def windows(samples: dict[int, StepSamples], window: int) -> list[tuple[int, int, list[StepSamples]]]:
    """(first step, last step, the steps' samples) of every run of `window` consecutive logged steps."""
    steps = sorted(samples)
    return [(steps[i - window + 1], steps[i], [samples[s] for s in steps[i - window + 1:i + 1]])
            for i in range(window - 1, len(steps))]


def setting(settings: dict[str, Any], dotted: str) -> Any:
    """A value of config.json by its dotted name, or None."""
    value: Any = settings
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def truncated(rows: list[dict[str, Any]], samples: dict[int, StepSamples], settings: dict[str, Any],
              config: DiagnosisConfig) -> list[Finding]:
    """The truncation monitor's first alert (from the samples where the rows predate truncated_fraction)."""
    if config.monitors.truncation_max is None:
        return []
    if not any("truncated_fraction" in row for row in rows):
        rows = [{"step": s, "truncated_fraction": seen.cut / seen.n} for s, seen in sorted(samples.items()) if seen.n]
    alerts = truncation(rows, window=config.window, max_fraction=config.monitors.truncation_max)
    if not alerts:
        return []
    step, share = alerts[0]["step"], alerts[0]["value"]
    budget = setting(settings, "rl.sampling.max_new_tokens")
    example = next((samples[s].cut_example for s in sorted(samples) if s <= step and samples[s].cut_example), "")
    seen = [samples[s] for s in samples if step - config.window < s <= step]
    n, ended = sum(s.n for s in seen), sum(s.n - s.cut for s in seen)
    # the budget is not the cause when the samples that did end, a quarter or more of them (enough to
    # read the policy's habit from), had no answer either: a budget raised would only buy more of that
    secondary = n > 0 and ended >= 0.25 * n and sum(s.ended_matched for s in seen) == 0
    why = (f"; the {ended} samples that did end had no answer in the format either, so the budget is not the "
           "first cause (format_never_matched)" if secondary else
           ": a right answer that does not fit scores as wrong, and the budget, not the task, decides the rewards")
    return [Finding("truncation", step,
                    f"{100 * share:.0f}% of the samples of the {config.window} steps to {step} were cut at the "
                    f"generation budget{f' of {budget}' if budget else ''} before they ended"
                    + (f", e.g. ...{example!r}" if example else "") + why,
                    f"rl.sampling.max_new_tokens{f' (now {budget})' if budget else ''}: raise it to fit the answers "
                    "(posttrain train ... --dry_run true names the length the demonstrations need)",
                    evidence={"truncated_fraction": share, "secondary": float(secondary),
                              **({"max_new_tokens": budget} if budget else {})})]


def never_matched(samples: dict[int, StepSamples], config: DiagnosisConfig) -> list[Finding]:
    for first, last, seen in windows(samples, config.window):
        if sum(s.matched for s in seen) == 0:
            n = sum(s.n for s in seen)
            reason, count = sum((s.reasons for s in seen), Counter[str]()).most_common(1)[0]
            example = next((s.unmatched_example for s in seen if s.unmatched_example), "")
            spec = next((s.spec for s in seen if s.spec), "the verifier")
            cut = sum(s.cut for s in seen) / n
            before = sum(samples[s].matched for s in samples if s < first)  # lost, rather than never learnt
            return [Finding("format_never_matched", last,
                            f"none of the {n} samples of steps {first}-{last} put an answer where {spec} reads it "
                            f"(reason {reason!r} on {count}), e.g. ...{example!r}"
                            + (f" ({100 * cut:.0f}% were cut at the budget)" if cut > 0.5 else "")
                            + (f"; {before} samples had it before step {first}: the policy lost it" if before else ""),
                            "find what paid it to drop the answer (term_collapse, reward_up_heldout_down)" if before else
                            "teach the format before RL: SFT on demonstrations in it (sft.steps, sft.num_examples) or "
                            "--init a checkpoint that writes it; a format term (--rl.reward.terms r1) pays for the "
                            "shape while accuracy cannot",
                            evidence={"samples": n, "matched": 0, "cut_fraction": cut, "matched_before": before})]
    return []


def partial(samples: dict[int, StepSamples], config: DiagnosisConfig) -> list[Finding]:
    for first, last, seen in windows(samples, config.window):
        paid, partial_paid = sum(s.paid for s in seen), sum(s.partial_paid for s in seen)
        if paid > 0 and partial_paid / paid >= config.partial_share:
            n, count = sum(s.n for s in seen), sum(s.partial for s in seen)
            solved = sum(s.reasons["ok"] for s in seen)
            spec = next((s.spec for s in seen if s.spec), "")
            exact = EXACT_SPECS.get(spec)
            return [Finding("partial_credit", last,
                            f"{100 * partial_paid / paid:.0f}% of what the verifier paid in steps {first}-{last} was "
                            f"partial credit: {count} of {n} samples were paid for answers it does not count as "
                            f"solved ({solved} solved), and the policy can learn to farm it",
                            f"--env.spec_version {exact} (pays only full credit)" if exact else
                            f"env.spec_version: a verifier that pays only right answers ({spec or 'this one'} pays "
                            "partial credit)",
                            evidence={"partial_share": partial_paid / paid, "partial": count, "solved": solved})]
    return []


def flat(alerts: list[dict[str, Any]], samples: dict[int, StepSamples], config: DiagnosisConfig) -> list[Finding]:
    """no_learning_signal's first alert, with what the samples say the groups agreed on."""
    alert = next((a for a in alerts if a["monitor"] == "no_learning_signal"), None)
    if alert is None:
        return []
    step = alert["step"]
    seen = [samples[s] for s in sorted(samples) if step - config.window < s <= step]
    n = sum(s.n for s in seen)
    if not n:  # no samples (an old run's directory without them): the monitor's own words
        return [Finding("no_variance", step, alert["message"], "see the message")]
    cut, matched, solved = (sum(s.cut for s in seen) / n, sum(s.matched for s in seen) / n,
                            sum(s.reasons["ok"] for s in seen) / n)
    harder = ("the task's settings (e.g. --env.arithmetic.level, --env.reasoning_gym.task_config), "
              "rl.curation to keep prompts the policy sometimes solves, or --algo dapo (redraws flat groups)")
    ended = n - sum(s.cut for s in seen)
    if cut > (config.monitors.truncation_max or TRUNCATION_MAX) and not (
            ended >= 0.25 * n and sum(s.ended_matched for s in seen) == 0):  # truncated()'s secondary
        why, change = (f"{100 * cut:.0f}% of the samples were cut at the budget (truncation, above)",
                       "rl.sampling.max_new_tokens (raise it): easier prompts would not help")
    elif matched == 0:
        why, change = "no sample had the answer format (format_never_matched, above)", "see format_never_matched"
    elif solved == 0:
        why, change = ("every sample was wrong: the task is too hard for the policy it starts from",
                       f"SFT first (sft.steps), easier prompts: {harder}, or more samples per prompt "
                       "(rl.samples_per_prompt)")
    elif solved == 1:
        why, change = "every sample was right: there is nothing left to learn on these prompts", f"harder prompts: {harder}"
    else:
        why, change = "the groups agreed, though not all alike", f"more samples per prompt (rl.samples_per_prompt), {harder}"
    return [Finding("no_variance", step, f"{config.monitors.no_signal_steps} steps in a row in which every group's "
                    f"samples scored alike, so every advantage was 0 and nothing was learnt: {why} ({100 * solved:.0f}% "
                    f"solved, {100 * cut:.0f}% cut)", change,
                    evidence={"solved": solved, "cut_fraction": cut, "matched": matched})]


def silent(samples: dict[int, StepSamples], config: DiagnosisConfig) -> list[Finding]:
    """A term that paid 0 to every sample of `window` steps from its start on (a group term's from_step)."""
    found = []
    for name in dict.fromkeys(name for seen in samples.values() for name in seen.nonzero):
        start = max((seen.starts.get(name, 0) for seen in samples.values()), default=0)
        paid = {s: seen for s, seen in samples.items() if s >= start and name in seen.nonzero}
        for first, last, seen in windows(paid, config.window):
            if sum(s.nonzero[name] for s in seen) == 0:
                n, before = sum(s.n for s in seen), sum(paid[s].nonzero[name] for s in paid if s < first)
                what = (f"it paid {before} samples before and stopped (term_collapse says what rose instead)" if before
                        else "no sample was right: only the other terms train" if name == "accuracy"
                        else "it gives no signal")
                change = ("rl.reward.terms: lower the weights of the terms that rose" if before else
                          "easier prompts or SFT first (the policy solves nothing)" if name == "accuracy" else
                          f"rl.reward.terms: check what {name} reads (call it on a sample of samples.jsonl), or drop it")
                found.append(Finding("term_silent", last, f"the term {name} paid 0 to every one of the {n} samples of "
                                     f"steps {first}-{last}: {what}", change, subject=name, evidence={"samples": n}))
                break
    return found


def collapsed(rows: list[dict[str, Any]], config: DiagnosisConfig) -> list[Finding]:
    """A term's (or, without terms, the reward's) mean over `window` steps fell to
    collapse_fraction of its best window mean; the terms that rose meanwhile are named."""
    keys = [k for k in dict.fromkeys(k for row in rows for k in row) if k.startswith(TERM_PREFIX)] or ["reward_mean"]
    means = {key: dict(rolling(rows, key, config.window)) for key in keys}  # key -> {step: window mean}
    found = []
    for key, series in means.items():
        best, best_step = 0.0, -1
        for step, mean in series.items():
            if mean > best:
                best, best_step = mean, step
            elif best > 0 and mean <= config.collapse_fraction * best:
                name = key.removeprefix(TERM_PREFIX)
                rose = [k.removeprefix(TERM_PREFIX) for k, other in means.items() if k != key
                        and other.get(step, -math.inf) > other.get(best_step, math.inf) + 1e-9]
                change = (f"rl.reward.terms: lower the weight of {', '.join(rose)} (rose while {name} fell: the "
                          "policy is paid more for them than for being right)" if rose else
                          "rl.optim.lr (lower it: 3e-4 collapsed the prototype, ARCHITECTURE.md), or a KL term "
                          "(--<algo>.kl_coef 0.04)")
                found.append(Finding("term_collapse", step, f"{name} fell from {best:.3f} (mean of the {config.window} "
                                     f"steps to {best_step}) to {mean:.3f}" + (f" while {', '.join(rose)} rose"
                                                                            if rose else ""), change, subject=name,
                                     evidence={"best": best, "best_step": best_step, "now": mean}))
                break
    return found


def rolling(rows: list[dict[str, Any]], key: str, window: int) -> list[tuple[int, float]]:
    """(step, mean of the last `window` logged values) from the window-th value on."""
    values = [(row["step"], float(row[key])) for row in rows if isinstance(row.get(key), (int, float))]
    return [(values[i][0], sum(v for _, v in values[i + 1 - window:i + 1]) / window)
            for i in range(window - 1, len(values))]


def diverged(rows: list[dict[str, Any]], c: MonitorConfig) -> list[Finding]:
    """proxy_gold_divergence's first alert for the reward and for each term on its own."""
    if c.min_gold_drop is None:
        return []
    found = []
    for key in [c.reward_key] + term_keys(rows):
        alerts = proxy_gold_divergence(rows, key, c.gold_key, c.window, c.min_gold_drop)
        if not alerts:
            continue
        alert, term = alerts[0], key.removeprefix(TERM_PREFIX) if key.startswith(TERM_PREFIX) else ""
        change = (f"rl.reward.terms: lower {term}'s weight or drop it; --rl.alerts.action rollback keeps the best "
                  "dev weights" if term and term != "accuracy" else
                  f"read the samples of step {alert['step']} for an exploit; --rl.alerts.action rollback keeps the "
                  "best dev weights")
        found.append(Finding("reward_up_heldout_down", alert["step"], alert["message"].split(": the reward")[0],
                             change, subject=term or key, evidence={"dev_pass@1": alert["value"]}))
    return found


def from_monitors(alerts: list[dict[str, Any]], settings: dict[str, Any]) -> list[Finding]:
    """The monitors' alerts that are findings as they are: their numbers (the message up to its
    first ": ", where a monitor's advice starts) and the setting to change."""
    algo = setting(settings, "rl.algo") or "<algo>"
    return [Finding(FROM_MONITORS[a["monitor"]][0], a["step"], a["message"].split(": ")[0],
                    FROM_MONITORS[a["monitor"]][1].format(algo=algo), evidence={"value": a["value"]})
            for a in alerts if a["monitor"] in FROM_MONITORS]


class LiveDiagnosis:
    """The diagnosis of one stage as it runs: fed each step's metrics and samples, it gives
    the findings not reported before (each cause, and each term's, once). `rows` and `samples`:
    what a resumed stage already logged."""

    def __init__(self, rows: list[dict[str, Any]], samples: list[dict[str, Any]], settings: dict[str, Any]):
        self.rows, self.samples, self.settings = list(rows), step_samples(samples), settings
        self.reported: set[tuple[str, str]] = set()

    def after_step(self, step: int, metrics: dict[str, float], samples: list[dict[str, Any]]) -> list[Finding]:
        # a resumed stage logs its steps from the checkpoint on again: what was logged after it goes
        self.rows = [row for row in self.rows if row["step"] < step] + [{"step": step, **metrics}]
        self.samples = {s: seen for s, seen in self.samples.items() if s < step}
        self.samples[step] = step_samples(samples).get(step, StepSamples())
        new = [f for f in diagnose(self.rows, self.samples, self.settings) if f.key not in self.reported]
        self.reported |= {f.key for f in new}
        return new
