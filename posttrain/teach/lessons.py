"""`posttrain lessons`: open the interactive lessons (marimo notebooks in lessons/).

    posttrain lessons              every lesson in a browser, starting at the index (marimo run)
    posttrain lessons 02           one lesson (also "2", "02_rollout_and_pi_old", or its file name)
    posttrain lessons --edit       the lessons folder in marimo's editor: change the code, re-run
    posttrain lessons 02 --edit    one lesson in the editor
    posttrain lessons --list       the lessons, one line each

Everything runs locally: marimo serves on 127.0.0.1, its update check is switched off, and
it is never allowed to build a sandbox (which would download packages). The lessons live in
the repository's lessons/ folder, beside this package, not inside it.

The server dies with this command (posttrain/guards/processes.py): killed with SIGKILL, posttrain
once left marimo serving on its port (measured: still answering 7 s later, with nothing
left to stop it).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import socket
import subprocess
import sys
import threading
import webbrowser
from pathlib import Path

from posttrain.guards.processes import command_dying_with_parent

LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
INDEX = "index.py"
LESSON_FILE = re.compile(r"^(\d\d[a-z]?)_\w+\.py$")  # "02_rollout_and_pi_old.py" -> "02"


def lesson_files(directory: Path = LESSONS_DIR) -> dict[str, Path]:
    """{"00": path, "01": path, ...}: every lesson notebook in `directory`, in order."""
    found = {}
    for path in sorted(directory.glob("*.py")):
        match = LESSON_FILE.match(path.name)
        if match:
            found[match.group(1)] = path
    return found


def lesson_title(path: Path) -> str:
    """The first line of the notebook's module docstring ("Lesson 02 · Rollout: ...")."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or path.stem
    return doc.strip().splitlines()[0]


def resolve_lesson(name: str, directory: Path = LESSONS_DIR) -> Path:
    """The notebook a user means by `name`: "02", "2", "02_rollout_and_pi_old(.py)" or
    "index". Raises ValueError listing the valid lessons when there is no such lesson."""
    lessons = lesson_files(directory)
    key = name.strip().removesuffix(".py")
    if key == "index":
        return directory / INDEX
    if key.isdigit():
        key = f"{int(key):02d}"
    for number, path in lessons.items():
        if key in (number, path.stem):
            return path
    valid = "\n".join(f"  {number}  {lesson_title(path)}" for number, path in lessons.items())
    raise ValueError(f"no lesson {name!r} in {directory}; valid lessons:\n{valid}\n  index  the table of lessons")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_command(lesson: str | None, edit: bool, port: int, headless: bool,
                  directory: Path = LESSONS_DIR) -> tuple[list[str], str | None]:
    """(the marimo command line, the URL to open in a browser ourselves or None).

    Without a lesson, `run` serves the whole folder, so the index's links to the other
    lessons work, and we open the browser on the index itself (marimo would open its file
    gallery); `edit` opens the folder in marimo's file browser."""
    target = directory if lesson is None else resolve_lesson(lesson, directory)
    mode = "edit" if edit else "run"
    cmd = [sys.executable, "-m", "marimo", mode, str(target), "--host", "127.0.0.1", "--port", str(port)]
    cmd.append("--no-sandbox")  # a sandbox would install packages: never
    open_url = None
    if mode == "run" and lesson is None:
        cmd.append("--headless")  # we open the browser on the index instead of the gallery
        open_url = None if headless else f"http://127.0.0.1:{port}/?file={INDEX}"
    elif headless:
        cmd.append("--headless")
    return cmd, open_url


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="posttrain lessons", description=__doc__.split("\n\n")[0])
    p.add_argument("lesson", nargs="?", default=None, help='lesson number ("02"), file name, or "index"; default: all')
    p.add_argument("--edit", action="store_true", help="open in marimo's editor instead of read-only app mode")
    p.add_argument("--port", type=int, default=0, help="port to serve on (default: a free one)")
    p.add_argument("--headless", action="store_true", help="do not open a browser; print the URL")
    p.add_argument("--list", action="store_true", help="list the lessons and exit")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if not LESSONS_DIR.is_dir():
        print(f"posttrain lessons: error: no lessons folder at {LESSONS_DIR}; the lessons ship with the "
              "repository, not the wheel: run this from a clone (pip install -e .)", file=sys.stderr)
        return 2
    if args.list:
        for number, path in lesson_files().items():
            print(f"{number}  {lesson_title(path)}  ({path.relative_to(LESSONS_DIR.parent)})")
        return 0
    try:
        import marimo  # noqa: F401  (only to fail early with a clear message)
    except ImportError:
        print("posttrain lessons: error: marimo is not installed; run: pip install marimo", file=sys.stderr)
        return 2
    try:
        cmd, open_url = build_command(args.lesson, args.edit, args.port or _free_port(), args.headless)
    except ValueError as err:
        print(f"posttrain lessons: error: {err}", file=sys.stderr)
        return 2
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1")
    if open_url:
        # give the server a moment to bind before the browser asks for the page
        threading.Timer(2.0, webbrowser.open, args=(open_url,)).start()
    print(" ".join(cmd), flush=True)
    try:
        # wrapped: the server gets SIGKILL from the kernel if this process dies first
        return subprocess.call(command_dying_with_parent(cmd), env=env, cwd=LESSONS_DIR.parent)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
