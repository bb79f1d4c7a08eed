"""`posttrain winrate`: policy A against policy B on the same prompts, judged pairwise.

    1. both policies answer the same N prompts of A's task (its held-out split by default),
       one answer each, greedy unless --temperature;
    2. the judge scores each answer: a reward model or an ensemble (--judge.rm), a local LLM
       judge's soft 1..5 rating on accuracy (--judge.llm), or the task's verifier
       (--judge.verifier); the higher-scored answer wins its prompt, equal scores tie (two
       identical answers always tie, whatever the judge);
    3. the win-rate with its bootstrap CI, the length-controlled view, both sides' mean
       lengths, and, since every task here has a verifier, each side's pass@1 and how often
       the judge sides with the verifier where the verifier takes a side (eval/winrate.py).

Every judge here scores one answer at a time and the two scores are compared, so there is
no position bias to average out (a pairwise LLM prompt, AlpacaEval's, shows both answers
and needs both orders). The run directory holds config.json, meta.json, samples.jsonl
(each prompt's two answers, the judge's scores, the outcome, the verifier's rewards),
winrate.json and winrate.md.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable

import torch

from posttrain.config import ConfigError, SamplingParams
from posttrain.config.files import to_dict
from posttrain.envs import make_env
from posttrain.files import write_atomic
from posttrain.eval.loop_a import DEFAULT_MAX_NEW_TOKENS, describe
from posttrain.eval.packs import problems_version
from posttrain.eval.stats import paired_bootstrap_diff
from posttrain.eval.winrate import length_controlled, pairwise_outcomes, verifier_agreement, win_rate
from posttrain.models import load_checkpoint_model, load_tokenizer
from posttrain.rewards.judge import PRODUCTION_CRITERIA, Judge
from posttrain.rewards.proxy import load_reward_scorer
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines import make_engine
from posttrain.roles.engines.contract import example_prompt_ids, prompt_template
from posttrain.runs.checkpoints import final_checkpoint, read_task
from posttrain.runs.rundir import RunDir
from posttrain.config.scoring import WinrateConfig
from posttrain.seeds import derive_seed
from posttrain.types import Environment, Example, Tokenizer
from posttrain.verifiers.contract import is_solved

TOKENIZER_PROBE = "Q: 7+5+9\n7+5=12,12+9=21\nFinal: 21 The quick brown fox."  # digits, symbols, words
LLM_CRITERION = "Accuracy"  # the production rubric's criterion that a right-or-wrong task is about


@dataclasses.dataclass
class Side:
    """One policy of the comparison, loaded."""

    given: str  # what the user passed
    checkpoint: Path  # the checkpoint it resolved to
    how: str  # how it was chosen (final_checkpoint's words)
    model: torch.nn.Module
    tokenizer: object


def load_side(path: str) -> Side:
    checkpoint, how = final_checkpoint(path)
    try:
        model = load_checkpoint_model(checkpoint)
        tokenizer = load_tokenizer(checkpoint)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path} ({how}: {checkpoint}) does not load as a policy: {error}") from None
    return Side(path, checkpoint, how, model.eval(), tokenizer)


def tokenizer_identity(tokenizer: Tokenizer) -> tuple:
    """What must match for two policies' answers to be read alike: the vocabulary size, a
    probe's token ids, and the prompt template (a chat template with its system prompt)."""
    return len(tokenizer), tuple(tokenizer.encode(TOKENIZER_PROBE)), prompt_template(tokenizer)


def check_comparable(a: Side, b: Side) -> None:
    """Refuse two policies that do not answer the same task through the same tokenizer."""
    if tokenizer_identity(a.tokenizer) != tokenizer_identity(b.tokenizer):
        raise ConfigError(f"A ({a.checkpoint}) and B ({b.checkpoint}) have different tokenizers or prompt templates "
                          f"(A: {prompt_template(a.tokenizer)!r}, vocabulary {len(a.tokenizer)}; B: "
                          f"{prompt_template(b.tokenizer)!r}, vocabulary {len(b.tokenizer)}): their lengths are not "
                          "in one unit and they would not see the same prompt; compare checkpoints of one model "
                          "family, trained with one system prompt")
    task_a, task_b = read_task(a.checkpoint), read_task(b.checkpoint)
    if task_a and task_b and describe(task_a.env) != describe(task_b.env):
        raise ConfigError(f"A was trained on {describe(task_a.env)} and B on {describe(task_b.env)}: a win-rate "
                          "compares answers to the same prompts; compare two policies of one task")


def make_judge(cfg: WinrateConfig, env: Environment) -> tuple[str, Callable[[list[Example], list[str]], list[float]]]:
    """(the judge's name, scores(examples, completions) -> one float per answer)."""
    judge = cfg.judge
    if judge.rm:
        try:
            scorer = load_reward_scorer(judge.rm_paths(), judge.ensemble)
        except (OSError, ValueError, KeyError) as error:
            raise ConfigError(f"judge.rm={judge.rm!r} does not load as a reward model: {error}") from None
        name = f"reward model {judge.rm}" + (f" ({judge.ensemble} of {len(judge.rm_paths())})"
                                             if len(judge.rm_paths()) > 1 else "")
        return name, lambda examples, texts: [scorer(e, t)["reward"] for e, t in zip(examples, texts)]
    if judge.llm:
        try:
            llm = Judge.load(judge.llm)
        except (OSError, ValueError) as error:
            raise ConfigError(f"judge.llm={judge.llm!r} does not load as a judge: {error}") from None

        def rate(examples: list[Example], texts: list[str]) -> list[float]:
            return [j.score for j in llm.rate(LLM_CRITERION, PRODUCTION_CRITERIA[LLM_CRITERION], examples, texts)]
        return llm.version, rate
    return f"verifier {env.spec_version}", lambda examples, texts: [env.score(e, t)["reward"]
                                                                    for e, t in zip(examples, texts)]


def answers(side: Side, examples: list[Example], params: SamplingParams, seed: int) -> list[str]:
    """One completion per prompt. Sampled answers of both sides draw from the same seeded
    stream (common random numbers): a policy against itself gives identical answers, and
    swapping A and B gives exactly 1 − the rate, at any temperature."""
    engine = make_engine(side.model, side.tokenizer, params)
    generator = torch.Generator().manual_seed(derive_seed(seed, "winrate"))
    return [e.completion for e in engine.generate(examples, 1, generator)]


def run_winrate(cfg: WinrateConfig) -> dict:
    a, b = load_side(cfg.a), load_side(cfg.b)
    check_comparable(a, b)
    trained = read_task(a.checkpoint) or read_task(b.checkpoint)
    env_cfg = trained.env if trained else None
    env = make_env(env_cfg.name, **env_cfg.kwargs()) if env_cfg else make_env("arithmetic")
    if is_multi_turn(env):
        raise ConfigError(f"{describe(env_cfg)} is a multi-turn task: a win-rate here compares one answer per "
                          "prompt; compare its policies with `posttrain eval` on each and `posttrain diff`")
    judge_name, judge = make_judge(cfg, env)
    examples = env.fixed_set(cfg.split, cfg.size, seed=cfg.seed)
    positions = min(a.model.config.max_seq_len, b.model.config.max_seq_len)
    budget = cfg.max_new_tokens or (trained.max_new_tokens if trained else DEFAULT_MAX_NEW_TOKENS)
    budget = min(budget, positions - max(len(example_prompt_ids(a.tokenizer, e)) for e in examples))
    params = SamplingParams(temperature=cfg.temperature, max_new_tokens=budget,
                            stop_at_newline=not getattr(env_cfg, "cot", True))
    text_a, text_b = answers(a, examples, params, cfg.seed), answers(b, examples, params, cfg.seed)

    score_a, score_b = judge(examples, text_a), judge(examples, text_b)
    # identical answers tie whatever the judge says (an LLM judge's float can differ by batching)
    outcomes = [0.5 if x == y else o for x, y, o in zip(text_a, text_b, pairwise_outcomes(score_a, score_b))]
    verdicts_a, verdicts_b = ([env.score(e, t) for e, t in zip(examples, texts)] for texts in (text_a, text_b))
    reward_a, reward_b = ([float(is_solved(v["reward"], v["details"])) for v in verdicts]
                          for verdicts in (verdicts_a, verdicts_b))  # pass@1's verdicts: solved, never the mean reward
    len_a = [len(a.tokenizer.encode(t)) for t in text_a]
    len_b = [len(b.tokenizer.encode(t)) for t in text_b]

    result = {
        "judge": judge_name,
        "a": {"given": a.given, "checkpoint": str(a.checkpoint), "how": a.how},
        "b": {"given": b.given, "checkpoint": str(b.checkpoint), "how": b.how},
        "task": describe(env_cfg) if env_cfg else "the default arithmetic task (neither checkpoint records one)",
        "prompts": {"split": cfg.split, "size": cfg.size, "seed": cfg.seed, "version": problems_version(examples)},
        "decoding": "greedy" if cfg.temperature == 0 else f"sampled at T = {cfg.temperature:g}",
        "win_rate": win_rate(outcomes, seed=cfg.seed),
        "identical_answers": sum(x == y for x, y in zip(text_a, text_b)),  # ties no judge could break
        "length_controlled": length_controlled(outcomes, len_a, len_b, seed=cfg.seed),
        "length": {"unit": "tokens of the policies' tokenizer", "mean_a": sum(len_a) / len(len_a),
                   "mean_b": sum(len_b) / len(len_b), "diff": paired_bootstrap_diff(len_a, len_b, seed=cfg.seed)},
        "verifier": {"spec_version": env.spec_version,
                     "pass@1": paired_bootstrap_diff(reward_a, reward_b, seed=cfg.seed),
                     "win_rate": win_rate(pairwise_outcomes(reward_a, reward_b), seed=cfg.seed),
                     "judge_agreement": verifier_agreement(outcomes, reward_a, reward_b, seed=cfg.seed)},
    }
    run = RunDir.create(cfg.out_dir, cfg.name)
    run.write_json("config.json", to_dict(cfg))
    run.write_meta({"loop": "A (eval): pairwise win-rate", "spec_version": env.spec_version, "judge": judge_name,
                    "dataset": result["prompts"], "prompt": {"template": prompt_template(a.tokenizer)},
                    "sampling": {"temperature": cfg.temperature, "max_new_tokens": budget}})
    run.write_jsonl("samples.jsonl", [
        {"id": e.id, "prompt": e.prompt, "a": x, "b": y,
         "judge_a": sa, "judge_b": sb, "outcome": o, "verifier_a": ra, "verifier_b": rb}
        for e, x, y, sa, sb, o, ra, rb in zip(examples, text_a, text_b, score_a, score_b, outcomes, reward_a,
                                              reward_b)])
    run.write_json("winrate.json", result)
    write_atomic(run.path / "winrate.md", report(result))
    print(report(result))
    print(f"run directory: {run.path}")
    return result


def pct(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{100 * value:.1f}%"


def signed(value: float) -> str:
    return f"{value + 0.0:+.1f}".replace("-0.0", "+0.0")  # a difference that rounds to zero has no sign


def report(r: dict) -> str:
    """winrate.md: the table a reader quotes, and where each number came from."""
    w, lc, ln, v = r["win_rate"], r["length_controlled"], r["length"], r["verifier"]
    agree, p1 = v["judge_agreement"], v["pass@1"]
    diff = ln["diff"]
    lines = [
        "# Win-rate of A against B", "",
        f"- A: `{r['a']['checkpoint']}` ({r['a']['how']})",
        f"- B: `{r['b']['checkpoint']}` ({r['b']['how']})",
        f"- judge: {r['judge']}",
        f"- prompts: {r['prompts']['size']} of the {r['prompts']['split']} split of {r['task']}, "
        f"one answer each, {r['decoding']}", "",
        "| measure | value (95% CI) |", "|---|---|",
        f"| win-rate of A (ties ½) | {pct(w['win_rate'])} [{pct(w['ci_low'])}, {pct(w['ci_high'])}] |",
        f"| wins / ties / losses | {w['wins']} / {w['ties']} / {w['losses']} ({r['identical_answers']} of the ties "
        "are identical answers) |",
        f"| length-controlled win-rate | {pct(lc['lc_win_rate'])} [{pct(lc['ci_low'])}, {pct(lc['ci_high'])}] "
        f"(length slope {lc['length_slope']:+.2f}) |",
        f"| mean length A / B ({ln['unit']}) | {ln['mean_a']:.1f} / {ln['mean_b']:.1f} "
        f"(A − B {signed(diff['mean_diff'])} [{signed(diff['ci_low'])}, {signed(diff['ci_high'])}]) |",
        f"| pass@1 A / B ({v['spec_version']}) | {pct(p1['mean_a'])} / {pct(p1['mean_b'])} "
        f"(A − B {signed(100 * p1['mean_diff'])} [{signed(100 * p1['ci_low'])}, {signed(100 * p1['ci_high'])}] "
        "points) |",
        f"| the verifier's own win-rate of A | {pct(v['win_rate']['win_rate'])} [{pct(v['win_rate']['ci_low'])}, "
        f"{pct(v['win_rate']['ci_high'])}] |",
        f"| judge agrees with the verifier | {pct(agree['agreement'])} [{pct(agree['ci_low'])}, "
        f"{pct(agree['ci_high'])}] on the {agree['decisive']} prompts where one answer is right and the other "
        f"wrong ({agree['verifier_ties']} verifier ties left to the judge alone) |", "",
        "Ties count half. The length-controlled rate is a logistic fit of the outcome on tanh(length difference / "
        "its std), read at zero difference (posttrain/eval/winrate.py); the slope says how much length moves the "
        "judge. CIs: percentile bootstrap over prompts.",
    ]
    return "\n".join(lines) + "\n"
