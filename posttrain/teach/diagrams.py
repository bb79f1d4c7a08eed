"""The two pictures the orientation and the index open with, as SVG a notebook shows with
`mo.Html`: the six roles around the loss, and the three forces. Hover a box (or a corner)
and the browser shows what it does, what it produces and where it lives (an SVG <title>:
no script, so it works in any viewer, the static HTML export too).

The words are ROLES and FORCES below (tests/test_diagrams.py checks that every file a
tooltip names exists).
"""

from __future__ import annotations

from html import escape

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

# (force, the question it asks of a design, where the course takes it up)
FORCES = [
    ("signal", "how much does the reward tell the policy, and can it be trusted? (verifiers, reward models)",
     "lessons 03, 15, 18, 18a"),
    ("estimator", "how noisy is the gradient estimate built from that reward? (baselines, groups, critics)",
     "lessons 09–14"),
    ("cost", "what does one update cost in samples, memory and wall time? (rollout, systems)",
     "lessons 19–25, 28"),
]


def _box(x: float, y: float, w: float, h: float, label: str, tooltip: str) -> str:
    return (f'<g><title>{escape(tooltip)}</title>'
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="#eef3fb" stroke="#3b6ea8"/>'
            f'<text x="{x + w / 2}" y="{y + h / 2 + 5}" text-anchor="middle" font-size="15" '
            f'font-family="sans-serif">{escape(label)}</text></g>')


def six_roles_svg() -> str:
    """The six roles on a ring, in the loop's order, around 'the loss'; hover for each one's
    job, output and file."""
    w, h, bw, bh = 640, 360, 130, 44
    cx, cy = w / 2, h / 2
    spots = [(cx - bw / 2, 20), (w - bw - 20, 95), (w - bw - 20, 225), (cx - bw / 2, h - bh - 20),
             (20, 225), (20, 95)]
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
             'role="img" aria-label="the six roles of RL post-training">',
             f'<circle cx="{cx}" cy="{cy}" r="118" fill="none" stroke="#b9c7da" stroke-dasharray="6 5"/>',
             f'<text x="{cx}" y="{cy + 5}" text-anchor="middle" font-size="16" font-family="sans-serif" '
             'font-weight="bold">the loss</text>']
    for (x, y), (role, job, produces, where) in zip(spots, ROLES):
        parts.append(_box(x, y, bw, bh, role, f"{role}: {job}. Produces: {produces}. Code: {where}"))
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
