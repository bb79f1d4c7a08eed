"""The house (ARCHITECTURE.md, "Code map"): imports point one way and never in a circle.

Every import in the package is read from the source, including imports made inside
functions and under `if TYPE_CHECKING:`: a circle that exists only through a deferred
import is still a circle (it only hides until the first call). Each module gets the rank
of its room below; a module may import its own room and rooms of a lower rank, and the
rooms themselves (the folders, as a reader sees them) form no circle either.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "posttrain"

# Lower rank = closer to the ground. The library (0-2), the jobs that put it to work (3-4),
# the curriculum that teaches with both (5), the command line, which dispatches to jobs and
# lessons alike (6), and the package face `posttrain/__init__.py` on top (7): it offers jobs
# and library to Python users, so nothing inside may import it. "posttrain" is also the
# fallback room of a top-level module not listed here, which then cannot be imported by
# anything below: list a new one at its rank.
RANKS = {
    "posttrain": 7, "posttrain.version": 0, "posttrain.types": 0, "posttrain.config": 0, "posttrain.files": 0,
    "posttrain.seeds": 0,
    # the process guards (sandbox, helper processes, calls with a time limit) import nothing else of posttrain
    "posttrain.guards": 0,
    "posttrain.algorithms": 1, "posttrain.models": 1, "posttrain.verifiers": 1,
    # pure calculators and simulators (the curriculum's systems lessons read them): the standard
    # library and torch only, so jobs and pre-run checks may import them too
    "posttrain.systems": 1,
    "posttrain.envs": 2, "posttrain.rewards": 2, "posttrain.roles": 2,
    "posttrain.runs": 3, "posttrain.data": 3, "posttrain.eval": 3, "posttrain.search": 3, "posttrain.distributed": 3,
    "posttrain.pipelines": 4,
    "posttrain.teach": 5,
    "posttrain.cli": 6, "posttrain.__main__": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(path: Path) -> set[str]:
    """Every posttrain module `path` imports, anywhere in the file. `from a.b import c`
    counts as importing a.b.c when that is a module, else a.b."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: imported_modules(path) for name, path in MODULES.items()}


def room(name: str) -> str:
    """The room a module stands in: its entry in RANKS (the longest matching prefix)."""
    return max((r for r in RANKS if name == r or name.startswith(r + ".")), key=len)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_every_module_has_a_room():
    assert all(room(name) for name in MODULES)


def test_no_import_cycle_between_modules():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_import_cycle_between_rooms():
    rooms: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        rooms.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    cycle = find_cycle(rooms)
    assert cycle is None, "rooms import each other in a circle: " + " -> ".join(cycle)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_never_run_back_up_a_layer(name):
    upward = sorted(t for t in GRAPH[name] if RANKS[room(t)] > RANKS[room(name)])
    assert not upward, f"{name} (rank {RANKS[room(name)]}) imports higher rooms: {upward}"


def test_the_finder_sees_imports_inside_functions():
    # the cycle test is only as good as the import reader: a deferred import must count
    assert "posttrain.teach.lessons" in GRAPH["posttrain.cli"]


def in_config(name: str) -> bool:
    return name == "posttrain.config" or name.startswith("posttrain.config.")


def test_config_imports_nothing_else_from_the_package():
    config = sorted(name for name in GRAPH if in_config(name))
    assert len(config) > 1 and "posttrain.config" in config  # the package and its modules are all read
    for name in config:
        others = sorted(t for t in GRAPH[name] if not in_config(t))
        assert not others, f"{name} imports {others}: config is dataclasses and value checks only"
    code = "import sys, posttrain.config; print(sorted(m for m in sys.modules if m.startswith('posttrain')))"
    loaded = ast.literal_eval(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    # importing it loads its sections and nothing outside config/ (the other commands' settings,
    # commands.py and scoring.py, and the file format, files.py, load when asked for)
    assert "posttrain.config.run" in loaded and set(loaded) <= {"posttrain", *config}


def test_an_algorithm_file_imports_only_algorithms_and_types():
    for name, targets in GRAPH.items():
        if name.startswith("posttrain.algorithms"):
            others = sorted(t for t in targets if not t.startswith("posttrain.algorithms") and t != "posttrain.types")
            assert not others, f"{name} imports {others}"


def test_the_package_root_holds_only_its_face_and_what_every_band_shares():
    # the face (__init__, __main__, version), types, and the two helpers every band uses (files, seeds);
    # a config module belongs in config/, a process guard in guards/
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(root) <= 5, f"the package root holds {len(root)} modules: {root}"


MAX_LINES = 400  # ARCHITECTURE.md's invariant: one idea a file, readable in one sitting


def test_no_module_is_over_the_line_limit():
    """ARCHITECTURE.md says this rule is held by a test; until stop 46 none held it, and a
    module reached 415 lines unnoticed. A module over the limit is two ideas: split it."""
    long = {str(p.relative_to(PACKAGE.parent)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}; split each along the ideas it holds"
