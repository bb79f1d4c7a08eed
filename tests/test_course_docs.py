"""The measurement track (docs/course/): every milestone page is there and linked, every link
resolves, every command, demo, exercise, pack and spec it names exists, the taxonomy is the
kata's, the oral exam answers its six questions, the reading list gives each reading its arXiv
id, and the scorer-test template passes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.cli import COMMANDS
from posttrain.eval.packs import FAILURE_LABELS, PACKS
from posttrain.teach.exercises import EXERCISES
from posttrain.teach.demos import DEMOS
from posttrain.teach.lessons import lesson_files
from posttrain.verifiers import VERIFIERS

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "docs" / "course"
PAGES = sorted(COURSE.rglob("*.md"))
MILESTONES = ["M0_orientation.md", "M0.5_selection.md", "M1_update_step.md", "M2_credit_assignment.md",
              "M3_llm_as_policy.md", "M4_reward_as_spec.md", "M5_red_team.md", "M6_eval_to_optimization.md"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def text_of(name: str) -> str:
    return (COURSE / name).read_text(encoding="utf-8")


def test_the_measuring_guide_links_the_track():
    section = (ROOT / "docs" / "guides" / "measuring.md").read_text(encoding="utf-8")  # was the README's section
    assert section.startswith("# Measuring without fooling yourself")
    assert "](../course/README.md)" in section and "](../course/MEASUREMENT_RULES.md)" in section
    for rule in ("--allow-different", "--parent", "noise rule", "posttrain check pick_best"):
        assert rule in section, rule


def test_the_index_links_every_milestone_and_page():
    index = text_of("README.md")
    for name in MILESTONES + ["MEASUREMENT_RULES.md", "failure_taxonomy.md", "oral_exam.md", "reading.md"]:
        assert f"]({name})" in index, name
    for template in sorted((COURSE / "templates").iterdir()):
        assert f"](templates/{template.name})" in index, template.name


@pytest.mark.parametrize("name", MILESTONES)
def test_every_milestone_says_what_to_do_and_hand_in_and_what_serves_it(name):
    page = text_of(name)
    assert page.startswith(f"# {name.split('_')[0]} ")
    for heading in ("**Goal.**", "## What serves it", "## Do", "## Hand in"):
        assert heading in page, f"{name} has no {heading}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(COURSE)))
def test_every_relative_link_resolves(page):
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if "://" in target:
            continue
        assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def named(pattern: str) -> set[str]:
    found = set()
    for page in PAGES:
        found |= set(re.findall(pattern, page.read_text(encoding="utf-8")))
    return found


def test_every_command_demo_exercise_lesson_pack_and_spec_named_exists():
    assert named(r"`posttrain (\w+)") <= set(COMMANDS)
    assert named(r"posttrain demo (\w+)") <= set(DEMOS)
    assert named(r"posttrain check (\w+)") <= set(EXERCISES)
    assert named(r"posttrain lessons (\d\d)") <= set(lesson_files())
    assert named(r"--completions (\w+)") - {"FILE", "my_course"} <= set(PACKS)
    specs = named(r"--(?:select_)?spec_version ([\w/-]+)") | named(r"`((?:final_int|hackable)/[\w-]+)`")
    assert specs - {"hackable/"} <= set(VERIFIERS), specs - set(VERIFIERS)  # "hackable/..." stands for any
    # the course leans on these; a rename must update the pages
    assert {"eval", "bon", "diff", "check", "demo", "run", "rlhf"} <= named(r"`posttrain (\w+)")
    assert {"bandit", "two_step_mdp", "kl_tradeoff", "tokens"} <= named(r"posttrain demo (\w+)")


def test_the_taxonomy_page_names_every_kata_label_and_the_seeds_names():
    page = text_of("failure_taxonomy.md")
    for label in FAILURE_LABELS:
        assert f"`{label}`" in page
    for seed_name in ("model wrong", "verifier wrong", "data ambiguous", "spec unclear"):
        assert seed_name in page


def test_the_oral_exam_has_six_questions_each_with_an_answer():
    page = text_of("oral_exam.md")
    questions = re.findall(r"^\*\*(\d)\. (.+?)\*\*\n\n(.+?)(?=\n\*\*\d\.|\Z)", page, flags=re.M | re.S)
    assert [q[0] for q in questions] == ["1", "2", "3", "4", "5", "6"]
    assert all(len(answer.split()) >= 40 for _, _, answer in questions)  # a model answer, not a slogan
    assert "backprop" in questions[2][1] and "KL" in questions[4][1]


def test_the_scorer_test_template_passes_as_shipped(tmp_path):
    copy = tmp_path / "test_rubric.py"
    copy.write_text((COURSE / "templates" / "test_rubric.py").read_text(encoding="utf-8"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(copy)],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "12 passed" in run.stdout


READINGS = {"Schulman": "1707.06347", "Christiano": "1706.03741", "Stiennon": "2009.01325", "Ouyang": "2203.02155",
            "Gao": "2210.10760", "Rafailov": "2305.18290", "Ethayarajh": "2402.01306", "Yuan": "2401.10020",
            "Lightman": "2305.20050", "Zelikman": "2203.14465", "DeepSeekMath": "2402.03300"}


def test_the_reading_list_gives_each_of_the_seeds_readings_its_id_and_the_minimal_reading():
    page = text_of("reading.md")
    rows = [line for line in page.splitlines() if line.startswith("| ") and "arxiv.org/abs/" in line]
    assert len(rows) == len(READINGS)
    for author, arxiv_id in READINGS.items():
        [row] = [line for line in rows if author in line]
        assert f"[{arxiv_id}](https://arxiv.org/abs/{arxiv_id})" in row, author
    assert "<https://huggingface.co/docs/trl>" in page  # the one reading that is documentation, not a paper
    for minimal in ("](README.md)", "verifiers/contract.py)", "](MEASUREMENT_RULES.md)", "data/packs/README.md)"):
        assert minimal in page.split("## The papers")[0], minimal
