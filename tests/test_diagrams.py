"""The orientation's two pictures: well-formed SVG, one hoverable box per role and per force,
each tooltip naming a file that exists, and both pictures shown by lesson 00 and the index."""

import xml.etree.ElementTree as ET
from pathlib import Path

from posttrain.teach.diagrams import FORCES, ROLES, six_roles_svg, three_forces_svg

ROOT = Path(__file__).resolve().parents[1]
SVG = "{http://www.w3.org/2000/svg}"


def boxes(svg: str) -> dict[str, str]:
    """{label: tooltip} of every hoverable group."""
    tree = ET.fromstring(svg)
    return {g.find(f"{SVG}text").text: g.find(f"{SVG}title").text for g in tree.iter(f"{SVG}g")}


def test_six_roles_each_hoverable_with_its_job_output_and_an_existing_file():
    found = boxes(six_roles_svg())
    assert list(found) == ["rollout", "environment", "reference", "algorithm", "trainer", "controller"]
    for role, job, produces, where in ROLES:
        assert job in found[role] and produces in found[role] and (ROOT / where).is_file(), where


def test_three_forces_each_hoverable():
    found = boxes(three_forces_svg())
    assert list(found) == ["signal", "estimator", "cost"]
    assert all(question in found[force] for force, question, _ in FORCES)


def test_lesson_00_and_the_index_show_both():
    for lesson in ("00_orientation.py", "index.py"):
        text = (ROOT / "lessons" / lesson).read_text(encoding="utf-8")
        assert "six_roles_svg()" in text and "three_forces_svg()" in text, lesson
