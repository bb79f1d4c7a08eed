"""The cases behind `posttrain check pick_best`: best-of-N's decision rule, the exercise of
the measurement course's milestone M0.5 (docs/course/M0.5_selection.md).

A sample is {"id", "completion", "reward"}; the rule is "highest reward, and among equal
rewards the smallest id (string order)", the one `posttrain bon` uses and logs
(search/best_of_n.py::pick_best). The cases are built so that the two classic wrong
tie-breaks fail on a named case:

  - one that depends on the list's order (`max(samples, key=reward)` keeps the first maximum
    it meets): the same tie arrives in two orders, and only one order agrees with the ids;
  - one that is deterministic but is not the documented rule (the lexicographically
    smallest completion): a tie whose smallest id has the larger completion.
"""

from __future__ import annotations

from typing import Any

from posttrain.search.best_of_n import Candidate, pick_best


def sample(id_: str, completion: str, reward: float) -> dict[str, Any]:
    return {"id": id_, "completion": completion, "reward": reward}


# completions of the problem "Q: 3+4+2"; in string order RIGHT < RIGHT_SHORT, as "3" < "F"
RIGHT = "3+4=7,7+2=9\nFinal: 9"
RIGHT_SHORT = "Final: 9"
WRONG = "3+4=7,7+2=8\nFinal: 8"


def pick_best_cases() -> list[tuple[str, tuple]]:
    """(case name, (samples,)): every case runs in microseconds."""
    tie = [sample("c00", RIGHT, 1.0), sample("c03", RIGHT_SHORT, 1.0), sample("c05", WRONG, 0.0)]
    return [
        ("one sample scores higher than the rest",
         ([sample("c00", WRONG, 0.0), sample("c01", RIGHT, 1.0), sample("c02", WRONG, 0.0)],)),
        ("a single sample", ([sample("c00", WRONG, 0.0)],)),
        ("a tie at the top, the smallest id listed first", (tie,)),
        ("the same tie listed in reverse order (a rule that depends on order picks c03 here)", (tie[::-1],)),
        ("a tie whose smallest id has the larger completion (the rule is the id, not the text)",
         ([sample("c06", RIGHT, 1.0), sample("c01", RIGHT_SHORT, 1.0), sample("c02", WRONG, 0.0)],)),
        ("every sample scored 0, listed out of order",
         ([sample("c02", WRONG, 0.0), sample("c07", "", 0.0), sample("c01", "Final:9", 0.0)],)),
        ("partial credit: two samples share the top reward 0.5",
         ([sample("c04", "Final: 9 maybe", 0.25), sample("c05", RIGHT, 0.5), sample("c02", RIGHT_SHORT, 0.5)],)),
        ("negative rewards (a length charge): the least negative wins",
         ([sample("c00", RIGHT + " " * 40, -0.3), sample("c01", RIGHT, -0.1), sample("c02", WRONG, -0.2)],)),
    ]


def reference_pick_best(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The library's rule (search/best_of_n.py::pick_best) on the exercise's sample dicts."""
    chosen = pick_best([(Candidate(s["id"], s["completion"]), s["reward"]) for s in samples])
    return next(s for s in samples if s["id"] == chosen.id)


def same_sample(got: Any, want: dict[str, Any]) -> str | None:
    """None if `got` is the sample `want` is, else what is wrong."""
    if not isinstance(got, dict) or "id" not in got:
        return (f"returned {type(got).__name__} {got!r:.60}, expected one of the samples: the dict itself, with "
                f"its id (here {want['id']!r})")
    if got["id"] != want["id"]:
        return (f"picked {got['id']!r} (reward {got.get('reward')!r}), expected {want['id']!r} "
                f"(reward {want['reward']!r})")
    if got != want:
        return f"picked {got['id']!r} but changed it: returned {got!r:.80}, expected {want!r:.80}"
    return None
