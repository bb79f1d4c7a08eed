"""The lessons in a real browser: serve lessons/ with the same marimo command `posttrain
lessons` runs, open the index, then lesson 10, move its ratio slider with the keyboard (and
lesson 22a's response-length slider, a systems widget, and lesson 26's estimator weight), and
check that the clip-table output the library computes changes (ρ = 1.30 is clipped, ρ = 1.20
is not). Screenshots of both pages go to tests/artifacts/.

Headless Debian chromium (/usr/bin/chromium) driven by Playwright, on 127.0.0.1 only, with a
fresh profile and every background network feature switched off. Without chromium or
playwright the test is skipped and says why; .ci/run installs chromium when it can."""

from __future__ import annotations

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
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SERVER_START_S = 60  # marimo imports in a few seconds; a loaded 2-core machine is slower
PAGE_S = 90  # the lesson's kernel imports torch and runs every cell before the output exists

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) or shutil.which("chromium")),
                                reason=f"no chromium at {CHROMIUM}: install Debian's chromium (apt-get install -y "
                                       "chromium); .ci/run does this when it runs as root")


def _wait_until_served(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"marimo exited with code {proc.returncode} before serving:\n{out[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"marimo did not answer at {url} within {timeout:.0f} s")


@pytest.fixture
def served_lessons():
    """The lessons folder served by marimo on a free localhost port; yields the base URL."""
    port = lessons_cli._free_port()
    cmd, _ = lessons_cli.build_command(None, edit=False, port=port, headless=True)
    assert "--headless" in cmd and "--no-sandbox" in cmd and cmd[cmd.index("--host") + 1] == "127.0.0.1"
    cmd.append("--no-token")  # the default already; said explicitly so the URL needs no token
    env = dict(os.environ, MARIMO_SKIP_UPDATE_CHECK="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own process group: we stop it and its kernels
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_served(f"{base}/", proc, SERVER_START_S)
        yield base
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_index_and_a_widget_lesson_in_a_browser(served_lessons, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900})
        try:
            page = context.new_page()
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

            slider = page.get_by_role("slider").first  # the ratio: the panel's first control
            slider.focus()
            slider.press("ArrowLeft")
            slider.press("ArrowLeft")  # step 0.05: ρ = 1.20, back inside the trust region
            page.wait_for_function(  # the kernel recomputes after each key press; wait for the second
                "() => [...document.querySelectorAll('h3')].some(e => e.innerText.startsWith('ρ = 1.20'))")
            after = page.get_by_role("heading", name=re.compile(r"^ρ = \d\.\d\d, A = ")).inner_text()
            assert after != before
            assert after.startswith("ρ = 1.20") and "unclipped branch" in after, after
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
            context.close()
    assert (ARTIFACTS / "lesson_10_clip_table.png").stat().st_size > 10_000
