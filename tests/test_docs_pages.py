"""The documentation pages (README.md the front page, docs/ the site's pages, BENCHMARKS.md and
ARCHITECTURE.md) stay true to each other and to the code:

- every heading of the old 3,500-line README has a home: a page and an anchor that exists
  (OLD_README, frozen below, is the map a reader of an old link or an old "README, 'X'" comment
  can follow);
- every `posttrain ...` command quoted in a fenced block of README.md, docs/index.md,
  docs/getting-started.md and docs/guides/*.md still parses: `--dry_run true` of it succeeds
  where the command takes it and its inputs are at hand, and otherwise `--help` succeeds and
  every flag it names is one the command lists (ALLOWED says, rule by rule, why a command
  cannot be dry-run offline);
- every relative link resolves, anchors included, and every heading has the same anchor on
  GitHub and on the MkDocs site;
- a number quoted as a link (`[93.0%](getting-started.md#...)`), on a page or in a lesson, is a
  number its target section states: the page that measured it is its one source, and a
  re-measurement that changes the source and not the quote fails here; and a number stated
  with its CI is written on one page only, the others quoting it (or listed as separate runs
  that agree).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

from posttrain.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GUIDES = sorted((DOCS / "guides").glob("*.md"))
# the pages whose fenced commands must parse (the brief: the front page and the guides)
COMMAND_PAGES = [ROOT / "README.md", DOCS / "index.md", DOCS / "getting-started.md", *GUIDES]
# the pages whose links, anchors and quoted numbers are checked
LINKED_PAGES = [*COMMAND_PAGES, ROOT / "BENCHMARKS.md", ROOT / "ARCHITECTURE.md",
                *sorted((DOCS / "algorithms").glob("*.md")), *sorted((DOCS / "course").glob("*.md"))]
# pages the site build makes (mkdocs.yml, the generated references, the renderings of
# BENCHMARKS.md, ARCHITECTURE.md and the lessons): linked to from here, written elsewhere
SITE_PAGES = {"docs/lessons/index.md", "docs/benchmarks.md", "docs/architecture.md", "docs/reference/cli.md",
              "docs/reference/api.md"}

# --- the old README's headings and where each went ------------------------------------------------------------
# Every line of README.md that started with '#' at f783a20 and at 7ef0e9a (the two lists are the
# same), the last README before it became a front page. "code" marks a line inside a fenced
# block (a comment, or a heading the `posttrain systems` printout prints): it moved with its
# block, and the test finds it inside a block of the page named.
OLD_README = [
    ("# posttrain", "README.md"),
    ("## What `make run` does, and what it shows", "docs/getting-started.md#what-make-run-does-and-what-it-shows"),
    ("## The six roles", "docs/getting-started.md#the-six-roles"),
    ("## Commands", "docs/guides/runs.md#commands"),
    ("## posttrain from Python", "docs/guides/your-task.md#posttrain-from-python"),
    ("## Run directories", "docs/guides/runs.md#run-directories"),
    ("## Experiment trackers", "docs/guides/runs.md#experiment-trackers"),
    ("## The task and its verifier", "docs/guides/your-task.md#the-task-and-its-verifier"),
    ("### Your own data: formats, columns and splits", "docs/guides/your-task.md#your-own-data-formats-columns-and-splits"),
    ("### External tasks: reasoning-gym and HumanEval", "docs/guides/your-task.md#external-tasks-reasoning-gym-and-humaneval"),
    ("# SFT (and 30 GRPO steps) in one run", "code docs/guides/your-task.md"),
    ("# 120 GRPO steps from its SFT checkpoint", "code docs/guides/your-task.md"),
    ("### Your own reward function", "docs/guides/your-task.md#your-own-reward-function"),
    ("# my_rewards.py", "code docs/guides/your-task.md"),
    ("### Rubric and joint rewards", "docs/guides/your-task.md#rubric-and-joint-rewards"),
    ("### Data curation", "docs/guides/your-task.md#data-curation"),
    ("# level 3, 100 steps", "code docs/guides/your-task.md"),
    ("# levels 2,3,5: 100 steps with pool 1024 (curriculum), or 20 steps with pool 256", "code docs/guides/your-task.md"),
    ("## Agents: tools and multi-turn episodes", "docs/guides/agents.md#agents-tools-and-multi-turn-episodes"),
    ("## Algorithms", "docs/guides/algorithms.md#algorithms-and-when-to-pick-each"),
    ("### Comparing them", "docs/guides/algorithms.md#comparing-them"),
    ("### The four pillars and length control", "docs/guides/algorithms.md#the-four-pillars-and-length-control"),
    ("### The progressive build: REINFORCE to PPO, one change at a time",
     "docs/guides/algorithms.md#the-progressive-build-reinforce-to-ppo-one-change-at-a-time"),
    ("### PRIME: implicit process rewards", "docs/guides/algorithms.md#prime-implicit-process-rewards"),
    ("## Preference optimisation", "docs/guides/preference.md#preference-optimisation"),
    ("### DPO's extras: gap weighting, a KL term, self-rewarding",
     "docs/guides/preference.md#dpos-extras-gap-weighting-a-kl-term-self-rewarding"),
    ("### RLHF end to end", "docs/guides/preference.md#rlhf-end-to-end"),
    ("### Stages: SFT → DPO → GRPO in one run", "docs/guides/recipes.md#stages-sft-dpo-and-grpo-in-one-run"),
    ("### The recipe catalogue", "docs/guides/recipes.md#the-recipe-catalogue"),
    ("### Capstone: the aligned assistant", "docs/guides/recipes.md#capstone-the-aligned-assistant"),
    ("# DPO seeds 1 and 2 from the same SFT checkpoint: the recipe's DPO stage alone", "code docs/guides/recipes.md"),
    ("### Capstone: the reasoning specialist", "docs/guides/recipes.md#capstone-the-reasoning-specialist"),
    ("## Process rewards, test-time search and self-improvement",
     "docs/guides/search.md#process-rewards-test-time-search-and-self-improvement"),
    ("### Process reward models", "docs/guides/search.md#process-reward-models"),
    ("### Test-time search at one token budget", "docs/guides/search.md#test-time-search-at-one-token-budget"),
    ("#### The same comparison on a task without a step checker: leg_counting",
     "docs/guides/search.md#the-same-comparison-on-a-task-without-a-step-checker-leg_counting"),
    ("### Self-verification, audited", "docs/guides/search.md#self-verification-audited"),
    ("### STaR, rejection sampling and RL at one sample budget",
     "docs/guides/search.md#star-rejection-sampling-and-rl-at-one-sample-budget"),
    ("### Thinking-mode fusion", "docs/guides/search.md#thinking-mode-fusion"),
    ("# the same, with 30% of the /think demonstrations cut where a budget would cut them:", "code docs/guides/search.md"),
    ("## Real models: SmolLM2-135M-Instruct and any local transformers model",
     "docs/guides/real-models.md#real-models-smollm2-135m-instruct-and-any-local-transformers-model"),
    ("# 1. SFT on the chain-of-thought format (40 steps)", "code docs/guides/real-models.md"),
    ("# 2. GRPO with LoRA from that checkpoint (40 steps of 8 prompts x 8 samples)", "code docs/guides/real-models.md"),
    ("# 3. both checkpoints on 1,000 held-out problems, and the paired difference", "code docs/guides/real-models.md"),
    ("### Export to plain transformers", "docs/guides/real-models.md#export-to-plain-transformers"),
    ("### GPUs and dtypes", "docs/guides/real-models.md#gpus-and-dtypes"),
    ("## Scaling out with Ray", "docs/guides/scaling-out.md#scaling-out-with-ray"),
    ("## Systems: memory, KV cache and where the time goes",
     "docs/guides/scaling-out.md#systems-memory-kv-cache-and-where-the-time-goes"),
    ("## Does it fit? (memory per GPU)", "code docs/guides/scaling-out.md"),
    ("## Where will the time go? (one step at 0.5 of peak FLOP/s and 0.7 of peak bandwidth)",
     "code docs/guides/scaling-out.md"),
    ("### The formulas against this machine", "docs/guides/scaling-out.md#the-formulas-against-this-machine"),
    ("## Measuring without fooling yourself", "docs/guides/measuring.md#measuring-without-fooling-yourself"),
    ("## Lessons", "docs/getting-started.md#lessons"),
    ("## Demos", "docs/getting-started.md#demos"),
    ("## Tests", "docs/getting-started.md#make-test"),
    ("## Layout", "ARCHITECTURE.md#what-is-in-each-folder"),
]


# --- reading markdown -----------------------------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)(```+)\s*([\w-]*)\s*$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(([^)\s]+)\)")  # link text may hold one level of [...]
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def rel(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


def lines_outside_fences(text: str):
    """(line number, line) of every line not inside a fenced code block."""
    fence = None
    for number, line in enumerate(text.split("\n")):
        match = FENCE.match(line)
        if match and (fence is None or match.group(2).startswith(fence)):
            fence = match.group(2) if fence is None else None
            continue
        if fence is None:
            yield number, line


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """(language, lines) of every fenced block, its lines de-indented by the fence's indent
    (a block inside a list item is indented with it)."""
    blocks, current, indent, fence = [], None, 0, None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if current is None and match:
            current, indent, fence = (match.group(3), []), len(match.group(1)), match.group(2)
        elif current is not None and match and match.group(2).startswith(fence) and not match.group(3):
            blocks.append(current)
            current = None
        elif current is not None:
            current[1].append(line[indent:] if line[:indent].strip() == "" else line)
    return blocks


def plain_heading(text: str) -> str:
    text = re.sub(r"`([^`]*)`", r"\1", text)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"(\*\*|__|\*|_)(\S(?:.*?\S)?)\1", r"\2", text).strip()


def site_anchor(heading: str) -> str:
    """The anchor MkDocs gives a heading: Python-Markdown's toc slugify (NFKD, ASCII only,
    drop what is not a word character, a space or a hyphen, lower case, runs of spaces and
    hyphens to one hyphen)."""
    value = unicodedata.normalize("NFKD", plain_heading(heading)).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, drop punctuation but hyphens, each space
    a hyphen."""
    return re.sub(r"[^\w\- ]", "", plain_heading(heading).lower()).replace(" ", "-")


@dataclass
class Heading:
    level: int
    text: str
    line: int

    @property
    def anchor(self) -> str:
        return site_anchor(self.text)


def headings(path: Path) -> list[Heading]:
    found = []
    for number, line in lines_outside_fences(read(path)):
        match = HEADING.match(line)
        if match:
            found.append(Heading(len(match.group(1)), match.group(2), number))
    return found


def section(path: Path, anchor: str) -> str:
    """The text under the heading with `anchor`, up to the next heading of its level or higher
    (the whole page for no anchor)."""
    lines = read(path).split("\n")
    if not anchor:
        return "\n".join(lines)
    found = headings(path)
    for index, heading in enumerate(found):
        if heading.anchor == anchor:
            end = next((later.line for later in found[index + 1:] if later.level <= heading.level), len(lines))
            return "\n".join(lines[heading.line:end])
    raise AssertionError(f"{rel(path)} has no heading whose anchor is #{anchor}")


def links(path: Path):
    """(text, target, is_image) of every link outside fenced blocks and inline code."""
    for _, line in lines_outside_fences(read(path)):
        for match in LINK.finditer(re.sub(r"`[^`]*`", "``", line)):
            yield match.group(2), match.group(3), bool(match.group(1))


def resolve(page: Path, target: str) -> tuple[Path, str] | None:
    """The file and anchor a relative link points at; None for an absolute URL."""
    if re.match(r"[a-z]+:", target):
        return None
    path, _, anchor = target.partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


# --- 1. every old heading has a home --------------------------------------------------------------------------

@pytest.mark.parametrize("heading,home", OLD_README, ids=[heading for heading, _ in OLD_README])
def test_every_heading_of_the_old_readme_has_a_home(heading, home):
    if home.startswith("code "):
        page = ROOT / home.split(" ", 1)[1]
        in_blocks = [line.strip() for _, block in fenced_blocks(read(page)) for line in block]
        assert heading in in_blocks, f"{heading!r} is in no fenced block of {rel(page)}"
        return
    path, _, anchor = home.partition("#")
    section(ROOT / path, anchor)  # raises when the page has no such anchor


def test_the_front_page_is_a_front_page():
    readme = read(ROOT / "README.md")
    assert len(readme.split("\n")) <= 300
    # tests and CI read the two commands first
    assert readme.split("```bash\n", 1)[1].startswith("make run    #")
    assert readme.split("```bash\n", 1)[1].split("\n")[1].startswith("make test   #")
    for page in ("getting-started.md", "guides/algorithms.md", "guides/your-task.md", "guides/real-models.md"):
        assert f"](docs/{page}" in readme, page
    assert "](BENCHMARKS.md" in readme and "](ARCHITECTURE.md" in readme


def test_the_readme_test_count_is_the_one_getting_started_states():
    """The `make test` line at the top of the README (which CI and people read first) quotes
    the count the tests section states; a re-count that changes one and not the other fails."""
    [count] = re.findall(r"\(([\d,]+) tests", read(ROOT / "README.md").split("\n## ", 1)[0])
    assert f"{count} tests" in section(DOCS / "getting-started.md", "make-test")


# --- 2. links, anchors and quoted numbers ---------------------------------------------------------------------

@pytest.mark.parametrize("page", LINKED_PAGES, ids=rel)
def test_every_relative_link_resolves_anchor_included(page):
    for text, target, _ in links(page):
        resolved = resolve(page, target)
        if resolved is None:
            continue
        path, anchor = resolved
        if rel(path) in SITE_PAGES and not path.exists():
            continue  # written by the site build
        assert path.exists(), f"{rel(page)}: [{text}]({target}): no {rel(path)}"
        if anchor and path.suffix == ".md":
            anchors = {heading.anchor for heading in headings(path)}
            assert anchor in anchors, f"{rel(page)}: [{text}]({target}): {rel(path)} has no #{anchor}"


@pytest.mark.parametrize("page", [*COMMAND_PAGES, ROOT / "BENCHMARKS.md", ROOT / "ARCHITECTURE.md"], ids=rel)
def test_every_heading_has_the_same_anchor_on_github_and_on_the_site(page):
    seen = set()
    for heading in headings(page):
        assert heading.anchor == github_anchor(heading.text), (
            f"{rel(page)}: {heading.text!r} is #{heading.anchor} on the site but #{github_anchor(heading.text)} on "
            "GitHub; reword it (an arrow, a dash between spaces and non-ASCII letters are what differ)")
        assert heading.anchor not in seen, f"{rel(page)}: two headings are #{heading.anchor}"
        seen.add(heading.anchor)


@pytest.mark.parametrize("page", LINKED_PAGES, ids=rel)
def test_a_number_quoted_as_a_link_is_one_its_source_states(page):
    """`[2.66×](../../BENCHMARKS.md#a-grpo-step-...)` quotes the benchmark: every number in the
    link's text must be a number of the section it points at."""
    for text, target, is_image in links(page):
        resolved = resolve(page, target)
        if is_image or resolved is None or not NUMBER.search(text):
            continue
        path, anchor = resolved
        if path.suffix != ".md" or not anchor or not path.exists():
            continue
        stated = set(NUMBER.findall(section(path, anchor)))
        missing = [number for number in NUMBER.findall(text) if number not in stated]
        assert not missing, (f"{rel(page)} quotes [{text}] from {rel(path)}#{anchor}, which does not state "
                             f"{missing}: quote the source's number, or re-measure both")


LESSON_NOTEBOOKS = sorted((ROOT / "lessons").glob("*.py"))


@pytest.mark.parametrize("lesson", LESSON_NOTEBOOKS, ids=rel)
def test_a_lesson_quotes_the_docs_by_links_that_hold(lesson):
    """A lesson's markdown link to a page (`[0.81](../docs/guides/preference.md#rlhf-end-to-end)`)
    resolves, anchor included, and every number in its text is one the section states: a
    number measured elsewhere is quoted, not retyped. (What a lesson computes in its own cells
    is its own and needs no link.)"""
    for text, target, _ in links(lesson):
        resolved = resolve(lesson, target)
        if resolved is None or not re.search(r"\.md(#|$)", target):
            continue  # a URL, or Python that reads like a link
        path, anchor = resolved
        if rel(path) in SITE_PAGES and not path.exists():
            continue
        assert path.exists(), f"{rel(lesson)}: [{text}]({target}): no {rel(path)}"
        stated = set(NUMBER.findall(section(path, anchor)))  # raises when the anchor is missing
        missing = [number for number in NUMBER.findall(text) if number not in stated]
        assert not missing, (f"{rel(lesson)} quotes [{text}] from {rel(path)}#{anchor}, which does not state "
                             f"{missing}: quote the source's number, or re-measure both")


# A number stated with its 95% CI ("32.6% [28.6, 36.6]", "+3.6 [+1.0, +6.4]") is a measurement. Written
# outside a link on two pages it is a twin, which a re-measurement of one leaves stale: quote one page
# from the other by a link. Held-out pass@1 on 500 problems moves in steps of 0.2 points, so separate
# runs often land on the same value and CI; those are listed here, each with the runs that agree.
WITH_CI = re.compile(r"[−+-]?\d+\.\d%? \[[−+-]?\d+\.\d, [−+-]?\d+\.\d\]")
SEPARATE_RUNS = {
    "−1.2 [−2.4, +0.0]": "entropy_control.md: Clip-Cov against none, seed 1; algorithms.md: PRIME without its process term, seed 1",
    "+1.2 [−1.2, +3.6]": "dpo.md: refreshing π_ref online; algorithms.md: the progressive build's group std",
    "+11.0 [+7.6, +14.4]": "recipes.md: Tülu 3's DPO stage; search.md: STaR (restart) against its start",
    "+9.6 [+6.2, +13.0]": "first-task.md: the products recipe's seed 2; search.md: /no_think's accuracy change",
    "5.0% [3.2, 7.0]": "first-task.md: chain_sum after 250 SFT steps; search.md: /think at budget 0",
    "11.8% [9.0, 14.6]": "recipes.md: four-stage R1 after its first GRPO stage; your-task.md: a curation row (20, 256)",
    "+3.6 [−0.2, +7.4]": "first-task.md: chain_sum seed 1's gain; your-task.md: the accuracy row of its table",
    "68.8% [64.6, 72.8]": "first-task.md: spell_backward seed 2 after its SFT; algorithms.md: the on_from_25 row",
    "26.2% [22.4, 30.0]": "first-task.md: spell_backward seed 1 after its SFT; preference.md: PPO without the KL term",
    "43.8% [39.4, 48.2]": "first-task.md: chain_sum after 600 SFT steps; recipes.md: the old 80-step GRPO setting",
    "100.0% [100.0, 100.0]": "agents.md: the tool runs; recipes.md: the reasoning specialist",
    "69.0% [65.0, 73.0]": "the seed-0 SFT stage each compare trained for itself: dpo.md's earlier five losses, "
                          "algorithms.md's six algorithms",
    "69.4% [65.4, 73.4]": "algorithms.md: aligned_grpo; search.md: /think at budget 0",
    "69.0% [60.0, 78.0]": "BENCHMARKS.md: SmolLM2 GRPO through vLLM; search.md: a thinking-budget row",
    "69.8% [65.6, 73.8]": "BENCHMARKS.md: the float32 run of bf16 on this CPU, its SFT; preference.md: the SFT "
                          "start of its pairs; recipes.md: Qwen-2.5's SFT stage",
    "93.0% [90.8, 95.2]": "BENCHMARKS.md: the float32 run of bf16 on this CPU; recipes.md: the R1 recipe's GRPO",
    "69.8% [65.8, 73.8]": "the seed-0 chain-of-thought SFT stage each run trained for itself: the progressive "
                          "build (algorithms.md), the R1, Tülu 3 and aligned-assistant recipes (recipes.md)",
    "73.0% [69.2, 76.8]": "dpo.md: ORPO at λ 0.1; your-task.md: ten GRPO steps on accuracy alone, beside self_critique",
    "74.0% [70.2, 77.8]": "BENCHMARKS.md: the int8 run's SFT; dpo.md: offline plain DPO",
    "77.0% [73.2, 80.6]": "make run's SFT, scored by each run that trained or loaded it: make run "
                          "(getting-started.md), selection vs RL (search.md), your own reward (your-task.md)",
    "80.8% [77.2, 84.2]": "dpo.md: offline DPO + NLL from the 69.0% start; recipes.md: Tülu 3's DPO stage from 69.8%",
    "86.8% [83.8, 89.6]": "dpo.md: online DPO, seed 1; search.md: best-of-51 with the verifier",
    "87.2% [84.2, 90.0]": "dpo.md: online plain DPO; algorithms.md: vanilla REINFORCE; recipes.md: Qwen-2.5's GRPO",
    "89.2% [86.4, 91.8]": "BENCHMARKS.md: GRPO with float32 sampling; algorithms.md: the batch-std row",
    "89.4% [86.6, 92.0]": "algorithms.md: RLOO, PRIME at seed 1; recipes.md: the earlier two-stage Qwen3's SFT",
    "90.8% [88.2, 93.2]": "100 GRPO steps from make run's SFT at seed 0, run by three experiments: "
                          "int8 sampling (BENCHMARKS.md), PRIME (algorithms.md), selection vs RL (search.md)",
    "91.2% [88.6, 93.6]": "BENCHMARKS.md: GRPO with int8 sampling; algorithms.md: PRIME without its process term",
    "92.6% [90.2, 94.8]": "the seed-1 SFT stage of two runs: the progressive build (algorithms.md), the aligned "
                          "assistant (recipes.md)",
    "93.0% [90.6, 95.2]": "getting-started.md: make run's GRPO; recipes.md: the earlier two-stage Qwen3's RL stage",
    "51.2% [46.8, 55.6]": "agents.md: seed 1's episodes calling the calculator after SFT; recipes.md: Qwen3's "
                          "reasoning-RL stage",
    "93.6% [91.4, 95.6]": "algorithms.md: DAPO; search.md: RFT and /think",
    "−0.8 [−2.0, +0.2]": "algorithms.md: PPO's row at seed 1; search.md: STaR after iteration 3",
}


def stated_with_ci() -> dict[str, set[str]]:
    """Each number-with-CI written outside a link, and the pages that write it."""
    pages: dict[str, set[str]] = {}
    for page in [*LINKED_PAGES, *LESSON_NOTEBOOKS]:
        for line in read(page).split("\n"):
            line = LINK.sub(lambda m: " " if "#" in m.group(3) else m.group(2), line)  # a quote is not a twin
            for value in WITH_CI.findall(line):
                pages.setdefault(value, set()).add(rel(page))
    return pages


def test_a_number_with_its_ci_is_stated_on_one_page():
    twins = {value: sorted(where) for value, where in stated_with_ci().items()
             if len(where) > 1 and value not in SEPARATE_RUNS}
    assert not twins, ("the same measurement stated on two pages; keep it on the page that measured it and "
                       f"quote it from the others by a link (or, if they are separate runs, say so in "
                       f"SEPARATE_RUNS): {twins}")


def test_every_listed_pair_of_separate_runs_is_still_on_two_pages():
    pages = stated_with_ci()
    stale = [value for value in SEPARATE_RUNS if len(pages.get(value, ())) < 2]
    assert not stale, f"SEPARATE_RUNS lists values no longer stated on two pages; drop them: {stale}"


# --- 3. every quoted command parses ---------------------------------------------------------------------------

# The commands that cannot be dry-run offline, rule by rule; each is still run with --help and
# every flag it names must be one the command lists. A rule is a regex on the command as the
# test runs it (variables expanded, optional [--flags] taken, comments dropped), each value
# that holds spaces (a quoted system prompt, a reward formula) shown as "...".
ALLOWED = {
    # a run directory or checkpoint an earlier command makes (`runs/<id>/checkpoints/...`)
    r"<[^>]*>": "names the output of an earlier command",
    # a glob over run directories an earlier command made (`runs/sft/*-sft-l3/...`)
    r"/\*": "names the output of an earlier command",
    # a value in capitals the reader fills in (HEAD_IP, DIR)
    r"(^| |=)[A-Z][A-Z0-9_]*[A-Z](:\d+)?( |$)": "holds a value the reader fills in",
    # a file of yours, or one the page writes with a command before it
    r"--(env\.path|env\.heldout_path|rl\.preference\.pairs|data|heldout_data|completions) (?!frozen|exploits|bon)\S+":
        "reads a file the reader brings or the page writes first",
    # an answer the page shows failing on purpose (the error printed under it)
    r"^EXPECTED-ERROR ": "is shown failing, with its error",
}
DRY_RUN = {"run", "train", "rlhf"}  # the commands that take --dry_run
# `--init runs/<sft run>/checkpoints/sft/step_000599` starts from a checkpoint an earlier command
# made; the test stands an untrained gpt_mini checkpoint in for it (the `checkpoint` fixture),
# so that the rest of the command is dry-run
STAND_IN = "stand-in-checkpoint"
HELP_ALL = {"run", "train", "rlhf", "compare", "star"}  # --help shows the chosen algorithm's settings; --help-all all


@dataclass
class Command:
    page: str
    quoted: str  # as the page prints it, continuation lines joined
    argv: list[str]  # after `posttrain`, as the test runs it

    @property
    def id(self) -> str:
        return f"{self.page}: {self.quoted[:90]}"


def optional_groups(text: str) -> str:
    """`[--seed 1]` -> `--seed 1`, `[--a 1 | --b 2]` -> `--a 1` (the first alternative), and
    `[prose]` -> nothing; brackets inside quotes (`--stages "dpo[rl.steps=100]"`) stay."""
    out, index, quote = [], 0, None
    while index < len(text):
        char = text[index]
        if quote or char in "'\"":
            quote = None if char == quote else (quote or char)
            out.append(char)
        elif char == "[" and (index == 0 or text[index - 1] == " "):
            depth, end = 0, index
            for end in range(index, len(text)):
                depth += {"[": 1, "]": -1}.get(text[end], 0)
                if depth == 0:
                    break
            inner = text[index + 1:end]
            if inner.lstrip().startswith("-"):
                out.append(optional_groups(re.split(r"\s\|\s", inner)[0]))
            index = end
        else:
            out.append(char)
        index += 1
    return "".join(out)


def quoted_commands() -> list[Command]:
    import shlex

    found = []
    for page in COMMAND_PAGES:
        variables: dict[str, str] = {}
        for language, block in fenced_blocks(read(page)):
            if language not in ("", "bash", "sh", "shell", "console"):
                continue
            joined: list[str] = []
            for line in block:  # join `\` continuations
                if joined and joined[-1].endswith("\\"):
                    joined[-1] = joined[-1][:-1] + line.lstrip()
                else:
                    joined.append(line)
            for index, line in enumerate(joined):
                text = line.strip().removeprefix("$ ")
                # a placeholder is one word, whatever it says (`runs/<seed 1's run>`)
                text = re.sub(r"<([^<>]*)>", lambda m: "<" + re.sub(r"[^\w.-]", "_", m.group(1)) + ">", text)
                text = re.sub(r"\$\{?([A-Z][A-Z0-9_]*)\}?", lambda m: variables.get(m.group(1), m.group(0)), text)
                assignment = re.match(r"([A-Z][A-Z0-9_]*)=(.*)$", text)
                if assignment:
                    variables[assignment.group(1)] = " ".join(shlex.split(assignment.group(2), comments=True))
                    continue
                text = re.sub(r"^nice -n \d+ ", "", text)
                if not text.startswith("posttrain ") or re.match(r"posttrain \w+: error:", text):
                    continue  # not a command, or a command's error message
                following = joined[index + 1].strip() if index + 1 < len(joined) else ""
                argv = [token for token in shlex.split(optional_groups(text), comments=True) if token != "..."]
                if not any("smollm2" in token or token.startswith("--model.lora_r") for token in argv):
                    argv = [STAND_IN if index and argv[index - 1] == "--init" and re.search(r"<|/\*", token) else token
                            for index, token in enumerate(argv)]  # the stand-in is a gpt_mini
                command = Command(rel(page), line.strip(), argv[1:])
                if re.match(r"posttrain \w+: error:", following):
                    command.argv = ["EXPECTED-ERROR", *command.argv]
                found.append(command)
    return found


COMMANDS = quoted_commands()


def run_quietly(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(argv)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory):
    """Where the commands run, as from the repository root: its recipes and bundled packs at
    hand (`--config recipes/r1.toml`), and `my_rewards.py` written from the page that prints
    it, as the reader would."""
    here = tmp_path_factory.mktemp("reader")
    (here / "recipes").symlink_to(ROOT / "recipes")
    (here / "posttrain").mkdir()  # the bundled packs, by the path a recipe names them with (not a package here)
    (here / "posttrain" / "data").symlink_to(ROOT / "posttrain" / "data")
    guide = read(DOCS / "guides" / "your-task.md")
    code = guide[guide.index("# my_rewards.py\n"):]
    (here / "my_rewards.py").write_text(code[:code.index("```")])
    return here


@pytest.fixture(scope="module")
def help_flags():
    """Every flag each command's help lists, read once per command."""
    seen: dict[tuple[str, ...], set[str]] = {}

    def flags(argv: list[str]) -> set[str]:
        key = tuple(argv[:2]) if argv[0] == "demo" else (argv[0],)
        if key not in seen:
            code, text = run_quietly([*key, "--help-all" if key[0] in HELP_ALL else "--help"])
            assert code == 0, text
            seen[key] = set(re.findall(r"--[\w.\-]+", text))
        return seen[key]

    return flags


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An untrained gpt_mini saved as a run saves its checkpoints: what `--init` names."""
    import torch

    from posttrain.config import ModelConfig
    from posttrain.models import make_policy, save_checkpoint_model

    torch.manual_seed(0)
    model, tokenizer = make_policy(ModelConfig())
    directory = tmp_path_factory.mktemp("runs") / "checkpoints" / "sft" / "step_000599"
    save_checkpoint_model(model, tokenizer, directory)
    return str(directory)


def smollm2_converted() -> bool:
    from posttrain.models import smollm2

    return (smollm2.default_cache_dir() / smollm2.SOURCE_FILE).is_file()


def why_not_dry_run(command: Command) -> str | None:
    """None when the command is dry-run; else why it is only --help'd and flag-checked."""
    line = " ".join('"..."' if " " in token else token for token in command.argv)
    for rule, reason in ALLOWED.items():
        if re.search(rule, line):
            return reason
    if command.argv[0] not in DRY_RUN:
        return "takes no --dry_run"
    if "smollm2-135m" in command.argv and not smollm2_converted():
        # the first use converts SmolLM2 from its GGUF (~35 s, 517 MB): more than a parse should cost
        return "SmolLM2 is not converted yet"
    return None


def test_the_pages_quote_commands_of_every_kind():
    kinds = {command.argv[0] for command in COMMANDS}
    assert {"run", "train", "compare", "eval", "search", "export"} <= kinds, kinds
    assert sum(why_not_dry_run(command) is None for command in COMMANDS) >= 20


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: command.id)
def test_every_quoted_command_parses(command, reader_dir, help_flags, checkpoint, monkeypatch):
    monkeypatch.chdir(reader_dir)
    monkeypatch.setenv("COLUMNS", "250")  # the help's flags on one line each
    argv = command.argv[1:] if command.argv[0] == "EXPECTED-ERROR" else command.argv
    argv = [checkpoint if token == STAND_IN else token for token in argv]
    listed = help_flags(argv)
    named = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    unknown = sorted(named - listed)
    assert not unknown, f"{command.id}: {unknown} are not flags of `posttrain {argv[0]}`"
    if why_not_dry_run(command) is None:
        dry = argv if "--dry_run" in argv else [*argv, "--dry_run", "true"]
        code, text = run_quietly(dry)
        assert code == 0, f"{command.id}\n--dry_run failed:\n{text[-2000:]}"
    else:
        positional = argv[:2] if argv[0] == "demo" else argv[:1]
        code, text = run_quietly([*positional, "--help"])
        assert code == 0, f"{command.id}\n--help failed:\n{text[-2000:]}"
