"""Preference data: what the DPO family and the reward model learn from.

Two kinds of record:

    PreferencePair     (prompt, chosen, rejected)   "chosen is better than rejected"
    UnpairedExample    (prompt, completion, desirable)   a thumbs up / down (KTO)

Where pairs come from, in this module:
  - `pairs_from_verifier`: K sampled completions of the same prompt, scored by a verifier;
    every higher-scored completion is paired with every lower-scored one, ties dropped. This
    turns RLVR data into DPO data (though a verifier's 0/1 reward is not inherently
    pairwise, which is why RLVR usually trains GRPO on it directly).
  - `sentiment_pairs`: a small bundled set with no verifier, the kind of preference a rule
    cannot check exactly: short review sentences ranked by a lexicon sentiment score
    (`lexicon_sentiment`), standing in for human raters.
  - your own file (`load_preference_data`): JSONL, JSON, Parquet or a saved `datasets`
    directory (posttrain/envs/dataset_files.py), in our format or TRL's.

A row (our JSONL format, one JSON object per line, blank lines ignored):

    pairs      {"prompt": "Review the hotel:\\n", "chosen": "The hotel was lovely.",
                "rejected": "The hotel was awful.", "meta": {"source": "raters"}}
    unpaired   {"prompt": "Review the hotel:\\n", "completion": "The hotel was awful.",
                "desirable": false}

A pair may carry its ranker's scores, as UltraFeedback's binarized sets do: numbers
`score_chosen` >= `score_rejected`, both or neither (PreferencePair.score_chosen / _rejected;
DPO's gap weighting reads their difference). Pairs built here carry them too: the verifier's
rewards, a reward model's or the self-judge's scores, the lexicon's sentiment.

TRL's conventions are read too: `label` for `desirable` (KTO's unpaired format); a prompt,
chosen, rejected or completion given as a conversation ({"role", "content"} turns; a
response is one assistant turn, or, beside a prompt column, the prompt's turns and then one
assistant turn, as UltraFeedback's binarised set lays them out: data/feedback_fixture.py
ships a small file in that schema); and pairs with no `prompt` column, whose prompt is what
chosen and rejected share (the turns before their last, or for text the shared start, cut
at a word boundary). Other columns are kept in meta. `desirable`/`label` is a boolean,
`meta` an optional object. A text prompt is fed to the model exactly as written (after a
<bos> token, or as the user turn of an instruct model's chat template) and the response
follows it directly, so put any separator (a newline, "Answer: ") at the end of the prompt.
A source holds one kind only; reading stops at the first bad row with the file, line or row
and what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from posttrain.envs.dataset_files import (
    assistant_text,
    conversation,
    missing_column,
    parse_columns,
    plain_prompt,
    read_rows,
)
from posttrain.files import write_atomic
from posttrain.roles.rollout import encode_prompt
from posttrain.types import PROMPT_MESSAGES, Episode, Example, PreferencePair, UnpairedExample


def unpaired_from_pairs(pairs: Iterable[PreferencePair]) -> list[UnpairedExample]:
    """Each pair as two unpaired examples, chosen desirable and rejected undesirable (how
    the KTO paper runs on paired datasets)."""
    out = []
    for p in pairs:
        out.append(UnpairedExample(p.prompt, p.chosen, True, dict(p.meta)))
        out.append(UnpairedExample(p.prompt, p.rejected, False, dict(p.meta)))
    return out


# --------------------------------------------------------------------------------------
# JSONL read / write
# --------------------------------------------------------------------------------------

PAIR_FIELDS = {"prompt": str, "chosen": str, "rejected": str}
UNPAIRED_FIELDS = {"prompt": str, "completion": str, "desirable": bool}


def save_preference_jsonl(records: Iterable[PreferencePair | UnpairedExample], path: str | Path) -> None:
    """Write pairs or unpaired examples, one JSON object per line, atomically (a killed
    process leaves the old file or the whole new one)."""
    lines = []
    for r in records:
        if isinstance(r, PreferencePair):
            obj = {"prompt": r.prompt, "chosen": r.chosen, "rejected": r.rejected}
            if r.score_chosen is not None:  # UltraFeedback's column names: the file reads back as it was
                obj |= {"score_chosen": r.score_chosen, "score_rejected": r.score_rejected}
        elif isinstance(r, UnpairedExample):
            obj = {"prompt": r.prompt, "completion": r.completion, "desirable": r.desirable}
        else:
            raise TypeError(f"expected PreferencePair or UnpairedExample, got {type(r).__name__}")
        if r.meta:
            obj["meta"] = r.meta
        lines.append(json.dumps(obj, ensure_ascii=False) + "\n")
    write_atomic(path, "".join(lines))


def load_preference_data(path: str | Path, columns: str = "") -> list[PreferencePair] | list[UnpairedExample]:
    """Read preference data from any source envs/dataset_files.py reads (JSONL, JSON,
    Parquet, a saved dataset), columns renamed by `columns` ("chosen=good,rejected=bad").
    The first row decides whether it is a pairs source (has "chosen") or an unpaired one
    (has "completion"). Raises ValueError naming the file and line or row of the first
    problem."""
    records: list = []
    kind = None
    for row in read_rows(path, parse_columns(columns, "rl.pairs_columns")):
        obj = row.record
        row_kind = "pairs" if "chosen" in obj else "unpaired" if "completion" in obj else None
        if row_kind is None:
            raise ValueError(
                f"{row.where}: cannot tell the record kind: a pair needs columns 'chosen' and 'rejected' ('prompt' "
                "optional), an unpaired example 'prompt', 'completion' and 'label' (or 'desirable'); got columns "
                f"{sorted(obj)}; map yours with --rl.pairs_columns 'chosen=COLUMN,...'"
            )
        kind = kind or row_kind
        if row_kind != kind:
            what = {"pairs": "a pair", "unpaired": "an unpaired example"}
            raise ValueError(f"{row.where}: this row is {what[row_kind]}, the first row {what[kind]}; one source "
                             "holds one kind of record (pairs: chosen/rejected; unpaired: completion/label)")
        records.append(_parse_record(obj, kind, row.where))
    return records


load_preference_jsonl = load_preference_data  # the name it had when it read JSONL only


def _parse_record(obj: dict, kind: str, where: str) -> PreferencePair | UnpairedExample:
    record = dict(obj)
    if kind == "pairs":
        for name in ("chosen", "rejected"):
            if name not in record:
                raise missing_column(where, name, obj, "a pair needs 'chosen' and 'rejected' (and usually 'prompt')")
        prompt, chosen, rejected = _pair_texts(record.pop("prompt", None), record.pop("chosen"),
                                               record.pop("rejected"), where)
        scores = _pair_scores(record.pop("score_chosen", None), record.pop("score_rejected", None), where)
    else:
        if "prompt" not in record:
            raise missing_column(where, "prompt", obj, "an unpaired example needs 'prompt', 'completion', 'label'")
        prompt, completion = record.pop("prompt"), assistant_text(record.pop("completion"), where, "completion")
        if "label" in record and "desirable" in record:
            raise ValueError(f"{where}: both 'label' and 'desirable' are columns; they mean the same: keep one")
        name = "label" if "label" in record else "desirable"
        if name not in record:
            raise missing_column(where, "label", obj, "an unpaired example needs a boolean 'label' (TRL's KTO name; "
                                 "ours is 'desirable'): true for a desirable completion")
        desirable = record.pop(name)
        if type(desirable) is not bool:  # `type is`, so that 1 is not accepted as a bool
            raise ValueError(f"{where}: {name!r} must be a boolean (true: desirable), got "
                             f"{type(desirable).__name__} {desirable!r:.60}")
        if not isinstance(prompt, str):
            prompt = conversation(prompt, where, "prompt")
    meta = record.pop("meta", None) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{where}: 'meta' must be a JSON object, got {type(meta).__name__}")
    meta = {**meta, **record}  # other columns kept, as problems keep theirs
    if isinstance(prompt, list):
        meta[PROMPT_MESSAGES] = prompt
        prompt = plain_prompt(prompt)
    if kind == "unpaired":
        return UnpairedExample(prompt, completion, desirable, meta)
    if chosen == rejected:
        raise ValueError(f"{where}: 'chosen' and 'rejected' are the same text, which carries no preference")
    return PreferencePair(prompt, chosen, rejected, meta, *scores)


def _pair_scores(score_chosen, score_rejected, where: str) -> tuple[float | None, float | None]:
    """A pair's two scores (UltraFeedback's `score_chosen` / `score_rejected` columns), both or
    neither, each a finite number, chosen >= rejected; (None, None) for an unscored pair."""
    if score_chosen is None and score_rejected is None:
        return None, None
    if score_chosen is None or score_rejected is None:
        given = "score_chosen" if score_rejected is None else "score_rejected"
        raise ValueError(f"{where}: {given!r} is set but not its partner; a pair's scores come both or neither "
                         "(score_chosen and score_rejected)")
    for name, value in (("score_chosen", score_chosen), ("score_rejected", score_rejected)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{where}: {name!r} must be a finite number, got {type(value).__name__} {value!r:.60}")
    if score_chosen < score_rejected:
        raise ValueError(f"{where}: score_chosen={score_chosen} is below score_rejected={score_rejected}: the chosen "
                         "response must score at least as high; swap the pair or fix its scores")
    return float(score_chosen), float(score_rejected)


def _pair_texts(prompt, chosen, rejected, where: str) -> tuple[str | list, str, str]:
    """(prompt: a str or turns, chosen text, rejected text). Without a prompt column the
    prompt is implicit, as in TRL: the turns (or text) chosen and rejected share before
    their last assistant turn (or before they differ, cut at a word boundary)."""
    if prompt is not None:
        if not isinstance(prompt, str):
            prompt = conversation(prompt, where, "prompt")
        return prompt, _response(chosen, prompt, where, "chosen"), _response(rejected, prompt, where, "rejected")
    if isinstance(chosen, str) and isinstance(rejected, str):
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        while shared and not chosen[shared - 1].isspace():
            shared -= 1  # never split a word between the prompt and the responses
        if not shared:
            raise ValueError(f"{where}: no 'prompt' column, and 'chosen' and 'rejected' share no leading text to "
                             "be the prompt; add a 'prompt' column (or map one with --rl.pairs_columns)")
        return chosen[:shared], chosen[shared:], rejected[shared:]
    turns = {name: conversation(value, where, name) for name, value in (("chosen", chosen), ("rejected", rejected))}
    if turns["chosen"][:-1] != turns["rejected"][:-1] or len(turns["chosen"]) < 2 or any(
            t[-1]["role"] != "assistant" for t in turns.values()):
        raise ValueError(f"{where}: no 'prompt' column, so 'chosen' and 'rejected' must be whole conversations that "
                         "share every turn but their last, an assistant turn; add a 'prompt' column otherwise")
    return turns["chosen"][:-1], turns["chosen"][-1]["content"], turns["rejected"][-1]["content"]


def _response(value, prompt: str | list, where: str, column: str) -> str:
    """A response's text: a str, one assistant turn, or (UltraFeedback's layout, a prompt
    column beside whole conversations) the prompt's turns then one assistant turn, the
    prompt's turns checked against the prompt column so that a pair never trains on an
    answer to another question."""
    if not isinstance(value, list) or len(value) < 2:
        return assistant_text(value, where, column)
    turns = conversation(value, where, column)
    asked = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if turns[:-1] != asked:
        raise ValueError(f"{where}: column {column!r} is a conversation whose turns before the response "
                         f"({turns[:-1]!r:.120}) are not the 'prompt' column ({prompt!r:.80}); give the response "
                         "alone (one assistant turn), or a conversation that repeats the prompt")
    return assistant_text(turns[-1:], where, column)


# --------------------------------------------------------------------------------------
# Records -> trainable rows
# --------------------------------------------------------------------------------------


def response_episode(tokenizer, prompt: str, response: str, preferred: bool, group_id: int,
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


def preference_episodes(records: Sequence[PreferencePair | UnpairedExample], tokenizer,
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
    the group. Each pair carries both rewards as its scores, and the example id in meta.
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
        group_pairs = [
            PreferencePair(
                prompt,
                better.completion,
                worse.completion,
                {"id": better.example.id, **({PROMPT_MESSAGES: turns} if turns else {})},
                score_chosen=better.reward,
                score_rejected=worse.reward,
            )
            for better in candidates
            for worse in candidates
            if better.reward > worse.reward
        ]
        pairs.extend(group_pairs if max_pairs_per_prompt is None else group_pairs[:max_pairs_per_prompt])
    return pairs


# --------------------------------------------------------------------------------------
# A bundled preference set with no verifier: review sentences ranked by sentiment
# --------------------------------------------------------------------------------------

# Word valences on a rough −3..3 scale (the shape of VADER's lexicon, our own values).
LEXICON: dict[str, float] = {
    "excellent": 3.0, "wonderful": 3.0, "superb": 3.0, "great": 2.0, "lovely": 2.0,
    "friendly": 2.0, "tasty": 2.0, "good": 1.5, "pleasant": 1.5, "fine": 0.5,
    "horrible": -3.0, "terrible": -3.0, "awful": -3.0, "rude": -2.0, "poor": -2.0,
    "dirty": -2.0, "bad": -1.5, "bland": -1.0, "dull": -1.0, "slow": -1.0,
}
NEGATIONS = frozenset({"not", "never"})
INTENSIFIERS = {"very": 1.5, "really": 1.5, "quite": 1.2, "slightly": 0.5}
NEGATION_SCALE = -0.5  # "not good" is mildly bad, not as bad as "bad" (VADER uses −0.74)
CLAUSE_BREAKS = frozenset({"and", "but", ".", ",", "!", "?", ";"})
_WORDS = re.compile(r"[a-z]+|[.,!?;]")


def lexicon_sentiment(text: str) -> float:
    """A transparent sentiment score: the sum of word valences from `LEXICON`, where an
    intensifier scales the next sentiment word and a negation flips and halves it, within
    the same clause. Any str is scored (unknown words count 0); higher is more positive.

        "The soup was good."            ->  1.5
        "The soup was very good."       ->  1.5 · 1.5 = 2.25
        "The soup was not good."        ->  1.5 · −0.5 = −0.75
        "Great room, but rude staff."   ->  2 − 2 = 0
    """
    score, scale, negated = 0.0, 1.0, False
    for word in _WORDS.findall(text.lower()):
        if word in NEGATIONS:
            negated = True
        elif word in INTENSIFIERS:
            scale *= INTENSIFIERS[word]
        elif word in LEXICON:
            score += LEXICON[word] * scale * (NEGATION_SCALE if negated else 1.0)
            scale, negated = 1.0, False
        elif word in CLAUSE_BREAKS:
            scale, negated = 1.0, False
    return score


SUBJECTS = ("pizza", "hotel", "movie", "service", "coffee", "book", "room", "staff", "soup", "concert")


def review(rng: random.Random, subject: str) -> str:
    """'The hotel was very good and slow.': one or two sentiment phrases (one in two of
    three reviews), each with a negation 15% of the time and an intensifier 30%, the word
    uniform over LEXICON. The writer behind `sentiment_pairs`; lesson 15 samples it as the
    policy RLHF starts from."""
    phrases = []
    for _ in range(rng.choice((1, 1, 2))):
        words = []
        if rng.random() < 0.15:
            words.append(rng.choice(sorted(NEGATIONS)))
        if rng.random() < 0.3:
            words.append(rng.choice(sorted(INTENSIFIERS)))
        words.append(rng.choice(sorted(LEXICON)))
        phrases.append(" ".join(words))
    return f"The {subject} was {' and '.join(phrases)}."


def _split_of(text: str) -> str:
    """train (80%) or heldout (20%), from a stable hash of the pair's text."""
    bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 100
    return "train" if bucket < 80 else "heldout"


def sentiment_pairs(n: int, seed: int = 0, split: str = "train", min_gap: float = 1.0) -> list[PreferencePair]:
    """n review pairs for one prompt each: two reviews of the same subject, the one with the
    higher `lexicon_sentiment` chosen. Pairs whose scores differ by less than `min_gap` are
    redrawn: near-ties are the pairs human raters disagree on, and filtering them is the
    usual curation step (default 1.0: "good" vs "fine" stays, "fine" vs "not bad" goes; 0
    drops only exact ties). A pair's split is a hash of its text, so "train" and "heldout"
    never share a pair whatever the seeds.

        prompt "Review the soup:\\n"  chosen "The soup was tasty."  rejected "The soup was not good."
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if not 0 <= min_gap <= 4:
        raise ValueError(f"min_gap must be in [0, 4] (larger gaps are too rare to fill n pairs), got {min_gap!r}")
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        subject = rng.choice(SUBJECTS)
        a, b = review(rng, subject), review(rng, subject)
        score_a, score_b = lexicon_sentiment(a), lexicon_sentiment(b)
        if score_a == score_b or abs(score_a - score_b) < min_gap:
            continue  # a tie is no preference; a near-tie a noisy one
        prompt = f"Review the {subject}:\n"
        if _split_of(prompt + "\0" + "\0".join(sorted((a, b)))) != split:
            continue
        chosen, rejected = (a, b) if score_a > score_b else (b, a)
        pairs.append(PreferencePair(prompt, chosen, rejected, score_chosen=max(score_a, score_b),
                                    score_rejected=min(score_a, score_b)))
    return pairs
