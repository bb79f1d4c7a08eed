"""Preference records and episodes, both ways: pairs from a verifier's scores on sampled
completions (RLVR samples -> DPO data), and records as the rows a trainer reads (a pair: its
chosen and rejected responses, adjacent; an unpaired example: one row). The records, and the
files they are read from and written to, are in data/preference.py."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from posttrain.roles.engines.contract import encode_prompt
from posttrain.types import PROMPT_MESSAGES, Episode, Example, PreferencePair, Tokenizer, UnpairedExample

# --------------------------------------------------------------------------------------
# Records -> trainable rows
# --------------------------------------------------------------------------------------


def response_episode(tokenizer: Tokenizer, prompt: str, response: str, preferred: bool, group_id: int,
                     max_len: int | None, where: str, messages: list[dict[str, str]] | None = None,
                     score: float | None = None) -> Episode:
    """One response as a trainable row: `[bos] prompt` (or the chat template), then the
    response + [eos], the layout the rollout engine samples, so the EOS is an action the
    policy is trained to take (or not) like any other token. reward 1 marks the chosen /
    desirable side (algorithms/preference/core.py). `messages`: the prompt's turns when it
    is a conversation, for an instruct model's chat template. `score`: the response's score
    in a scored pair, kept in details["score"] for DPO's gap weighting (pair_gaps)."""
    prompt_ids = encode_prompt(tokenizer, prompt, messages)
    response_ids = tokenizer.encode(response) + [tokenizer.eos_id]
    if max_len is not None and len(prompt_ids) + len(response_ids) > max_len:
        raise ValueError(
            f"{where}: prompt + response is {len(prompt_ids) + len(response_ids)} tokens, more than the model's "
            f"max_seq_len={max_len}; shorten or drop this record, or use a model with a larger max_seq_len"
        )
    example = Example(prompt, "", meta={PROMPT_MESSAGES: messages} if messages else {})
    return Episode(example=example, group_id=group_id, prompt_ids=prompt_ids, response_ids=response_ids,
                   response_logp=[0.0] * len(response_ids), completion=response, reward=float(preferred),
                   details={} if score is None else {"score": score})


def preference_episodes(records: Sequence[PreferencePair | UnpairedExample], tokenizer: Tokenizer,
                        max_len: int | None = None) -> list[list[Episode]]:
    """Each record's rows, in record order: a pair gives [chosen, rejected] (one group of two,
    adjacent, so micro-batches of an even size never split a pair), an unpaired example
    one row. Raises ValueError naming the record when one does not fit the model."""
    out = []
    for i, r in enumerate(records):
        where, turns = f"record {i}", r.meta.get(PROMPT_MESSAGES)
        if isinstance(r, PreferencePair):
            out.append([response_episode(tokenizer, r.prompt, r.chosen, True, i, max_len, where, turns, r.score_chosen),
                        response_episode(tokenizer, r.prompt, r.rejected, False, i, max_len, where, turns,
                                         r.score_rejected)])
        elif isinstance(r, UnpairedExample):
            out.append([response_episode(tokenizer, r.prompt, r.completion, r.desirable, i, max_len, where, turns)])
        else:
            raise TypeError(f"{where}: expected PreferencePair or UnpairedExample, got {type(r).__name__}")
    return out


def pair_gaps(rows: Sequence[list[Episode]]) -> list[float]:
    """score_chosen − score_rejected of each pair's rows (preference_episodes' layout), for
    DPO's gap weighting; ValueError naming the first record without scores (a scored and an
    unscored pair cannot be weighed against each other: score every pair, or weight none)."""
    gaps = []
    for i, record in enumerate(rows):
        if len(record) != 2 or any("score" not in e.details for e in record):
            kind = "an unpaired example" if len(record) != 2 else "a pair without scores"
            raise ValueError(f"record {i} is {kind}, and gap weighting weighs each pair by score_chosen − "
                             "score_rejected: give every pair both scores (a file's score_chosen / score_rejected "
                             "columns; pairs the library builds carry them), or set --dpo.gap_weighting none")
        chosen, rejected = record
        gaps.append(chosen.details["score"] - rejected.details["score"])
    return gaps


# --------------------------------------------------------------------------------------
# Pairs from a verifier: RLVR samples -> DPO data
# --------------------------------------------------------------------------------------


def group_by_prompt(episodes: Iterable[Episode]) -> dict[str, list[Episode]]:
    """Episodes grouped by their prompt text, groups in order of first appearance."""
    groups: dict[str, list[Episode]] = {}
    for e in episodes:
        groups.setdefault(e.example.prompt, []).append(e)
    return groups


def pairs_from_verifier(
    episodes_by_prompt: Mapping[str, list[Episode]] | Iterable[list[Episode]],
    drop_unfinished: bool = True,
    max_pairs_per_prompt: int | None = None,
    best_vs_worst: bool = False,
) -> list[PreferencePair]:
    """Preference pairs from scored samples: within each prompt's group, every completion
    is paired with every completion of strictly lower reward (for a 0/1 verifier: each
    correct with each incorrect sample). Equal rewards are ties and give no pair.

    episodes_by_prompt: groups of Episodes (reward already set), e.g. `group_by_prompt(eps)`;
        every episode of a group must answer the same prompt (a pair across prompts is not
        a preference), else ValueError.
    drop_unfinished: skip episodes cut off by max_new_tokens: re-encoding one for training
        appends an <eos> the model never emitted, so it would be a made-up response.
    max_pairs_per_prompt: keep at most this many pairs per prompt (the first ones in the
        order below), so one prompt with many samples cannot dominate; None keeps all.
    best_vs_worst: one pair per prompt, its highest-scored completion against its lowest
        (the first of each in the order below), for a continuous score such as a reward
        model's, where "every higher against every lower" is mostly pairs a hair apart.

    Deterministic: repeated completion texts are kept once (the first occurrence), then pairs
    are listed by prompt in input order, then by the chosen's and the rejected's position in
    the group. Each pair carries both rewards as its scores, and in meta the example's id and its
    difficulty label (meta difficulty or level) when it has one.
    """
    groups = episodes_by_prompt.values() if isinstance(episodes_by_prompt, Mapping) else episodes_by_prompt
    pairs = []
    for group in groups:
        group = list(group)
        if not group:
            continue
        prompt = group[0].example.prompt
        if any(e.example.prompt != prompt for e in group):
            others = sorted({e.example.prompt for e in group} - {prompt})
            raise ValueError(
                f"a group mixes prompts ({prompt!r} and {others[0]!r}); pairs must compare answers to the "
                "same prompt: group the episodes with group_by_prompt first"
            )
        unique: dict[str, Episode] = {}
        for e in group:
            if e.finished or not drop_unfinished:
                unique.setdefault(e.completion, e)
        candidates = list(unique.values())
        if best_vs_worst and candidates:
            best = max(candidates, key=lambda e: e.reward)  # max / min keep the first of equals
            worst = min(candidates, key=lambda e: e.reward)
            candidates = [best, worst]
        turns = group[0].example.meta.get(PROMPT_MESSAGES)  # a conversation keeps its chat template in training
        # the prompt's difficulty label, if it has one, for pair balancing by topic (data/pair_balance.py)
        label = {k: group[0].example.meta[k] for k in ("difficulty", "level") if k in group[0].example.meta}
        group_pairs = [
            PreferencePair(
                prompt,
                better.completion,
                worse.completion,
                {"id": better.example.id, **label, **({PROMPT_MESSAGES: turns} if turns else {})},
                score_chosen=better.reward,
                score_rejected=worse.reward,
            )
            for better in candidates
            for worse in candidates
            if better.reward > worse.reward
        ]
        pairs.extend(group_pairs if max_pairs_per_prompt is None else group_pairs[:max_pairs_per_prompt])
    return pairs
