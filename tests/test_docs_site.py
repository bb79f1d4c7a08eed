"""The documentation site (mkdocs.yml): built with --strict, then read in a real browser.

The site is built once for the module, as `make test` builds it, plus the static rendering of one
lesson (POSTTRAIN_DOCS_LESSONS=02: the export and its offline frontend are exercised; `make docs`
renders every lesson). Python's http.server serves it on 127.0.0.1, and headless Debian chromium,
driven by Playwright with every background network feature off, opens the home page, a guide, a
lesson page with its rendering, and the CLI reference: each renders, has the navigation, loads
every image and every request it makes; screenshots go to the test's tmp dir. The CLI reference
is checked against `posttrain train --help-all`: every flag the help shows is on the page.
Without chromium or playwright the browser test is skipped and says why."""

from __future__ import annotations

import functools
import html
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]'; `make test` has it)")

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
LESSON = "02_rollout_and_pi_old"  # the lesson the module's build renders (about 10 s of marimo export)
BUILD_S = 600  # a build with a lesson to render takes ~30 s on 2 idle cores; leave room for a busy machine
PAGE_S = 60  # a page, or the rendering's marimo frontend (a few MB of scripts from localhost)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built with --strict into a temporary folder; the build's output on failure."""
    out = tmp_path_factory.mktemp("site") / "site"
    env = dict(os.environ, POSTTRAIN_DOCS_LESSONS=LESSON.split("_")[0], NO_MKDOCS_2_WARNING="1")
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=BUILD_S)
    if done.returncode != 0:
        pytest.fail(f"mkdocs build --strict failed (exit {done.returncode}) after {time.monotonic() - start:.0f} s; "
                    f"what it said:\n{(done.stdout + done.stderr)[-6000:]}")
    return out


def test_site_builds_strict_with_every_page_in_place(site):
    for page in ["index.html", "getting-started.html", "guides/your-task.html", "lessons/index.html",
                 f"lessons/{LESSON}.html", "benchmarks.html", "architecture.html", "reference/cli.html",
                 "reference/api.html"]:
        assert (site / page).is_file(), page
    # BENCHMARKS.md and ARCHITECTURE.md appear on the site with their own text (included, not copied)
    first = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
    assert f">{first}<" in (site / "architecture.html").read_text(encoding="utf-8")
    # the Python API reference is rendered from docstrings: the seams and the package face are there
    api = (site / "reference" / "api.html").read_text(encoding="utf-8")
    for name in ["Engine", "Rollout", "Algorithm", "Environment", "Tokenizer", "StepHook", "Trainer", "TrainConfig"]:
        assert f'id="posttrain.' in api and re.search(rf'id="posttrain\.[\w.]*\b{name}"', api), name
    # the lesson rendered in this build is served with marimo's frontend beside it, nothing from a CDN
    rendering = (site / "lessons" / "notebooks" / f"{LESSON}.html").read_text(encoding="utf-8")
    assert "cdn.jsdelivr" not in rendering and "_marimo/assets/" in rendering
    assert (site / "lessons" / "notebooks" / "_marimo" / "assets").is_dir()


def test_strict_build_fails_on_a_broken_link_anchor_repository_path_or_orphan_page(tmp_path):
    """A copy of the site's sources (docs/ copied, the rest linked) with four faults planted: the
    build stops and names each one."""
    for name in ["mkdocs.yml", "docs"]:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    for entry in ROOT.iterdir():
        if not (tmp_path / entry.name).exists() and entry.name not in (".git", ".venv", ".cache", "site"):
            (tmp_path / entry.name).symlink_to(entry)
    guide = tmp_path / "docs" / "guides" / "runs.md"
    guide.write_text(guide.read_text(encoding="utf-8") + "\n[a](../no-such-page.md) [b](../benchmarks.md#no-such-anchor) "
                     "[c](../../posttrain/no_such_file.py) [d](../../posttrain/roles/rollout.py)\n", encoding="utf-8")
    (tmp_path / "docs" / "orphan.md").write_text("# A page in no nav\n", encoding="utf-8")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", POSTTRAIN_DOCS_LESSONS="")  # no lesson to render: seconds
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BUILD_S)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "Aborted with 4 warnings in strict mode" in said, said[-3000:]
    for fault in ["'../no-such-page.md'", "'#no-such-anchor'", "'../../posttrain/no_such_file.py'", "- orphan.md"]:
        assert fault in said, (fault, said[-3000:])
    # the link into the repository that exists became a page of the site, not a warning
    assert "rollout.py" not in "".join(line for line in said.splitlines() if "WARNING" in line)


def test_cli_reference_lists_every_flag_train_help_all_shows(site):
    from posttrain.cli.flags import SHORT_FLAGS

    env = dict(os.environ, COLUMNS="240")  # wide: the help's boxes never break a flag's name
    shown = subprocess.run([sys.executable, "-m", "posttrain", "train", "--help-all"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    flags = set(re.findall(r"(?<![\w-])--[a-z][\w.-]*\w", shown.stdout)) - {"--help", *SHORT_FLAGS}
    assert len(flags) > 200 and "--rl.optim.lr" in flags and "--grpo.kl_coef" in flags
    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    rows = {html.unescape(name) for name in re.findall(r'<tr id="train-[^"]*"><td[^>]*><code>([^<]+)</code>', page)}
    assert sorted(flags - rows) == [], "flags `posttrain train --help-all` shows that the CLI reference lacks"
    # each with its type, default and help, as --help-all gives them: one worked row
    row = re.search(r'<tr id="train-rl\.optim\.lr">(.*?)</tr>', page)[1]
    assert "<code>FLOAT</code>" in row and "<code>0.0001</code>" in row and "collapse" in row, row


@pytest.fixture(scope="module")
def served(site):
    """The built folder on http://127.0.0.1:PORT, as Python's http.server serves it."""

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):  # the test reports failed requests itself
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def broken_images(frame) -> list[str]:
    return frame.evaluate("() => [...document.images].filter(i => !i.complete || i.naturalWidth === 0)"
                          ".map(i => i.currentSrc || i.src)")


def test_pages_render_in_a_browser(served, tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if executable is None:
        pytest.skip(f"no chromium at {CHROMIUM}: install Debian's chromium (apt-get install -y chromium); .ci/run "
                    "does this when it runs as root")
    failed: list[str] = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(PAGE_S * 1000)
            page.on("requestfailed", lambda r: failed.append(f"{r.url}: {r.failure}"))
            page.on("response", lambda r: failed.append(f"{r.url}: HTTP {r.status}") if r.status >= 400 else None)
            for name, path in [("home", "index.html"), ("guide", "guides/your-task.html"),
                               ("lesson", f"lessons/{LESSON}.html"), ("cli", "reference/cli.html")]:
                page.goto(f"{served}/{path}", wait_until="load")
                assert page.locator("article h1").first.is_visible(), f"{path}: no heading rendered"
                nav = page.locator("nav.md-nav--primary")
                for section in ("Getting started", "Guides", "Lessons", "Reference"):
                    assert nav.get_by_text(section, exact=True).count() >= 1, f"{path}: no {section!r} in the nav"
                if name == "lesson":  # the static rendering in its frame: marimo's page, outputs and all
                    page.locator("iframe.lesson-rendering").scroll_into_view_if_needed()
                    frame = page.frame_locator("iframe.lesson-rendering")
                    frame.get_by_role("heading", name=re.compile("Rollout")).first.wait_for()
                    inner = next(f for f in page.frames if f.url.endswith(f"notebooks/{LESSON}.html"))
                    assert broken_images(inner) == [], f"{path}: images in the rendering did not load"
                if name == "cli":
                    assert page.locator("#train-rl\\.optim\\.lr").count() == 1
                page.wait_for_load_state("networkidle")
                assert broken_images(page.main_frame) == [], f"{path}: images did not load"
                page.screenshot(path=str(tmp_path / f"{name}.png"))
        finally:
            browser.close()
    assert failed == [], f"requests that failed: {failed}"
    assert all((tmp_path / f"{name}.png").stat().st_size > 10_000 for name in ("home", "guide", "lesson", "cli"))
