"""Every number the docs quote from a lesson's computation is read back from that computation,
so the page and the lesson cannot drift apart.

The quotes live in docs/getting-started.md's list of lessons (README.md quotes none: its
numbers are `make run`'s and the demos', not a lesson's). Each test finds the quote in the
page's text (line breaks folded into spaces), then computes the number the way the lesson
does (running the lesson headless, app.run(), or calling the library function it calls)
and compares at the precision the page states.

| quote in docs/getting-started.md | computed by |
|:---|:---|
| 15: the policy narrows "from ~410 reviews" | lesson 15's `start["distinct"]`, e^H of π_ref over the writer's 5,000 reviews (seeded: any machine) |
| 15: "to one or two" | lesson 15's `sweep[-1]["distinct"]` at the smallest β (rounds to 1 or 2; its reward model differs a little by CPU) |
| 16: "a tiny policy's 19 possible answers" | lesson 16's `ANSWERS`, one per sum of two digits |
| 18a: "8 samples of 1,024 arithmetic prompts each" | `lessons/data/18a_pass_rates/pass_counts.json`, the measurement the lesson reads |
| 22: "16 or 18 bytes a parameter" | `systems/memory.py`'s `MIXED_ADAMW` and `MIXED_ADAMW_FP32_GRADS`, which the lesson's sizer shows |
| 22: "a real Trainer step measured at 16 bytes a parameter" | lesson 22's `held` / `trained` after one `Trainer` step |
| 23: "R1 with R1-Zero's data: one setting, `env.cot`" | lesson 23's `changed` at its defaults |
| 23: "Tülu 3 with Kimi's data: refused" | lesson 23's `refused` with recipe tulu3_rlvr, donor kimi_k15 |
| 23: "six published recipes" | lesson 23's `published` (lessons/data/23_published_recipes.toml) |
| 23: "seven symptoms" ... "a synthetic 40-step run" | lesson 23's `SYMPTOMS` and `STEPS` |
| 23: "each symptom fires its own monitor and no other" | lesson 23's `failure_map` (`others` empty, a first step for each) |
| 23: "a line loosened ×3 hides six of the seven" | lesson 23's `failure_map[...]["hidden_from"]` at most 3 |
| 26: "scores eight designs" | `teach/forces.py`'s `DESIGNS` |
| 26: "a leave-one-out group of 16" | the `estimator_noise(..., k=16, ...)` call lesson 26 makes |
| 26: "`hackable/multi-final` measures 0.75" | `forces.verifier_fidelity("hackable/multi-final")`, the lesson's fidelity |
| 26: "five designs tie, R1-Zero first" | `forces.rank` + `tied_at_top` at the lesson's default weights and coverage, with that spec |
| 27: "twenty-two ideas" ... "eighteen are in posttrain" | lesson 27's `CONCEPTS` (those with a `code` entry) |

Machine-dependent numbers the page does not quote but leaves to the lesson: lesson 15's gold
peak and fall, lesson 16's pass@1 per loss, lesson 18a's live shares, lesson 25's log-prob gaps.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from posttrain.systems.memory import MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS
from posttrain.teach import forces

ROOT = Path(__file__).resolve().parent.parent
LESSONS = ROOT / "lessons"
GETTING_STARTED = " ".join((ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8").split())
WORDS = {"one": 1, "two": 2, "three": 3, "five": 5, "six": 6, "seven": 7, "eight": 8, "twelve": 12, "seventeen": 17,
         "eighteen": 18, "twenty-two": 22}


@pytest.fixture
def restore_threads():
    """The lessons set torch to one thread; do not leak that into other tests."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def quoted(pattern: str) -> re.Match:
    """The page's quote, found by a regex over its text with line breaks folded into spaces."""
    match = re.search(pattern, GETTING_STARTED)
    assert match, f"docs/getting-started.md no longer says {pattern!r}: update the quote or this test"
    return match


def number(text: str) -> float:
    """'1,024' -> 1024, 'seven' -> 7, '0.75' -> 0.75."""
    if text in WORDS:
        return WORDS[text]
    assert re.fullmatch(r"[\d,]*\.?\d+", text), f"the page now says {text!r} where a number stood: add it to WORDS"
    return float(text.replace(",", ""))


def run_lesson(name: str, tmp_path: Path, replacements: dict[str, str] | None = None) -> dict:
    """A lesson run headless (app.run()), widget defaults optionally replaced; its public definitions."""
    text = (LESSONS / name).read_text(encoding="utf-8")
    for default, setting in (replacements or {}).items():
        assert text.count(default) == 1, f"{default!r} should occur exactly once in {name}"
        text = text.replace(default, setting)
    copy = tmp_path / name
    copy.write_text(text, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"lesson_quoted_{copy.stem}", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _, defs = module.app.run()
    return defs


def assigned_literal(name: str, variable: str):
    """The value a lesson assigns to `variable`, read from its source without running it
    (literals only, or a comprehension over range())."""
    for node in ast.walk(ast.parse((LESSONS / name).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == variable for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return eval(compile(ast.Expression(node.value), name, "eval"), {"range": range})  # noqa: S307
    raise AssertionError(f"{name} assigns no {variable}")


def test_lesson_15_narrows_from_about_410_reviews_to_one_or_two(restore_threads, tmp_path):
    match = quoted(r"the policy narrows from ~(\d+) reviews to (\w+) or (\w+)")
    defs = run_lesson("15_rlhf.py", tmp_path)
    assert round(defs["start"]["distinct"], -1) == number(match.group(1))  # e^H of π_ref: 409.7
    narrowest = min(defs["sweep"], key=lambda row: row["beta"])
    assert number(match.group(2)) <= round(narrowest["distinct"]) <= number(match.group(3)), narrowest["distinct"]


def test_lesson_16_sums_over_19_answers():
    match = quoted(r"Z\(x\) summed exactly over a tiny policy's (\d+) possible answers")
    answers = assigned_literal("16_dpo.py", "ANSWERS")
    assert len(answers) == len(set(answers)) == number(match.group(1))


def test_lesson_18a_reads_8_samples_of_1024_prompts():
    match = quoted(r"\((\d+) samples of ([\d,]+) arithmetic prompts each")
    pools = json.loads((LESSONS / "data" / "18a_pass_rates" / "pass_counts.json").read_text(encoding="utf-8"))
    assert len(pools) == 2  # "two real pass-rate measurements"
    for pool in pools.values():
        assert pool["tries"] == number(match.group(1))
        assert len(pool["passes"]) == number(match.group(2))


def test_lesson_22_counts_16_or_18_bytes_and_measures_16(restore_threads, tmp_path):
    counted = quoted(r"(\d+) or (\d+) bytes a parameter, bf16 or fp32 gradients")
    assert MIXED_ADAMW.bytes_per_parameter == number(counted.group(1))
    assert MIXED_ADAMW_FP32_GRADS.bytes_per_parameter == number(counted.group(2))
    measured = quoted(r"a real Trainer step measured at (\d+) bytes a parameter")
    defs = run_lesson("22_memory_and_throughput.py", tmp_path)
    held = defs["held"]
    assert round((held["weights"] + held["grads"] + held["optimizer"]) / defs["trained"]) == number(measured.group(1))


def test_lesson_23_hybrids_recipes_and_symptom_map(restore_threads, tmp_path):
    one = quoted(r"R1 with R1-Zero's data: (\w+) settings?, ((?:`[\w.]+`(?:, | and )?)+)")
    defs = run_lesson("23_recipes_and_failure_modes.py", tmp_path)
    assert (defs["recipe"], defs["donor"], defs["axis"]) == ("r1", "r1_zero", "data")
    named = re.findall(r"`([\w.]+)`", one.group(2))
    assert list(defs["changed"]) == named and len(defs["changed"]) == number(one.group(1))
    assert defs["refused"] is None
    assert len(defs["published"]) == number(quoted(r"sets (\w+) published recipes").group(1))
    assert len(defs["SYMPTOMS"]) == number(quoted(r"maps (\w+) symptoms").group(1))
    assert defs["STEPS"] == number(quoted(r"a synthetic (\d+)-step run").group(1))
    quoted(r"each symptom fires its own monitor and no other")
    assert all(row["step"] is not None and row["others"] == [] for row in defs["failure_map"].values())
    hides = quoted(r"a line loosened ×(\d+) hides (\w+) of the (\w+)")
    hidden = [row for row in defs["failure_map"].values()
              if row["hidden_from"] is not None and row["hidden_from"] <= number(hides.group(1))]
    assert (len(hidden), len(defs["failure_map"])) == (number(hides.group(2)), number(hides.group(3)))

    quoted(r"Tülu 3 with Kimi's data: refused")
    tulu = run_lesson("23_recipes_and_failure_modes.py", tmp_path,
                      {'value="r1", label="recipe"': 'value="tulu3_rlvr", label="recipe"',
                       'value="r1_zero", label="take one axis from"': 'value="kimi_k15", label="take one axis from"'})
    assert tulu["refused"] is not None and "curation" in tulu["refused"]


def test_lesson_26_eight_designs_and_a_075_verifier_that_ties_five():
    assert len(forces.DESIGNS) == number(quoted(r"scores (\w+) designs from two inputs").group(1))
    group = quoted(r"a leave-one-out group of (\d+)")
    source = (LESSONS / "26_three_forces.py").read_text(encoding="utf-8")
    call = re.search(r"noise = estimator_noise\(p=([\d.]+), k=(\d+), groups=([\d_]+), seed=(\d+)\)", source)
    assert call and int(call.group(2)) == number(group.group(1)), "lesson 26 no longer calls estimator_noise(k=16)"

    measures = quoted(r"`hackable/multi-final` measures ([\d.]+) and still gets a verifier recommended "
                      r"\((\w+) designs tie, ([\w-]+) first\)")
    fidelity = forces.verifier_fidelity("hackable/multi-final")
    assert f"{fidelity:.2f}" == measures.group(1)
    noise = forces.estimator_noise(p=float(call.group(1)), k=int(call.group(2)), groups=int(call.group(3)),
                                   seed=int(call.group(4)))
    # the lesson's defaults: all weight on signal, every prompt checkable
    tied = forces.tied_at_top(forces.rank((1.0, 0.0, 0.0), 1.0, fidelity, noise))
    assert len(tied) == number(measures.group(2)) and tied[0]["design"].recipe == measures.group(3)
    assert tied[0]["design"].checkable.reward == "verifier"  # "still gets a verifier recommended"


def test_lesson_27_concepts_and_those_in_posttrain():
    total = quoted(r"\*\*27 Missing concepts\*\*: ([\w-]+) ideas the course does not develop")
    implemented = quoted(r"(\w+) are in posttrain and linked to the file and name")
    concepts = assigned_literal("27_missing_concepts.py", "CONCEPTS")
    assert len(concepts) == number(total.group(1))
    assert sum(1 for concept in concepts if concept["code"]) == number(implemented.group(1))
