"""The lessons on the site (a MkDocs hook, mkdocs.yml `hooks:`): their index, a page per lesson,
and each lesson's static rendering.

lessons/index.py's list (file, title, what you will do), read without running the notebook, gives
docs/lessons/index.md its table (where the page has the line `<!-- lessons -->`) and the nav its
Lessons section: a page lessons/NN_name.md per lesson with the notebook's title line, what it
teaches, the command that runs it live (`posttrain lessons NN`), and its static rendering.

A static rendering is the page `marimo export html` saves after running every cell (tens of
seconds a lesson): the outputs at the widgets' defaults, the code, no live kernel. The variable
POSTTRAIN_DOCS_LESSONS says which lessons a build renders: "all" (`make docs`), numbers
("02,10"; the browser test renders one), or none when unset (`make test`'s strict build: seconds).
A lesson not rendered says so on its page. Renderings are kept in .cache/lessons/, each under a
key of its notebook, the library's source and marimo's version, so a build renders only what
changed. marimo's page loads marimo's frontend from a CDN: it is rewritten to load the copy that
the installed marimo package ships, copied beside the renderings, so the site needs no network
(the renderings then need a server, as ES modules do: `make docs-serve`).
"""

from __future__ import annotations

import ast
import concurrent.futures
import hashlib
import html
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
INDEX_PAGE = "lessons/index.md"
MARK = "<!-- lessons -->"
RENDERINGS = "lessons/notebooks"  # on the site: NN_name.html, and marimo's frontend in _marimo/
FRONTEND = "_marimo"
CACHE = ROOT / ".cache" / "lessons"
CDN = re.compile(r"https://cdn\.jsdelivr\.net/npm/@marimo-team/frontend@(?P<version>[^/\"']+)/dist/")
EXPORT_S = 600  # one lesson's export; the slowest take about a minute on 2 busy cores
log = logging.getLogger("mkdocs.hooks.lessons")


def lesson_list() -> list[tuple[str, str, str]]:
    """lessons/index.py's LESSONS, (file, title, what you will do), in its order: the lists assigned
    to LESSONS and added to it in its first cell, sorted by file name as that cell sorts them."""
    found: list[tuple[str, str, str]] = []
    for node in ast.walk(ast.parse((LESSONS / "index.py").read_text(encoding="utf-8"))):
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(node, (ast.Assign, ast.AugAssign)) and getattr(target, "id", None) == "LESSONS":
            found += ast.literal_eval(node.value)
    files = sorted(p.name for p in LESSONS.glob("*.py") if re.match(r"\d\d[a-z]?_\w+\.py$", p.name))
    if not found or sorted(f for f, _, _ in found) != files:
        missing = sorted(set(files) - {f for f, _, _ in found})
        raise PluginError(f"lessons/index.py's LESSONS does not list every lesson notebook (missing: {missing}): "
                          "docs/hooks/lessons.py builds the Lessons pages from it; add each lesson there")
    return sorted(found)


def number(file: str) -> str:
    return file.split("_")[0]


def title_line(file: str) -> str:
    """The notebook's first docstring line, as `posttrain lessons --list` shows it."""
    doc = ast.get_docstring(ast.parse((LESSONS / file).read_text(encoding="utf-8"))) or file
    return doc.strip().splitlines()[0]


def chosen(lessons: list[tuple[str, str, str]]) -> list[str]:
    """The lesson files POSTTRAIN_DOCS_LESSONS asks this build to render."""
    asked = os.environ.get("POSTTRAIN_DOCS_LESSONS", "").strip()
    if not asked:
        return []
    if asked == "all":
        return [f for f, _, _ in lessons]
    numbers = {n.strip() for n in asked.split(",") if n.strip()}
    unknown = numbers - {number(f) for f, _, _ in lessons}
    if unknown:
        raise PluginError(f"POSTTRAIN_DOCS_LESSONS={asked!r}: no lesson {sorted(unknown)}; expected 'all' or lesson "
                          f"numbers such as 02,10 (posttrain lessons --list)")
    return [f for f, _, _ in lessons if number(f) in numbers]


def library_key() -> str:
    """What every rendering depends on beside its own notebook: the library's source, the
    lessons' data, marimo's version."""
    import marimo

    digest = hashlib.sha256(marimo.__version__.encode())
    for path in sorted([*(ROOT / "posttrain").rglob("*.py"), *(LESSONS / "data").rglob("*")]):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(path.relative_to(ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def render(file: str, library: str) -> tuple[Path, float | None]:
    """The rendering of lesson `file` in the cache (made now unless current), and the seconds it took
    (None when it was current)."""
    import marimo

    key = hashlib.sha256(library.encode() + (LESSONS / file).read_bytes()).hexdigest()[:16]
    cached = CACHE / f"{Path(file).stem}-{key}.html"
    if cached.exists():
        return cached, None
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "lesson.html"
        env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        command = [sys.executable, "-m", "marimo", "export", "html", str(LESSONS / file), "-o", str(out),
                   "--no-sandbox"]  # a sandbox would install packages: never
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=EXPORT_S)
        except subprocess.TimeoutExpired:
            raise PluginError(f"lesson {file}: `marimo export html` ran past {EXPORT_S} s; run "
                              f"`python lessons/{file}` to see where it hangs") from None
        if done.returncode != 0 or not out.exists():
            raise PluginError(f"lesson {file}: `marimo export html` failed (exit {done.returncode}); its cells must "
                              f"run headless (`python lessons/{file}` shows the error):\n{done.stderr[-3000:]}")
        page = out.read_text(encoding="utf-8")
    versions = set(m["version"] for m in CDN.finditer(page))
    if versions != {marimo.__version__}:
        raise PluginError(f"lesson {file}: marimo's page loads its frontend from versions {sorted(versions)}, but "
                          f"the installed marimo is {marimo.__version__}: docs/hooks/lessons.py serves the installed "
                          "one's frontend instead; update this rewrite for the new marimo")
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob(f"{Path(file).stem}-*.html"):
        old.unlink()
    cached.write_text(CDN.sub(f"{FRONTEND}/", page), encoding="utf-8")
    return cached, time.monotonic() - start


def render_all(files: list[str]) -> dict[str, Path]:
    """Each of `files` rendered (or found current in the cache), several at a time."""
    if not files:
        return {}
    library, start = library_key(), time.monotonic()
    workers = max(1, min(len(files), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:  # threads: each export is its own process
        done = dict(zip(files, pool.map(lambda f: render(f, library), files)))
    made = {f: s for f, (_, s) in done.items() if s is not None}
    if made:
        slowest = max(made, key=made.__getitem__)
        current = f"; {len(files) - len(made)} were current in .cache/lessons/" if len(made) < len(files) else ""
        log.info(f"lessons: rendered {len(made)} of {len(files)} in {time.monotonic() - start:.0f} s, {workers} at a "
                 f"time (slowest {slowest}, {made[slowest]:.0f} s){current}")
    return {f: path for f, (path, _) in done.items()}


def lesson_page(file: str, title: str, teaches: str, rendered: bool) -> str:
    stem, n = Path(file).stem, number(file)
    lines = ["---", "hide: [toc]  # the rendering takes the width the table of contents would", "---",
             f"# {title_line(file)}", "", f"**What you will do:** {teaches}.", "",
             f"Live, with its widget: `posttrain lessons {n}` (the notebook `lessons/{file}` served on localhost; "
             f"headless, `python lessons/{file}` runs every cell).", ""]
    if rendered:
        url = f"notebooks/{stem}.html"
        lines += [f"Below, its static rendering: every cell run once at the widgets' defaults, with its output. "
                  f"The widgets do not respond here; [open it on its own page]({url}).", "",
                  f'<iframe class="lesson-rendering" src="{html.escape(url)}" title="{html.escape(title)}" '
                  'style="width: 100%; height: 80vh; border: 1px solid var(--md-default-fg-color--lightest);" '
                  'loading="lazy"></iframe>', ""]
    else:
        lines += ["This build of the site has no static rendering of it: `make docs` renders every lesson "
                  "(it runs each notebook once).", ""]
    return "\n".join(lines)


def index_table(lessons: list[tuple[str, str, str]], rendered: set[str]) -> str:
    rows = ["| # | lesson | what you will do | live |", "|---|---|---|---|"]
    for file, _, teaches in lessons:
        stem, n = Path(file).stem, number(file)
        static = f" ([static](notebooks/{stem}.html))" if file in rendered else ""
        rows.append(f"| {n} | [{title_line(file).split(' · ', 1)[-1]}]({stem}.md){static} | {teaches} | "
                    f"`posttrain lessons {n}` |")
    return "\n".join(rows)


state: dict[str, object] = {"lessons": [], "rendered": {}}


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """The Lessons section of the nav gets a page per lesson, after its index."""
    lessons = lesson_list()
    state["lessons"] = lessons
    for entry in config.nav or []:
        if isinstance(entry, dict) and "Lessons" in entry:
            entry["Lessons"] += [{f"{number(f)} · {title}": f"lessons/{Path(f).stem}.md"} for f, title, _ in lessons]
            return config
    raise PluginError("mkdocs.yml's nav has no 'Lessons' section: docs/hooks/lessons.py puts the lessons there")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    lessons: list[tuple[str, str, str]] = state["lessons"]  # type: ignore[assignment]
    rendered = render_all(chosen(lessons))
    state["rendered"] = rendered
    for file, title, teaches in lessons:
        stem = Path(file).stem
        files.append(File.generated(config, f"lessons/{stem}.md", content=lesson_page(file, title, teaches,
                                                                                      file in rendered)))
        if file in rendered:
            files.append(File.generated(config, f"{RENDERINGS}/{stem}.html", abs_src_path=str(rendered[file])))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != INDEX_PAGE:
        return markdown
    if MARK not in markdown:
        raise PluginError(f"docs/{INDEX_PAGE} lost the line {MARK!r}, where the table of lessons goes: put it back")
    rendered: dict[str, Path] = state["rendered"]  # type: ignore[assignment]
    return markdown.replace(MARK, index_table(state["lessons"], set(rendered)))  # type: ignore[arg-type]


def on_post_build(config: MkDocsConfig) -> None:
    """marimo's frontend beside the renderings, from the installed marimo package (its _static folder)."""
    if not state["rendered"]:
        return
    import marimo

    shutil.copytree(Path(marimo.__file__).parent / "_static", Path(config.site_dir) / RENDERINGS / FRONTEND,
                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.md", "index.html"))
