"""The course's pictures, as SVG a notebook shows with `mo.Html`: the six roles around the
loss (lesson 07 lights up the role that runs at each step of the loop), the three forces, and
the map of the course's five parts. Hover a box (or a corner) and the browser shows what it
does, what it produces and where it lives (an SVG <title>: no script, so it works in any
viewer, the static HTML export too).

The words are ROLES, LOOP_STEPS, FORCES and PARTS below (tests/test_diagrams.py checks that
every file a tooltip names exists).
"""

from __future__ import annotations

from html import escape
from typing import Iterable, Mapping

# (role, what it does, what it produces, the file it lives in), in the loop's order
ROLES = [
    ("rollout", "samples K completions per prompt from the current policy", "tokens, old_logp",
     "posttrain/roles/rollout.py"),
    ("environment", "grades each completion: text in, a number and a reason out", "reward, reason",
     "posttrain/roles/environment.py"),
    ("reference", "a frozen copy of the starting model", "ref_logp", "posttrain/roles/reference.py"),
    ("algorithm", "turns rewards into per-token advantages and a loss", "advantages, loss",
     "posttrain/algorithms/core.py"),
    ("trainer", "forward, backward, optimizer step", "new weights", "posttrain/roles/trainer.py"),
    ("controller", "runs the loop: sample → score → reference → advantage → update → sync → log",
     "a run directory", "posttrain/roles/controller.py"),
]

# The seven steps of Controller.step (posttrain/roles/controller.py), in order, and the roles
# whose code runs in each: sync is the trainer's weights reaching the rollout's engine.
LOOP_STEPS = [
    ("sample", ("rollout",)),
    ("score", ("environment",)),
    ("reference", ("reference",)),
    ("advantage", ("algorithm",)),
    ("update", ("trainer",)),
    ("sync", ("trainer", "rollout")),
    ("log", ("controller",)),
]

# (part, its name, the first lesson number in it, what it covers): a lesson belongs to the last
# part whose first number is not above its own (18a and 22c sit in Part III). Lesson 00, the
# orientation, comes before them all.
PARTS = [
    ("I", "the framework", 1, "the six roles around the loss"),
    ("II", "the algorithms", 9, "REINFORCE to Dr. GRPO, each a patch on the last"),
    ("III", "production", 15, "rewards without a rule, verifiers, data, and the systems underneath"),
    ("IV", "the engineer", 24, "what an RL infra engineer owns, and the kernels"),
    ("V", "synthesis", 26, "the three forces, what the course leaves out, the playbook"),
]

# (force, the question it asks of a design, where the course takes it up)
FORCES = [
    ("signal", "how much does the reward tell the policy, and can it be trusted? (verifiers, reward models)",
     "lessons 03, 15, 18, 18a"),
    ("estimator", "how noisy is the gradient estimate built from that reward? (baselines, groups, critics)",
     "lessons 09–14"),
    ("cost", "what does one update cost in samples, memory and wall time? (rollout, systems)",
     "lessons 19–25, 28"),
]


LIT = "#C0392B"  # the role running now: charts.SETTING's colour, the course's "your current setting"


def _box(x: float, y: float, w: float, h: float, label: str, tooltip: str, state: str = "plain") -> str:
    """A hoverable box. state: "plain", "lit" (the one running now: red, bold) or "dim" (the
    others while one is lit)."""
    fill, stroke, width, weight = {"plain": ("#eef3fb", "#3b6ea8", 1, "normal"),
                                   "lit": ("#fbe3df", LIT, 3, "bold"),
                                   "dim": ("#f4f4f4", "#b0b0b0", 1, "normal")}[state]
    opacity = ' opacity="0.55"' if state == "dim" else ""
    return (f'<g class="{state}"{opacity}><title>{escape(tooltip)}</title>'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="{width}"/>'
            f'<text x="{x + w / 2}" y="{y + h / 2 + 5}" text-anchor="middle" font-size="15" '
            f'font-family="sans-serif" font-weight="{weight}">{escape(label)}</text></g>')


def six_roles_svg(highlight: Iterable[str] = (), caption: str = "the loss") -> str:
    """The six roles on a ring, in the loop's order, around `caption`; hover for each one's
    job, output and file. The roles named in `highlight` light up and the others dim (lesson
    07: the role whose code runs at the step shown); with none named, all look alike."""
    lit = set(highlight)
    unknown = lit - {role for role, *_ in ROLES}
    if unknown:
        raise ValueError(f"highlight={sorted(unknown)}: not a role; the six are {[role for role, *_ in ROLES]}")
    w, h, bw, bh = 640, 360, 130, 44
    cx, cy = w / 2, h / 2
    spots = [(cx - bw / 2, 20), (w - bw - 20, 95), (w - bw - 20, 225), (cx - bw / 2, h - bh - 20),
             (20, 225), (20, 95)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
             'role="img" aria-label="the six roles of RL post-training">',
             f'<circle cx="{cx}" cy="{cy}" r="118" fill="none" stroke="#b9c7da" stroke-dasharray="6 5"/>',
             f'<text x="{cx}" y="{cy + 5}" text-anchor="middle" font-size="16" font-family="sans-serif" '
             f'font-weight="bold">{escape(caption)}</text>']
    for (x, y), (role, job, produces, where) in zip(spots, ROLES):
        state = "plain" if not lit else "lit" if role in lit else "dim"
        parts.append(_box(x, y, bw, bh, role, f"{role}: {job}. Produces: {produces}. Code: {where}", state))
    parts.append("</svg>")
    return "".join(parts)


def three_forces_svg() -> str:
    """The three forces at the corners of a triangle; every design is a point inside it.
    Hover a corner for its question and where the course takes it up."""
    w, h = 520, 330
    corners = [(w / 2, 40), (70, h - 45), (w - 70, h - 45)]
    points = " ".join(f"{x},{y}" for x, y in corners)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
             'role="img" aria-label="the three forces: signal, estimator, cost">',
             f'<polygon points="{points}" fill="#f7f2e8" stroke="#a8783b"/>',
             f'<text x="{w / 2}" y="{h / 2 + 40}" text-anchor="middle" font-size="13" font-family="sans-serif">'
             'every recipe is a point in here (lesson 26)</text>']
    for (x, y), (force, question, lessons) in zip(corners, FORCES):
        parts.append(_box(x - 55, y - 20, 110, 40, force, f"{force}: {question}. See {lessons}."))
    parts.append("</svg>")
    return "".join(parts)


def part_of(number: str) -> str:
    """The part a lesson number ("09", "18a") belongs to: "I" … "V", or "" for 00, the orientation."""
    value = int(number[:2])
    if value < PARTS[0][2]:
        return ""
    return [part for part, _, first, _ in PARTS if first <= value][-1]


def short_title(title: str) -> str:
    """"Lesson 22b · Long-tail rollouts: a batch waits…" -> "Long-tail rollouts"."""
    return title.split("·", 1)[-1].split(":", 1)[0].strip()


def course_map_svg(lessons: Mapping[str, tuple[str, str]]) -> str:
    """The five parts side by side, each listing its lessons in order. `lessons` is {lesson
    number: (its file name, its title)}, as teach/lessons.py reads them from lessons/, so a
    new lesson file appears here by itself. Each lesson links to its notebook (?file=, as the
    index does) and shows its full title on hover."""
    grouped: dict[str, list[tuple[str, str, str]]] = {part: [] for part, *_ in PARTS}
    for number in sorted(lessons, key=lambda n: (int(n[:2]), n[2:])):
        part = part_of(number)
        if part:
            grouped[part].append((number, *lessons[number]))
    col, gap, top, row = 176, 8, 58, 19
    w = len(PARTS) * (col + gap) - gap
    h = top + row * max(len(members) for members in grouped.values())
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="100%" viewBox="-1 -1 {w + 2} {h + 2}" role="img" '
             'aria-label="the five parts of the course and their lessons" font-family="sans-serif">']
    for index, (part, name, _, covers) in enumerate(PARTS):
        x = index * (col + gap)
        members = grouped[part]
        span = f"lessons {members[0][0]}–{members[-1][0]}" if members else "no lessons yet"
        parts.append(f'<g class="part"><title>Part {part}: {escape(covers)}</title>'
                     f'<rect x="{x}" y="0" width="{col}" height="{h}" rx="8" fill="#f5f8fc" stroke="#3b6ea8"/>'
                     f'<text x="{x + 8}" y="20" font-size="13" font-weight="bold">Part {part} · {escape(name)}</text>'
                     f'<text x="{x + 8}" y="38" font-size="11" fill="#555">{span}</text></g>')
        for line, (number, file, title) in enumerate(members):
            label = short_title(title)
            label = label if len(label) <= 22 else label[:21] + "…"
            parts.append(f'<a href="?file={escape(file)}"><g class="lesson" data-lesson="{escape(number)}">'
                         f'<title>{escape(title)}</title>'
                         f'<text x="{x + 8}" y="{top + line * row}" font-size="12" fill="#1f4e85">'
                         f'<tspan font-weight="bold">{escape(number)}</tspan> {escape(label)}</text></g></a>')
    parts.append("</svg>")
    return "".join(parts)
