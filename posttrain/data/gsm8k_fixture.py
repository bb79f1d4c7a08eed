"""A bundled file in GSM8K's schema, written from templates whose answers are checked.

GSM8K (Cobbe et al. 2021, arXiv:2110.14168) is the grade-school word-problem set most RLVR
recipes start from. Nothing may be downloaded here, so this module writes a stand-in with
exactly its columns, so that code written against it reads the real train.jsonl unchanged:

    question   "A baker makes 23 loaves on Monday and 7 more on Tuesday than on Monday. ..."
    answer     "On Tuesday the baker makes 23+7 = <<23+7=30>>30 loaves.\\n
                Over the two days the baker makes 23+30 = <<23+30=53>>53 loaves.\\n#### 53"

Every answer is worked lines with GSM8K's calculator annotations, then `#### <int>`. Each row
is checked before it is written, by code that does not share the template's arithmetic:
gsm8k/hash-v1 scores the answer 1 against the final integer, and every annotation's
expression, evaluated exactly (verifiers/gsm8k.py), gives the result written. The problems
are two to four steps of the four operations and percentages, over eight templates; the
numbers come from one seeded generator. They are easier and more uniform than GSM8K's, so
a number measured on this file says the pipeline works, not how a model does on GSM8K.

    posttrain train --env.name gsm8k --env.path posttrain/data/packs/gsm8k_style_train.jsonl \\
        --env.heldout_path posttrain/data/packs/gsm8k_style_test.jsonl ...
    posttrain train --env.name gsm8k --env.path train.jsonl --env.heldout_path test.jsonl  # the real one

Rebuild: `python -m posttrain.data.gsm8k_fixture` (byte-identical; `--check` exits 1 when the
shipped file differs).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Callable

from posttrain.files import jsonl_text, write_or_check
from posttrain.verifiers.gsm8k import HashV1, calculator_annotations

# two files, as GSM8K ships its train and test splits: 600 problems to train on, 200 held out
PACKS = Path(__file__).resolve().parent / "packs"
GSM8K_FIXTURE = {"train": PACKS / "gsm8k_style_train.jsonl", "test": PACKS / "gsm8k_style_test.jsonl"}
FIXTURE_ROWS = {"train": 600, "test": 200}
FIXTURE_SEED = 2110  # one seed for the whole file; change it and every row changes
NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Farah", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena")


def _bakery(rng: random.Random) -> tuple[str, list[str], int]:
    monday, more = rng.randint(12, 60), rng.randint(3, 20)
    tuesday = monday + more
    question = (f"A baker makes {monday} loaves on Monday and {more} more loaves on Tuesday than on Monday. "
                "How many loaves does the baker make on the two days?")
    return question, [f"On Tuesday the baker makes {monday}+{more} = <<{monday}+{more}={tuesday}>>{tuesday} loaves.",
                      f"Over the two days the baker makes {monday}+{tuesday} = <<{monday}+{tuesday}="
                      f"{monday + tuesday}>>{monday + tuesday} loaves."], monday + tuesday


def _pencils(rng: random.Random) -> tuple[str, list[str], int]:
    name, boxes, per_box = rng.choice(NAMES), rng.randint(2, 9), rng.randint(6, 24)
    pencils = boxes * per_box
    given = rng.randint(1, pencils - 1)
    question = (f"{name} buys {boxes} boxes of pencils with {per_box} pencils in each box, then gives away "
                f"{given} pencils. How many pencils does {name} have left?")
    return question, [f"{name} buys {boxes}*{per_box} = <<{boxes}*{per_box}={pencils}>>{pencils} pencils.",
                      f"After giving some away, {name} has {pencils}-{given} = <<{pencils}-{given}="
                      f"{pencils - given}>>{pencils - given} pencils left."], pencils - given


def _groups(rng: random.Random) -> tuple[str, list[str], int]:
    size, groups, markers = rng.randint(2, 6), rng.randint(3, 9), rng.randint(2, 8)
    students = size * groups
    question = (f"A class of {students} students works in groups of {size}. Each group needs {markers} markers. "
                "How many markers does the class need?")
    return question, [f"There are {students}/{size} = <<{students}/{size}={groups}>>{groups} groups.",
                      f"The class needs {groups}*{markers} = <<{groups}*{markers}={groups * markers}>>"
                      f"{groups * markers} markers."], groups * markers


def _sale(rng: random.Random) -> tuple[str, list[str], int]:
    percent = rng.choice((10, 20, 25, 50))
    price = rng.randint(2, 15) * 20  # a multiple of 20: every discount above is whole dollars
    discount = price * percent // 100
    question = f"A jacket costs ${price}. It is on sale for {percent}% off. How many dollars does it cost on sale?"
    return question, [f"The discount is {price}*{percent}/100 = <<{price}*{percent}/100={discount}>>{discount} dollars.",
                      f"On sale it costs {price}-{discount} = <<{price}-{discount}={price - discount}>>"
                      f"{price - discount} dollars."], price - discount


def _reading(rng: random.Random) -> tuple[str, list[str], int]:
    name, first, days, second, more_days = (rng.choice(NAMES), rng.randint(5, 30), rng.randint(2, 7),
                                            rng.randint(5, 30), rng.randint(2, 7))
    a, b = first * days, second * more_days
    question = (f"{name} reads {first} pages a day for {days} days, then {second} pages a day for {more_days} days. "
                f"How many pages does {name} read in all?")
    return question, [f"First {name} reads {first}*{days} = <<{first}*{days}={a}>>{a} pages.",
                      f"Then {name} reads {second}*{more_days} = <<{second}*{more_days}={b}>>{b} pages.",
                      f"In all {name} reads {a}+{b} = <<{a}+{b}={a + b}>>{a + b} pages."], a + b


def _farm(rng: random.Random) -> tuple[str, list[str], int]:
    cows, times = rng.randint(3, 40), rng.choice((2, 3, 4))
    chickens, cow_legs = cows * times, cows * 4
    how_many = {2: "twice", 3: "three times", 4: "four times"}[times]
    question = (f"A farm has {cows} cows and {how_many} as many chickens. A cow has 4 legs and a chicken has 2 "
                "legs. How many legs are there on the farm?")
    return question, [f"There are {cows}*{times} = <<{cows}*{times}={chickens}>>{chickens} chickens.",
                      f"The cows have {cows}*4 = <<{cows}*4={cow_legs}>>{cow_legs} legs.",
                      f"The chickens have {chickens}*2 = <<{chickens}*2={chickens * 2}>>{chickens * 2} legs.",
                      f"There are {cow_legs}+{chickens * 2} = <<{cow_legs}+{chickens * 2}={cow_legs + chickens * 2}>>"
                      f"{cow_legs + chickens * 2} legs in all."], cow_legs + chickens * 2


def _savings(rng: random.Random) -> tuple[str, list[str], int]:
    name, wage, hours, weeks = rng.choice(NAMES), rng.randint(8, 20), rng.randint(2, 10) * 2, rng.randint(2, 6)
    earned = wage * hours
    saved = earned // 2
    question = (f"{name} earns ${wage} an hour and works {hours} hours a week, saving half of each week's pay. "
                f"How many dollars does {name} save in {weeks} weeks?")
    return question, [f"Each week {name} earns {wage}*{hours} = <<{wage}*{hours}={earned}>>{earned} dollars.",
                      f"{name} saves {earned}/2 = <<{earned}/2={saved}>>{saved} dollars a week.",
                      f"In {weeks} weeks {name} saves {saved}*{weeks} = <<{saved}*{weeks}={saved * weeks}>>"
                      f"{saved * weeks} dollars."], saved * weeks


def _trip(rng: random.Random) -> tuple[str, list[str], int]:
    speed, hours, total_extra = rng.randint(30, 70), rng.randint(2, 5), rng.randint(10, 90)
    driven = speed * hours
    question = (f"A bus drives at {speed} miles an hour for {hours} hours and then has {total_extra} miles left "
                "to go. How long is the whole trip in miles?")
    return question, [f"The bus drives {speed}*{hours} = <<{speed}*{hours}={driven}>>{driven} miles.",
                      f"The whole trip is {driven}+{total_extra} = <<{driven}+{total_extra}={driven + total_extra}>>"
                      f"{driven + total_extra} miles."], driven + total_extra


TEMPLATES: tuple[Callable[[random.Random], tuple[str, list[str], int]], ...] = (
    _bakery, _pencils, _groups, _sale, _reading, _farm, _savings, _trip)


def gsm8k_rows(n: int = sum(FIXTURE_ROWS.values()), seed: int = FIXTURE_SEED) -> list[dict[str, str]]:
    """n distinct rows {question, answer} in GSM8K's schema, the templates taken in turn;
    deterministic in (n, seed). Raises RuntimeError if a template writes an answer the
    checks refuse (module docstring): the file would teach a wrong solution."""
    rng, rows, seen = random.Random(seed), [], set()
    spec = HashV1()
    for attempt in range(n * 20):  # a repeated question is drawn again; every template has hundreds
        if len(rows) == n:
            break
        template = TEMPLATES[attempt % len(TEMPLATES)]
        question, lines, final = template(rng)
        if question in seen:
            continue
        seen.add(question)
        answer = "\n".join(lines) + f"\n#### {final}"
        scored = spec({"prompt": question, "expected_answer": str(final)}, answer)
        broken = [note.expression for note in calculator_annotations(answer) if not note.holds]
        if scored["reward"] != 1.0 or broken or not answer.isascii():
            raise RuntimeError(f"template {template.__name__} wrote {answer!r}: score {scored['reward']}, "
                               f"annotations that do not hold {broken}")
        rows.append({"question": question, "answer": answer})
    if len(rows) < n:
        raise RuntimeError(f"the templates gave {len(rows)} distinct questions, not {n}; widen their number ranges")
    return rows


def fixture_texts() -> dict[Path, str]:
    """Each file's text: the first FIXTURE_ROWS["train"] rows train, the rest are the test split."""
    rows = gsm8k_rows()
    split_at = FIXTURE_ROWS["train"]
    return {GSM8K_FIXTURE["train"]: jsonl_text(rows[:split_at]), GSM8K_FIXTURE["test"]: jsonl_text(rows[split_at:])}


def main(argv: list[str] | None = None) -> int:
    return write_or_check(fixture_texts(), "python -m posttrain.data.gsm8k_fixture", sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    raise SystemExit(main())
