"""How fully hinted each band of the package is, and the two seams named on every signature.

A function (or method, nested ones included) is *fully hinted* when each of its parameters
but a method's self / cls carries an annotation, *args and **kwargs included, and so does
its return; `__init__` is exempt from the return (it is None by definition). A band's share
is its fully hinted functions over all of its functions. Run this file to see them:

    python tests/test_type_hints.py            # every band of posttrain/
    python tests/test_type_hints.py pipelines  # one band, with the functions still to hint

The floors below hold each band at least where it stands, so hints only ever accumulate;
raise one when a band gains. The issue's target for pipelines/ was 90% (it was 62%); it is
fully hinted now, and mypy checks it (pyproject.toml's [tool.mypy]).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "posttrain"

# share of fully hinted functions, per band: at least this (measured, then rounded down to a
# whole percent)
FLOORS = {"types": 1.00, "config": 1.00, "algorithms": 0.99, "roles": 1.00, "models": 0.90, "verifiers": 0.80,
          "envs": 0.98, "rewards": 1.00, "pipelines": 1.00, "distributed": 1.00, "guards": 0.93, "eval": 0.92,
          "search": 0.87, "data": 0.94, "runs": 0.93, "teach": 0.53}


def band_files(band: str) -> list[Path]:
    """The modules of a band: a package folder's files, or one root module."""
    folder = PACKAGE / band
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{band}.py"]


def functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(ast.parse(source)) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def parameters(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[ast.arg]:
    args = function.args
    named = [*args.posonlyargs, *args.args]
    if method and named and named[0].arg in ("self", "cls"):
        named = named[1:]  # its type is the class's: nobody writes it
    return [*named, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a is not None)]


def fully_hinted(function: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> bool:
    return (all(p.annotation is not None for p in parameters(function, method))
            and (function.returns is not None or function.name == "__init__"))


def hints(source: str) -> tuple[int, int, list[str]]:
    """(fully hinted functions, all functions, the names and lines of the others) in `source`."""
    tree = ast.parse(source)
    in_class = {id(node) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
                for node in cls.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    missing = [f"{node.name}:{node.lineno}" for node in found if not fully_hinted(node, id(node) in in_class)]
    return len(found) - len(missing), len(found), missing


def band_hints(band: str) -> tuple[int, int, list[str]]:
    full = total = 0
    missing: list[str] = []
    for path in band_files(band):
        f, t, m = hints(path.read_text(encoding="utf-8"))
        full, total = full + f, total + t
        missing += [f"{path.relative_to(PACKAGE.parent)}:{name}" for name in m]
    return full, total, missing


def bands() -> list[str]:
    """Every folder of the package and every root module but the package face."""
    folders = [p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    modules = [p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")]
    return sorted(folders + modules)


def unannotated_seams(band: str) -> list[str]:
    """file:line name(param) for each parameter named env or tokenizer without an annotation."""
    found = []
    for path in band_files(band):
        for node in functions(path.read_text(encoding="utf-8")):
            args = node.args
            for param in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
                if param.arg in ("env", "tokenizer") and param.annotation is None:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}({param.arg})")
    return found


SAMPLE = '''
def typed(a: int, *rest: str, key: bool = False, **extra: float) -> int: ...
def no_return(a: int): ...
def one_bare(a: int, b) -> None: ...
def bare_star(*args) -> None: ...

class C:
    def __init__(self, n: int): ...
    def method(self, x: int) -> int:
        def inner(y): return y
        return inner(x)
    @classmethod
    def make(cls) -> "C": ...
    def bare(self): ...
'''


def test_the_measure_counts_a_worked_example():
    # typed, C.__init__ (its return exempt), C.method and C.make are fully hinted; no_return,
    # one_bare, bare_star, the nested inner (y) and C.bare (no return) are not
    full, total, missing = hints(SAMPLE)
    assert (full, total) == (4, 9)
    assert sorted(name.split(":")[0] for name in missing) == ["bare", "bare_star", "inner", "no_return", "one_bare"]


def test_self_counts_only_as_a_methods_first_parameter():
    # a plain function whose first parameter is named self still needs its annotation
    assert hints("def f(self) -> None: ...\n")[:2] == (0, 1)
    assert hints("class A:\n    def f(self) -> None: ...\n")[:2] == (1, 1)


@pytest.mark.parametrize("band", sorted(FLOORS))
def test_a_band_stays_at_least_as_hinted_as_its_floor(band):
    full, total, missing = band_hints(band)
    assert full / total >= FLOORS[band], (f"{band}: {full}/{total} = {full / total:.1%} fully hinted, below its floor "
                                          f"{FLOORS[band]:.0%}; hint these: {missing}")


# every band: no parameter named `env` or `tokenizer` goes without an annotation (the
# Environment and Tokenizer protocols of posttrain/types.py, or what else the name means
# there: an EnvConfig, a subprocess's environment variables)
@pytest.mark.parametrize("band", bands())
def test_every_env_and_tokenizer_parameter_names_its_type(band):
    assert not unannotated_seams(band), (f"annotate these (posttrain.types.Environment / Tokenizer, or what the name "
                                         f"means there): {unannotated_seams(band)}")


def report(names: list[str]) -> None:
    print(f"{'band':<14} {'hinted':>7} {'of':>5} {'share':>7}")
    all_full = all_total = 0
    for band in names:
        full, total, missing = band_hints(band)
        all_full, all_total = all_full + full, all_total + total
        print(f"{band:<14} {full:>7} {total:>5} {full / max(1, total):>7.1%}")
        if len(names) == 1:
            print("\n".join(f"  not yet: {name}" for name in missing))
    if len(names) > 1:
        print(f"{'all':<14} {all_full:>7} {all_total:>5} {all_full / max(1, all_total):>7.1%}")


if __name__ == "__main__":
    report(sys.argv[1:] or bands())
