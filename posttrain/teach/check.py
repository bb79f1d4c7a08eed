"""`posttrain check NN`: test your solution to a lesson's code exercise.

    posttrain check 09          run exercises/09_*.py against the library, print PASS or FAIL
    posttrain check pick_best   an exercise named for its function (exercises/pick_best.py)
    posttrain check --list      the exercises, one line each

Each exercise is a stub in the repository's `exercises/` folder, marked `YOUR CODE HERE`,
that you fill in. The check imports your function, calls it and the library's own
function on the same cases (including the awkward ones: padding that holds NaN, a group
of one sample, a response longer than the budget), and compares the results — values and,
for losses, gradients. On failure it names the case and gives a hint. The stubs live
outside the package on purpose: the library's tests never see them. The exercises
themselves (references, cases, hints) are the table in exercises.py; this file loads a
solution and compares.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import math
import re
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from posttrain.teach.exercises import EXERCISES


EXERCISES_DIR = Path(__file__).resolve().parents[2] / "exercises"
EXERCISE_FILE = re.compile(r"^(\d\d[a-z]?)_\w+\.py$")


def exercise_files(directory: Path = EXERCISES_DIR) -> dict[str, Path]:
    """{"09": path, ...}: the stub file of every exercise in `directory`."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        match = EXERCISE_FILE.match(path.name)
        if match:
            found[match.group(1)] = path
        elif path.stem in EXERCISES:  # an exercise named for its function: exercises/pick_best.py
            found[path.stem] = path
    return found


def resolve(number: str) -> str:
    """The exercise `number` means: "9", "09", "13_dapo", "22b" or "22B" (a lesson between two
    numbers), or an exercise's name ("pick_best")."""
    key = number.strip()
    if key in EXERCISES:
        return key
    key = key.lower()
    match = re.match(r"(\d+)([a-z]?)", key)
    key = f"{int(match.group(1)):02d}{match.group(2)}" if match else key
    if key not in EXERCISES:
        raise ValueError(f"no exercise {number!r}; the exercises are {', '.join(EXERCISES)} (a lesson's number, or "
                         "an exercise's name)")
    return key


def load_solution(number: str, directory: Path = EXERCISES_DIR) -> Callable:
    """Import the learner's function from exercises/NN_*.py (fresh each call, so edits count)."""
    key = resolve(number)
    path = exercise_files(directory).get(key)
    if path is None:
        stub = f"{key}.py" if key.isidentifier() else f"{key}_*.py"
        raise FileNotFoundError(f"no exercises/{stub} in {directory}; the exercises ship with the repository")
    spec = importlib.util.spec_from_file_location(f"exercise_{key}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    name = EXERCISES[key].function
    if not hasattr(module, name):
        raise AttributeError(f"{path.name} defines no function {name!r}; keep the stub's name and signature")
    return getattr(module, name)


def _copy(args: tuple, grad: bool) -> tuple:
    """Fresh copies of the arguments (a solution must not see the other's in-place edits, a
    list sorted in place included); the first becomes a leaf that requires grad when
    gradients are compared."""
    out = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            a = a.detach().clone()
            if i == 0 and grad:
                a.requires_grad_(True)
        else:
            a = copy.deepcopy(a)
        out.append(a)
    return tuple(out)


def _close(got: Any, want: torch.Tensor) -> str | None:
    """None if `got` matches `want`, else what is wrong."""
    if not isinstance(got, torch.Tensor):
        return f"returned {type(got).__name__}, expected a torch.Tensor of shape {tuple(want.shape)}"
    if tuple(got.shape) != tuple(want.shape):
        return f"returned shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    got_f, want_f = got.detach().float(), want.detach().float()
    if torch.isnan(got_f).any() and not torch.isnan(want_f).any():
        return "returned NaN where the library's answer is finite (a masked NaN leaked through?)"
    if not torch.allclose(got_f, want_f, rtol=1e-4, atol=1e-5, equal_nan=True):
        return f"returned {_show(got_f)}, expected {_show(want_f)}"
    return None


def _show(t: torch.Tensor) -> str:
    values = [round(v, 4) if math.isfinite(v) else v for v in t.reshape(-1).tolist()[:8]]
    return f"{values}{' ...' if t.numel() > 8 else ''}"


def run_check(number: str, solution: Callable | None = None, out: Callable[[str], None] = print) -> bool:
    """Check `solution` (default: the function in exercises/NN_*.py) against the library
    on every case of the exercise. Prints one line per case and a verdict; True on PASS."""
    key = resolve(number)
    ex = EXERCISES[key]
    try:
        solution = solution or load_solution(key)
    except NotImplementedError as err:  # raised at import time by an unfinished module
        out(f"FAIL  exercise {key}: not written yet ({err}).\n      hint: {ex.hint}")
        return False
    failures = 0
    for name, args in ex.cases():
        want_args = _copy(args, ex.grad_of_first)
        want = ex.reference(*want_args)
        got_args = _copy(args, ex.grad_of_first)
        try:
            got = solution(*got_args)
        except NotImplementedError:
            where = exercise_files().get(key)
            where = f"exercises/{where.name}" if where else f"exercises/{key}_*.py"
            out(f"FAIL  exercise {key}: `{ex.function}` is still the stub; fill in the part marked YOUR CODE HERE "
                f"in {where}.\n      hint: {ex.hint}")
            return False
        except Exception as err:  # the learner's code: report it, never crash the check
            out(f"FAIL  case '{name}': {type(err).__name__}: {err}")
            failures += 1
            continue
        problem = (ex.compare or _close)(got, want)
        if problem is None and ex.grad_of_first:
            (want_grad,) = torch.autograd.grad(want, want_args[0], allow_unused=True)
            if not isinstance(got, torch.Tensor) or not got.requires_grad:
                problem = "the result carries no gradient (did you call .item(), .detach() or build a new tensor?)"
            else:
                (got_grad,) = torch.autograd.grad(got, got_args[0], allow_unused=True)
                got_grad = torch.zeros_like(want_args[0]) if got_grad is None else got_grad
                want_grad = torch.zeros_like(want_args[0]) if want_grad is None else want_grad
                grad_problem = _close(got_grad, want_grad)
                if grad_problem:
                    problem = f"the value is right but its gradient is not: {grad_problem}"
        if problem:
            out(f"FAIL  case '{name}': {problem}")
            failures += 1
        else:
            out(f"ok    case '{name}'")
    if failures:
        out(f"FAIL  exercise {key} ({ex.function}): {failures} case(s) wrong.\n      hint: {ex.hint}")
        return False
    where = ex.source or f"lesson {ex.lesson} names the file"
    out(f"PASS  exercise {key} ({ex.function}) matches the library on every case. Now read the library's "
        f"version ({where}) and compare.")
    return True


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="posttrain check", description=__doc__.split("\n\n")[0])
    p.add_argument("exercise", nargs="?", help="the lesson number of the exercise, e.g. 09, or its name (pick_best)")
    p.add_argument("--list", action="store_true", help="list the exercises and exit")
    args = p.parse_args(argv)
    if args.list or not args.exercise:
        files = exercise_files()
        width = max(map(len, EXERCISES))
        for key, ex in EXERCISES.items():
            where = files[key].relative_to(EXERCISES_DIR.parent) if key in files else "(missing)"
            print(f"{key:{width}s}  {ex.function:26s} {where}")
        return 0
    try:
        return 0 if run_check(args.exercise) else 1
    except (ValueError, FileNotFoundError, AttributeError, SyntaxError) as err:
        print(f"posttrain check: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
