"""Preference data: what the DPO family and the reward model learn from.

Two kinds of record:

    PreferencePair     (prompt, chosen, rejected)   "chosen is better than rejected"
    UnpairedExample    (prompt, completion, desirable)   a thumbs up / down (KTO)

Where pairs come from:
  - `pairs_from_verifier` (data/preference_rows.py): K sampled completions of the same
    prompt, scored by a verifier; every higher-scored completion is paired with every
    lower-scored one, ties dropped. This turns RLVR data into DPO data (though a verifier's
    0/1 reward is not inherently pairwise, which is why RLVR usually trains GRPO on it
    directly).
  - `sentiment_pairs` (data/sentiment_pairs.py): a small bundled set with no verifier, the
    kind of preference a rule cannot check exactly: short review sentences ranked by a
    lexicon sentiment score (`lexicon_sentiment`), standing in for human raters.
  - your own file (`load_preference_data`, this module): JSONL, JSON, Parquet or a saved
    `datasets` directory (posttrain/envs/dataset_files.py), in our format or TRL's.

A row (our JSONL format, one JSON object per line, blank lines ignored):

    pairs      {"prompt": "Review the hotel:\\n", "chosen": "The hotel was lovely.",
                "rejected": "The hotel was awful.", "meta": {"source": "raters"}}
    unpaired   {"prompt": "Review the hotel:\\n", "completion": "The hotel was awful.",
                "desirable": false}

A pair may carry its ranker's scores, as UltraFeedback's binarized sets do: numbers
`score_chosen` >= `score_rejected`, both or neither (PreferencePair.score_chosen / _rejected;
DPO's gap weighting reads their difference). Pairs the library builds carry them too: the
verifier's rewards, a reward model's or the self-judge's scores, the lexicon's sentiment.

TRL's conventions are read too: `label` for `desirable` (KTO's unpaired format); a prompt,
chosen, rejected or completion given as a conversation ({"role", "content"} turns; a
response is one assistant turn, or, beside a prompt column, the prompt's turns and then one
assistant turn, as UltraFeedback's binarised set lays them out: data/feedback_fixture.py
ships a small file in that schema); and pairs with no `prompt` column, whose prompt is what
chosen and rejected share (the turns before their last, or for text the shared start, cut
at a word boundary). Anthropic's hh-rlhf layout, chosen and rejected each one whole dialogue
text ("\\n\\nHuman: ...\\n\\nAssistant: ..."), is read as those turns, so its prompt is every
turn before the last assistant turn (data/hh_rlhf_fixture.py ships a small file in that
schema). Other columns are kept in meta. `desirable`/`label` is a boolean,
`meta` an optional object. A text prompt is fed to the model exactly as written (after a
<bos> token, or as the user turn of an instruct model's chat template) and the response
follows it directly, so put any separator (a newline, "Answer: ") at the end of the prompt.
A source holds one kind only; reading stops at the first bad row with the file, line or row
and what is wrong. A record becomes the rows a trainer reads in data/preference_rows.py.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Iterable

from posttrain.envs.dataset_files import (
    assistant_text,
    conversation,
    missing_column,
    parse_columns,
    plain_prompt,
    read_rows,
)
from posttrain.files import write_atomic
from posttrain.types import PROMPT_MESSAGES, PreferencePair, UnpairedExample


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
    for row in read_rows(path, parse_columns(columns, "rl.preference.pairs_columns")):
        obj = row.record
        row_kind = "pairs" if "chosen" in obj else "unpaired" if "completion" in obj else None
        if row_kind is None:
            raise ValueError(
                f"{row.where}: cannot tell the record kind: a pair needs columns 'chosen' and 'rejected' ('prompt' "
                "optional), an unpaired example 'prompt', 'completion' and 'label' (or 'desirable'); got columns "
                f"{sorted(obj)}; map yours with --rl.preference.pairs_columns 'chosen=COLUMN,...'"
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
    if isinstance(chosen, str) and isinstance(rejected, str) and all(map(is_hh_dialogue, (chosen, rejected))):
        chosen, rejected = hh_dialogue_turns(chosen, where, "chosen"), hh_dialogue_turns(rejected, where, "rejected")
    if isinstance(chosen, str) and isinstance(rejected, str):
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        while shared and not chosen[shared - 1].isspace():
            shared -= 1  # never split a word between the prompt and the responses
        if not shared:
            raise ValueError(f"{where}: no 'prompt' column, and 'chosen' and 'rejected' share no leading text to "
                             "be the prompt; add a 'prompt' column (or map one with --rl.preference.pairs_columns)")
        return chosen[:shared], chosen[shared:], rejected[shared:]
    turns = {name: conversation(value, where, name) for name, value in (("chosen", chosen), ("rejected", rejected))}
    if turns["chosen"][:-1] != turns["rejected"][:-1] or len(turns["chosen"]) < 2 or any(
            t[-1]["role"] != "assistant" for t in turns.values()):
        raise ValueError(f"{where}: no 'prompt' column, so 'chosen' and 'rejected' must be whole conversations that "
                         "share every turn but their last, an assistant turn; add a 'prompt' column otherwise")
    return turns["chosen"][:-1], turns["chosen"][-1]["content"], turns["rejected"][-1]["content"]


# Anthropic's hh-rlhf writes a whole dialogue as one text, each turn after a blank line and its
# speaker: "\n\nHuman: Hi\n\nAssistant: Hello". Read as turns, its pairs take the conversation
# path: the prompt is every turn before the last assistant turn, as the dialogue says.
HH_SPEAKERS = {"Human": "user", "Assistant": "assistant"}
_HH_TURN = re.compile(r"\n\n(Human|Assistant):")


def is_hh_dialogue(text: str) -> bool:
    """Whether `text` is laid out as an hh-rlhf dialogue: it opens with a Human turn."""
    return text.startswith("\n\nHuman:")


def hh_dialogue_turns(text: str, where: str, column: str) -> list[dict[str, str]]:
    """The {role, content} turns of an hh-rlhf dialogue text (each content stripped of the
    space after the colon). Raises ValueError naming the row when it does not end with an
    assistant turn, the response the pair compares."""
    parts = _HH_TURN.split(text)  # ["", "Human", " Hi", "Assistant", " Hello", ...]
    turns = [{"role": HH_SPEAKERS[speaker], "content": content.strip()}
             for speaker, content in zip(parts[1::2], parts[2::2])]
    if turns[-1]["role"] != "assistant":
        raise ValueError(f"{where}: column {column!r} is an hh-rlhf dialogue ('\\n\\nHuman: ...') whose last turn is "
                         "not an Assistant turn; the last turn is the response a pair compares")
    return turns


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

