"""The lessons in a real browser: serve lessons/ with the same marimo command `posttrain
lessons` runs, open the index, then lesson 10, move its ratio slider with the keyboard (and
lesson 22a's response-length slider, a systems widget, and lesson 26's estimator weight), and
check that the clip-table output the library computes changes (ρ = 1.30 is clipped, ρ = 1.20
is not). Then every lesson, one page each: no cell may end in an error, and every chart the
notebook draws with posttrain/teach/charts.py (each call of `finish`) must arrive as a
matplotlib image with data on it. A full-page screenshot of each goes to tests/artifacts/.

All 33 lessons take several minutes on two shared cores, so the sweep over every lesson is
marked slow (`pytest -m slow tests/test_lessons_browser.py`); lesson 12 stays in the default
run as its quick representative.

Headless Debian chromium (/usr/bin/chromium) driven by Playwright, on 127.0.0.1 only, with a
fresh profile and every background network feature switched off. Without chromium or
playwright the test is skipped and says why; .ci/run installs chromium when it can."""

from __future__ import annotations

import ast
import base64
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from posttrain.teach import lessons as lessons_cli

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "tests" / "artifacts"
LESSONS = ROOT / "lessons"
LESSON_FILES = sorted(p for p in LESSONS.glob("*.py") if re.match(r"\d\d[a-z]?_", p.name))
QUICK = {"12_rloo.py"}  # the lessons the default run opens; the rest are marked slow
LESSON_S = 300  # the slowest lesson (17: a tiny SFT, then five search methods at four budgets) on loaded cores
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SERVER_START_S = 60  # marimo imports in a few seconds; a loaded 2-core machine is slower
PAGE_S = 90  # the lesson's kernel imports torch and runs every cell before the output exists

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) or shutil.which("chromium")),
                                reason=f"no chromium at {CHROMIUM}: install Debian's chromium (apt-get install -y "
                                       "chromium); .ci/run does this when it runs as root")


SERVER_LOGS: dict[str, Path] = {}  # base URL -> the log of the marimo server serving it


def _wait_until_served(url: str, proc: subprocess.Popen, timeout: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = log_path.read_text(encoding="utf-8", errors="replace")
            raise RuntimeError(f"marimo exited with code {proc.returncode} before serving:\n{out[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"marimo did not answer at {url} within {timeout:.0f} s")


@pytest.fixture(scope="module")
def served_lessons(tmp_path_factory):
    """The lessons folder served by marimo on a free localhost port, one server for the
    module; yields the base URL. Its log goes to a file (a pipe nobody reads fills and
    stalls the server) that error messages quote."""
    port = lessons_cli._free_port()
    cmd, _ = lessons_cli.build_command(None, edit=False, port=port, headless=True)
    assert "--headless" in cmd and "--no-sandbox" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    cmd.append("--no-token")  # the default already; said explicitly so the URL needs no token
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1")
    log_path = tmp_path_factory.mktemp("marimo") / "server.log"
    log = log_path.open("w", encoding="utf-8")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: we stop it and its kernels
    base = f"http://127.0.0.1:{port}"
    SERVER_LOGS[base] = log_path
    try:
        _wait_until_served(f"{base}/", proc, SERVER_START_S, log_path)
        yield base
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """One headless chromium for the module, with a fresh profile."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium") / "profile"), executable_path=executable, headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 900})
        try:
            yield context
        finally:
            context.close()


def test_index_and_a_widget_lesson_in_a_browser(served_lessons, browser):
    page = browser.new_page()
    kernel = KernelWatch(page)
    try:
        page.set_default_timeout(PAGE_S * 1000)

        # The index: its title and a link to every lesson, lesson 10 among them.
        page.goto(f"{served_lessons}/?file=index.py")
        page.get_by_role("heading", name="RL post-training, from first principles").wait_for()
        assert page.get_by_role("link", name="PPO").count() >= 1
        page.screenshot(path=str(ARTIFACTS / "index.png"))

        # Lesson 10: the clip table at its defaults (ρ = 1.30, A = +1, ε = 0.2: clipped).
        page.goto(f"{served_lessons}/?file=10_ppo.py")
        output = page.get_by_role("heading", name=re.compile(r"^ρ = \d\.\d\d, A = "))
        output.wait_for()
        before = output.inner_text()
        assert before.startswith("ρ = 1.30") and "clipped branch" in before
        chart = page.locator("[data-cell-id] img[src^='data:image/png']").first  # the clipped objective against ρ
        chart_before = chart.get_attribute("src")

        slider = page.get_by_role("slider").first  # the ratio: the panel's first control
        slider.focus()
        slider.press("ArrowLeft")
        slider.press("ArrowLeft")  # step 0.05: ρ = 1.20, back inside the trust region
        page.wait_for_function(  # the kernel recomputes after each key press; wait for the second
            "() => [...document.querySelectorAll('h3')].some(e => e.innerText.startsWith('ρ = 1.20'))")
        after = page.get_by_role("heading", name=re.compile(r"^ρ = \d\.\d\d, A = ")).inner_text()
        assert after != before
        assert after.startswith("ρ = 1.20") and "unclipped branch" in after, after
        # the chart is redrawn with the mark at the new ratio: the kernel sent a new image
        page.wait_for_function("before => [...document.querySelectorAll('[data-cell-id] img')].every("
                               "e => e.src !== before)", arg=chart_before)
        settle(page, kernel, "10_ppo.py after the slider moved")  # the chart's redraw, not a stale one
        # the widget at the top of the picture, its output below it
        page.get_by_text("Set a token's ratio").evaluate("e => e.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(300)
        page.screenshot(path=str(ARTIFACTS / "lesson_10_clip_table.png"))

        # Lesson 22a (the systems part): the throughput equation recomputed by the library
        # when the mean response length moves, one slider step of 128 tokens at a time.
        page.goto(f"{served_lessons}/?file=22a_throughput_equation.py")
        step = page.get_by_role("heading", name=re.compile(r"^colocated: τ_step = "))
        step.wait_for()
        before = step.inner_text()
        slider = page.get_by_role("slider").first  # the mean response length (tokens)
        slider.focus()
        slider.press("ArrowRight")
        page.wait_for_function(
            "before => [...document.querySelectorAll('h3')].some("
            "e => e.innerText.startsWith('colocated: τ_step') && e.innerText !== before)", arg=before)
        after = page.get_by_role("heading", name=re.compile(r"^colocated: τ_step = ")).inner_text()
        seconds = [float(re.search(r"= ([0-9.]+) s$", text.strip())[1]) for text in (before, after)]
        assert seconds[1] > seconds[0], (before, after)  # longer answers, a longer step
        page.screenshot(path=str(ARTIFACTS / "lesson_22a_throughput.png"))

        # Lesson 26 (the synthesis): the three-forces simulator's point moves when the weight
        # on the estimator goes from 0 to 0.1 (weights 1, 0.1, 0 normalise to 0.91, 0.09, 0)
        page.goto(f"{served_lessons}/?file=26_three_forces.py")
        page.wait_for_function("() => document.body.innerText.includes('= (1.00, 0.00, 0.00)')")
        estimator = page.get_by_role("slider").nth(1)
        estimator.focus()
        estimator.press("ArrowRight")
        page.wait_for_function("() => document.body.innerText.includes('= (0.91, 0.09, 0.00)')")
        page.screenshot(path=str(ARTIFACTS / "lesson_26_forces.png"))
    finally:
        page.close()
    assert (ARTIFACTS / "lesson_10_clip_table.png").stat().st_size > 10_000


# --------------------------------------------------------------------------------------
# Every lesson: no error, and every chart drawn with data
# --------------------------------------------------------------------------------------

# A chart's data is drawn in the palette's colours (charts.PALETTE, less its black); the axes,
# grid, labels and the setting's mark are not. A figure with axes but no data has none of them.
DATA_COLOURS = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in ("#0072B2", "#D55E00", "#009E73", "#CC79A7",
                                                                          "#E69F00", "#56B4E9")]
DATA_PIXELS = 200  # a 2×-resolution line of data is thousands; anti-aliased text never reaches the palette


def charts_drawn_by(path: Path) -> int:
    """How many charts the notebook draws with the course's helper: its calls of finish()
    (`finish(...)` or `charts.finish(...)`), one per figure."""
    calls = [node.func for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.Call)]
    return sum(getattr(f, "id", None) == "finish" or getattr(f, "attr", None) == "finish" for f in calls)


def _colours(src: str) -> list[tuple[int, tuple[int, int, int]]]:
    """(count, RGB) for every colour of a PNG data URL, at a size plenty to find a curve."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).convert("RGB")
    image.thumbnail((800, 800))
    return image.getcolors(maxcolors=1 << 20) or []


def data_pixels(src: str) -> int:
    """Pixels within a small distance of a data colour of the course's palette."""
    return sum(count for count, (r, g, b) in _colours(src)
               if any(abs(r - R) + abs(g - G) + abs(b - B) < 40 for R, G, B in DATA_COLOURS))


def coloured_pixels(src: str) -> int:
    """Pixels with any colour at all: a figure drawn without the course's helper (plain
    matplotlib) has data in some colour, while empty axes are black, grey and white."""
    return sum(count for count, rgb in _colours(src) if max(rgb) - min(rgb) > 60)


class KernelWatch:
    """What the page's kernel says over its websocket: each cell's status (queued, running,
    idle) and which cells ended in an error (marimo's run mode shows an errored cell as
    nothing at all, so the page alone cannot tell a failure from an empty output)."""

    QUIET_S = 2.0  # no message for this long, with nothing queued or running: the page has settled

    def __init__(self, page) -> None:
        self.status: dict[str, str] = {}
        self.errors: dict[str, object] = {}
        self.last_message = time.monotonic()
        page.on("websocket", lambda ws: ws.on("framereceived", self._receive))

    def _receive(self, payload) -> None:
        self.last_message = time.monotonic()
        try:
            message = json.loads(payload if isinstance(payload, str) else payload.decode())
        except ValueError:
            return
        data = message.get("data") or {}
        if message.get("op") != "cell-op":
            return
        if data.get("status"):
            self.status[data["cell_id"]] = data["status"]
        if (data.get("output") or {}).get("channel") == "marimo-error":
            self.errors[data["cell_id"]] = data["output"].get("data")

    def busy(self) -> list[str]:
        return sorted(cell for cell, status in self.status.items() if status in ("queued", "running"))

    def settled(self) -> bool:
        """Some cell has run, none is queued or running, and the kernel has gone quiet
        (markdown cells arrive pre-rendered and never run; a failed cell's descendants never do)."""
        return (bool(self.status) and not self.busy()
                and time.monotonic() - self.last_message > self.QUIET_S)


def settle(page, kernel: KernelWatch, what: str, timeout: float = LESSON_S) -> None:
    """Wait until the kernel has run everything the last page load or widget move started."""
    deadline = time.monotonic() + timeout
    while not kernel.settled():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: cells {kernel.busy()} had not finished after {timeout:.0f} s")
        page.wait_for_timeout(250)


def _server_log_tail(base: str) -> str:
    path = SERVER_LOGS.get(base)
    return path.read_text(encoding="utf-8", errors="replace")[-3000:] if path else ""


def _screenshot_whole_page(page, path: Path) -> None:
    """marimo scrolls inside its own container: size the window to the tallest scroller."""
    tallest = "() => Math.max(...[...document.querySelectorAll('body, body *')].map(e => e.scrollHeight))"
    height = 0
    for _ in range(3):  # a taller window re-lays out the page: measure again until it fits
        measured = min(int(page.evaluate(tallest)) + 40, 20_000)
        if measured <= height:
            break
        height = measured
        page.set_viewport_size({"width": 1280, "height": height})
        page.wait_for_timeout(500)  # the images re-lay out at the new size
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1280, "height": 900})


@pytest.mark.parametrize("path", [p if p.name in QUICK else pytest.param(p, marks=pytest.mark.slow)
                                  for p in LESSON_FILES], ids=[p.name for p in LESSON_FILES])
def test_lesson_runs_in_a_browser_without_errors_and_draws_its_charts(path, served_lessons, browser):
    page = browser.new_page()
    try:
        kernel = KernelWatch(page)
        page.goto(f"{served_lessons}/?file={path.name}")
        settle(page, kernel, path.name)
        assert not kernel.errors, (f"{path.name}: cells {sorted(kernel.errors)} ended in an error "
                                   f"({kernel.errors}); the server's log:\n{_server_log_tail(served_lessons)}")

        expected = charts_drawn_by(path)
        images = page.locator("[data-cell-id] img[src^='data:image/png']")  # matplotlib's output (shadow DOM too)
        if expected:
            images.nth(expected - 1).wait_for(timeout=20_000)
        _screenshot_whole_page(page, ARTIFACTS / f"lesson_{path.stem}.png")
        sources = [images.nth(i).get_attribute("src") for i in range(images.count())]
        with_data = [data_pixels(src) for src in sources]
        blank = [i for i, src in enumerate(sources) if coloured_pixels(src) < DATA_PIXELS]
        assert not blank, f"{path.name}: matplotlib image(s) {blank} (in page order) have no data on them"
        assert sum(n >= DATA_PIXELS for n in with_data) >= expected, (
            f"{path.name} draws {expected} chart(s) with posttrain/teach/charts.py, but the page shows "
            f"{len(sources)} image(s) with {with_data} data-coloured pixels (each needs {DATA_PIXELS}): an output "
            "area is empty where a chart should be, or a chart has no data on it")
    finally:
        page.close()
