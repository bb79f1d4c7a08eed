"""Verified samples: a model's completions kept where the verifier passes them, and their
rows on disk. What STaR's iterations (pipelines/star.py: the policy samples) and R1's
distillation stage (pipelines/distill.py: a teacher samples) train on with the SFT loss.

    keep_verified(episodes, ...)        the solved ones that stopped, each distinct one once
    verified_rationales(engine, ...)    sample, score, keep; optionally rationalise with a hint
    rationale_row / rationale_episode   a kept sample as a JSONL row and back, token for token
"""

from __future__ import annotations

import dataclasses

import torch

from posttrain.eval.evaluate import solved
from posttrain.roles.engines import Engine
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.roles.environment import score_episodes
from posttrain.types import PROMPT_MESSAGES, Environment, Episode, Example
from posttrain.verifiers.steps import arithmetic_step_labels

# The hint a rationalisation prompt carries: one line after the question stating the final
# answer. For the arithmetic task, "Q: 7+5+9+3+1\n" becomes "Q: 7+5+9+3+1\nAnswer: 25\n";
# for a conversation prompt (an instruct model's chat) the line ends the last user turn.
# STaR put the answer in the few-shot prompt the same way; a model fine-tuned only on
# hint-free prompts may ignore it, which the iteration log shows as 0 rationalised.
HINT = "Answer: {answer}\n"


def with_answer_hint(example: Example) -> Example:
    """`example` with the line HINT after its prompt (and in its last user turn, for a conversation)."""
    hint = HINT.format(answer=example.expected_answer)
    meta = dict(example.meta)
    if meta.get(PROMPT_MESSAGES):
        turns = [dict(turn) for turn in meta[PROMPT_MESSAGES]]
        last_user = max(i for i, turn in enumerate(turns) if turn.get("role") == "user")
        turns[last_user]["content"] = turns[last_user]["content"].rstrip("\n") + "\n" + hint
        meta[PROMPT_MESSAGES] = turns
    prompt = example.prompt if example.prompt.endswith("\n") else example.prompt + "\n"
    return dataclasses.replace(example, prompt=prompt + hint, meta=meta)


def steps_all_correct(episode: Episode) -> bool:
    """Whether every step of an arithmetic chain checks (verifiers/steps.py: each running sum
    right and following the problem), not only its final answer."""
    steps, labels = arithmetic_step_labels(episode.example, episode.completion)
    return bool(steps) and all(labels)


def keep_verified(episodes: list[Episode], distinct: bool, step_check: bool = False) -> list[Episode]:
    """The episodes the verifier counts as solved and that ended on a stop token (a
    completion cut off by the budget would teach the model not to stop); with `distinct`,
    each completion text once per prompt, the first drawn; with `step_check`, only those
    whose every step checks too (`steps_all_correct`)."""
    kept, seen = [], set()
    for episode in episodes:
        key = (episode.example.id, episode.example.prompt, episode.completion)
        if (solved(episode) and episode.finished and not (distinct and key in seen)
                and (not step_check or steps_all_correct(episode))):
            kept.append(episode)
            seen.add(key)
    return kept


def verified_rationales(engine: Engine, env: Environment, examples: list[Example], samples_per_prompt: int,
                        generator: torch.Generator, rationalize: bool, distinct: bool,
                        step_check: bool = False) -> tuple[list[Episode], dict]:
    """One iteration's training set: (kept episodes, stats). Every kept episode was passed by
    `env.score` (and, with `step_check`, by the step checker); rationalised ones carry
    details["rationalized"] = True and the hint-free prompt's example and prompt_ids (the
    hint was only how they were found)."""
    episodes = score_episodes(env.score, engine.generate(examples, samples_per_prompt, generator))
    kept = keep_verified(episodes, distinct, step_check)
    solved_groups = {e.group_id for e in kept}  # a prompt whose only pass was cut off is rationalised too
    stats = {"samples": len(episodes), "tokens": sum(len(e.response_ids) for e in episodes), "kept": len(kept),
             "prompts_solved": len(solved_groups) / max(1, len(examples)),
             "sampled_pass_rate": sum(solved(e) for e in episodes) / max(1, len(episodes)),
             # passed by the verifier but dropped by the step checker: a right answer from a wrong chain
             "step_rejected": len(keep_verified(episodes, distinct)) - len(kept) if step_check else 0,
             "rationalization_samples": 0, "rationalized": 0}
    unsolved = [ex for i, ex in enumerate(examples) if i not in solved_groups]
    if rationalize and unsolved:
        hinted = engine.generate([with_answer_hint(ex) for ex in unsolved], samples_per_prompt, generator)
        for episode in hinted:  # scored against the original problem: the hint is not part of it
            episode.example = unsolved[episode.group_id]
        rescued = keep_verified(score_episodes(env.score, hinted), distinct, step_check)
        for episode in rescued:  # trained without the hint: the original prompt's tokens
            episode.prompt_ids = example_prompt_ids(engine.tokenizer, episode.example)
            episode.details = {**episode.details, "rationalized": True}
        kept += rescued
        stats.update(kept=len(kept), rationalization_samples=len(hinted), rationalized=len(rescued),
                     tokens=stats["tokens"] + sum(len(e.response_ids) for e in hinted))
    for episode in kept:  # SFT targets: the log-probs of the sampler play no part
        episode.response_logp = [0.0] * len(episode.response_ids)
    return kept, stats


def rationale_row(episode: Episode) -> dict:
    """One line of star_data_<i>.jsonl: what a resumed run trains on, token for token."""
    ex = episode.example
    return {"id": ex.id, "prompt": ex.prompt, "expected_answer": ex.expected_answer, "meta": ex.meta,
            "prompt_ids": episode.prompt_ids, "response_ids": episode.response_ids, "completion": episode.completion,
            "reward": episode.reward, "details": episode.details}


def rationale_episode(row: dict, group_id: int) -> Episode:
    example = Example(row["prompt"], row["expected_answer"], row["id"], row["meta"])
    return Episode(example=example, group_id=group_id, prompt_ids=row["prompt_ids"], response_ids=row["response_ids"],
                   response_logp=[0.0] * len(row["response_ids"]), completion=row["completion"],
                   reward=row["reward"], details=row["details"])
