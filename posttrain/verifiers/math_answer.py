"""Math answers: the completion's final answer is checked for mathematical equivalence
with the expected answer by math-verify (https://github.com/huggingface/Math-Verify).

    example.expected_answer   "\\frac{1}{2}"
    completion                "... so the probability is \\boxed{0.5}."
    score(...)                {"reward": 1.0, "details": {"reason": "ok", ...}}

Same contract as `final_int` (deterministic, total on any str, explainable through a
closed set of reason codes, fast, versioned) with one honest exception, stated below:
the time limit.

Spec math/boxed-or-final-v1, in three steps:

  1. Extract (here, in plain Python, linear time; a megabyte takes ~15 ms). The answer is whichever comes LAST in
     the completion: the contents of the last `\\boxed{...}` (nested braces matched,
     `\\{` and `\\}` are literal braces and do not count), or the rest of the last line
     that starts with `Final:`. Surrounding whitespace, `$` signs and one trailing period
     are dropped ('Final: $5$.' reads as '5'). Only the last answer counts, so stating
     several ('\\boxed{3} or maybe \\boxed{4}') cannot launder a guess; one box holding
     several ('\\boxed{3, 4}') is a set, and a set is not equal to 4.
  2. Parse both the answer and `example.expected_answer` with math-verify's `parse`
     (LaTeX first, then plain expressions) into sympy objects.
  3. Compare with math-verify's `verify(gold, answer)`: numbers within its rounding
     ('\\frac{1}{2}' = '0.5' = '1/2', '0.333333' = '1/3'), symbolic equality
     ('2\\sqrt{2}' = '\\sqrt{8}'), sets and intervals ('\\{1,2\\}' = '\\{2,1\\}',
     '(0,1]'), equations against values ('x=2' = '2'). math-verify also drops units and
     `\\text{}` around numbers ('3\\text{ cm}' = '3'): that is its rule, not ours.

What the reward cannot tell apart: '\\pi' versus '3.14159' is wrong (too few digits for
its 6-place rounding); an answer math-verify reads only as text is compared as text.

The time limit. sympy can take minutes or hang on small inputs: comparing
`\\boxed{9^{9^{9^{9}}}}` with anything evaluates a power tower no computer can hold,
and a set nested 20 braces deep takes math-verify longer than a minute to parse
(measured here: depth 8 ~1.3 s, depth 15 ~3.6 s).
math-verify's own timeout uses `signal.alarm`, which works only in the main thread, so
we call it with `parsing_timeout=None, timeout_seconds=None` and bound time ourselves:

  - Cheap guards first: an answer longer than MAX_ANSWER_CHARS or nested deeper than
    MAX_NESTING brackets is refused before any sympy runs.
  - Parse and verify run in a persistent child process (`python -I math_answer.py`,
    this file run as a script) that answers one JSON line per request. The parent waits
    with a hard deadline; when it passes, the child is SIGKILLed, the reason is
    "timeout", and the next call starts a fresh child (~1 s to import sympy, not counted
    against that call's deadline). A process, not a thread, because a thread cannot be
    killed: a runaway sympy computation would keep burning one of our two cores for the
    rest of the run. Reused across calls because starting Python + sympy costs ~1 s and a
    round trip over a pipe costs well under a millisecond.
  - Fallback: if the child cannot be started (no subprocesses allowed, say), the work
    runs in a daemon thread of this process whose result is abandoned at the deadline.
    The reward is still bounded in time, but a runaway computation keeps its core busy;
    `details["worker"]` says which mechanism answered.

Because of the deadline, a comparison that is merely slow can score "timeout" on a busy
machine and "ok" on an idle one: the only place this scorer depends on anything but its
input. Timeouts are rare for real answers (the slowest of our golden cases takes ~0.25 s).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only for annotations: the worker runs this file without importing torch
    from posttrain.types import Example

# The closed set of reason codes. Every call reports exactly one of these.
REASONS: dict[str, str] = {
    "ok": "the answer is mathematically equal to the expected answer",
    "wrong_answer": "the answer parsed, but it is not equal to the expected answer",
    "empty": "the completion is empty or only whitespace",
    "no_answer": "no \\boxed{...} and no line starting with 'Final:'",
    "empty_answer": "the box or the Final line holds nothing ('\\boxed{}', 'Final:')",
    "unclosed_box": "a \\boxed{ is never closed (a generation cut off mid-answer?)",
    "answer_too_long": "the answer is longer than the limit (MAX_ANSWER_CHARS)",
    "nesting_too_deep": "the answer nests brackets deeper than the limit (MAX_NESTING)",
    "unparsable": "math-verify could not read the answer as math (and text did not match)",
    "timeout": "parsing or comparing took longer than the deadline; the worker was killed",
    "expected_unparsable": "math-verify could not read the EXPECTED answer: a dataset bug",
    "verifier_error": "the verifier process died or answered garbage (see details['error'])",
}

MAX_ANSWER_CHARS = 1000  # real final answers are short; 800 chars of 'a+a+...' take ~0.6 s
MAX_NESTING = 8  # ( [ { depth: '\left(\frac{\sqrt{3}}{2}\right)^{2}' is 3; sets 8 deep ~1.3 s
DEFAULT_TIMEOUT_SECONDS = 3.0  # >10x the slowest honest case, short enough not to stall a step
WORKER_STARTUP_SECONDS = 60.0  # importing sympy takes ~1 s idle, much longer on a loaded box
WORKER_MEMORY_MB = 2048  # RLIMIT_AS of the child: a huge power fails instead of swapping
SHOWN_CHARS = 200  # how much of a parsed expression details keep

WHITESPACE = " \t\n\r\f\v"
BOXED = "\\boxed"
FINAL_PREFIX = "Final:"


# ---------------------------------------------------------------------------------------
# Step 1: extraction (pure Python, linear in the completion, never calls sympy)
# ---------------------------------------------------------------------------------------


# Both markers are found by searching the REVERSED completion once: the first match there
# is the last one here, found in one C-level pass (a Python loop over 150k '\boxed' took
# ~100 ms). Each pattern has one quantifier over spaces only, so nothing backtracks badly.
_BOXED_REVERSED = re.compile(r"\{[ \t]*" + re.escape(BOXED[::-1]))  # '\boxed {' backwards
_FINAL_REVERSED = re.compile(re.escape(FINAL_PREFIX[::-1]) + r"[ \t]*(?=\n|\Z)")  # line start = '\n' after


def _last_boxed(text: str, reversed_text: str) -> int:
    """Index of the '{' that opens the last `\\boxed{` (spaces allowed before the brace),
    or -1."""
    match = _BOXED_REVERSED.search(reversed_text)
    return len(text) - match.start() - 1 if match else -1


def _box_contents(text: str, open_at: int) -> tuple[str, str | None]:
    """(reason, contents) of the brace group opening at `open_at`. The scan stops after
    MAX_ANSWER_CHARS, so a megabyte after an unclosed brace costs no more than a short
    answer."""
    depth = 0
    i = open_at
    stop = min(len(text), open_at + MAX_ANSWER_CHARS + 2)
    while i < stop:
        c = text[i]
        if c == "\\":
            i += 2  # '\{', '\}', '\\': an escaped character never opens or closes a group
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return "ok", text[open_at + 1 : i]
        i += 1
    return ("answer_too_long" if stop < len(text) else "unclosed_box"), None


def _last_final_line(text: str, reversed_text: str) -> int:
    """Index just past 'Final:' on the last line that starts with it (indentation
    allowed), or -1."""
    match = _FINAL_REVERSED.search(reversed_text)
    return len(text) - match.start() if match else -1


def _clean(answer: str) -> str:
    answer = answer.strip(WHITESPACE)
    if answer.endswith(".") and not answer.endswith(".."):
        answer = answer[:-1]  # 'Final: 5.' ends a sentence; '5.' alone parses as text
    return answer.strip(WHITESPACE).strip("$").strip(WHITESPACE)


def _nesting(answer: str) -> int:
    depth = deepest = 0
    for c in answer:  # at most MAX_ANSWER_CHARS characters
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth = max(depth - 1, 0)
    return deepest


def extract_answer(completion: str) -> tuple[str, str | None, str | None]:
    """(reason, answer, source): reason "ok" with the answer string and where it came
    from ("boxed" or "final_line"), or a failure code from REASONS with None, and the
    source when one was found."""
    if completion.strip(WHITESPACE) == "":
        return "empty", None, None
    reversed_text = completion[::-1]
    box = _last_boxed(completion, reversed_text)
    final = _last_final_line(completion, reversed_text)
    if box < 0 and final < 0:
        return "no_answer", None, None
    if box > final:  # the later of the two is the final answer
        source = "boxed"
        reason, answer = _box_contents(completion, box)
        if answer is None:
            return reason, None, source
    else:
        source = "final_line"
        newline = completion.find("\n", final)
        answer = completion[final : newline if newline >= 0 else len(completion)]
        if len(answer) > MAX_ANSWER_CHARS + 2:
            return "answer_too_long", None, source
    answer = _clean(answer)
    if answer == "":
        return "empty_answer", None, source
    if len(answer) > MAX_ANSWER_CHARS:
        return "answer_too_long", None, source
    if _nesting(answer) > MAX_NESTING:
        return "nesting_too_deep", None, source
    return "ok", answer, source


# ---------------------------------------------------------------------------------------
# Steps 2 and 3: parse and verify with math-verify (runs in the worker)
# ---------------------------------------------------------------------------------------


def compare(expected: str, answer: str) -> dict[str, Any]:
    """Parse both strings with math-verify and compare them. Slow and unbounded in time:
    call it through the worker, never directly on model output in the trainer.

    Returns {"status": "ok" | "unparsable" | "expected_unparsable", "equal": bool,
    "expected_math": str | None, "answer_math": str | None}."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    # math-verify warns once that its own timeout is off; we bound time ourselves (above)
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    # The answer is already extracted, so wrap it in a box and let the box be the only
    # thing math-verify looks for first; plain expressions ('1/2') are the fallback.
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def read(text: str) -> list:
        return parse("\\boxed{" + text + "}", extraction_config=config, parsing_timeout=None)

    def shown(parsed: list) -> str | None:
        return str(parsed[0])[:SHOWN_CHARS] if parsed else None

    gold, pred = read(expected), read(answer)
    result = {"status": "ok", "equal": False, "expected_math": shown(gold), "answer_math": shown(pred)}
    if not gold:
        result["status"] = "expected_unparsable"
        return result
    if not pred:
        result["status"] = "unparsable"
        return result
    # verify(gold, target): the order matters for equations ('x=2' in gold matches '2').
    result["equal"] = bool(verify(gold, pred, timeout_seconds=None))
    if not result["equal"] and all(isinstance(p, str) for p in pred):
        result["status"] = "unparsable"  # only text came out, and the text did not match
    return result


def _serve() -> None:
    """The worker's loop: one JSON request per stdin line, one JSON reply per stdout
    line. Runs in the child process started by `_Worker`."""
    import resource

    limit = WORKER_MEMORY_MB * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    out = sys.stdout
    try:
        compare("1/2", "0.5")  # import and warm sympy before saying "ready"
    except Exception as error:  # ImportError above all: tell the parent what to install
        out.write(json.dumps({"ready": False, "error": f"{type(error).__name__}: {error}"}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:  # EOF when the parent exits or closes the pipe
        try:
            request = json.loads(line)
            reply = compare(request["expected"], request["answer"])
        except BaseException as error:  # MemoryError, RecursionError, sympy internals
            reply = {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}
        out.write(json.dumps(reply) + "\n")  # ensure_ascii: lone surrogates travel safely
        out.flush()


class WorkerUnavailable(RuntimeError):
    """The child process could not be started; the caller falls back to a thread."""


class _Worker:
    """The persistent child process that runs `compare`, killed on timeout and restarted
    on the next call. One per parent process (a fork gets its own), shared by threads
    under a lock."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.owner_pid = -1
        self.buffer = b""
        self.lock = threading.Lock()
        self.unavailable: str | None = None  # set once starting failed: don't retry every call

    def _start(self) -> None:
        if self.unavailable is not None:
            raise WorkerUnavailable(self.unavailable)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", os.path.abspath(__file__)],  # -I: stdlib-only sys.path
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal reaches the trainer only
            )  # fmt: skip
        except OSError as error:
            self.unavailable = f"could not start the math-verify worker: {error}"
            raise WorkerUnavailable(self.unavailable) from error
        self.owner_pid = os.getpid()
        self.buffer = b""
        hello = self._read_line(time.monotonic() + WORKER_STARTUP_SECONDS)
        if hello is None or not hello.get("ready"):
            self.kill()
            error = (hello or {}).get("error", "no answer within the startup limit")
            if "No module named 'math_verify'" in str(error):
                raise ImportError(
                    "math-verify is not installed: `pip install math-verify` "
                    f"(the math answer scorer needs it); the worker said: {error}"
                )
            self.unavailable = f"the math-verify worker did not start: {error}"
            raise WorkerUnavailable(self.unavailable)

    def _read_line(self, deadline: float) -> dict | None:
        """The next reply line, or None if the deadline passes (or the child dies) first."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return None  # EOF: the child died
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            return {"status": "error", "error": f"unreadable reply {line[:100]!r}"}

    def kill(self) -> None:
        if self.proc is None:
            return
        if self.owner_pid == os.getpid():  # a forked child must not kill its parent's worker
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: the whole group
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                pipe.close()
        self.proc = None

    def ask(self, expected: str, answer: str, timeout: float) -> dict | None:
        """The worker's reply, or None on timeout (the worker is then killed)."""
        with self.lock:
            if self.proc is None or self.owner_pid != os.getpid() or self.proc.poll() is not None:
                self.kill()  # reaps a dead child; forgets (without killing) a parent's one
                self._start()
            request = json.dumps({"expected": expected, "answer": answer}) + "\n"
            try:
                self.proc.stdin.write(request.encode())
                self.proc.stdin.flush()
            except OSError:  # died between calls
                self.kill()
                return {"status": "error", "error": "the worker closed its input"}
            reply = self._read_line(time.monotonic() + timeout)
            if reply is None:
                died = self.proc.poll() is not None
                self.kill()
                if died:
                    return {"status": "error", "error": "the worker died (memory limit?)"}
            return reply


_WORKER = _Worker()
atexit.register(_WORKER.kill)


def _ask_in_thread(expected: str, answer: str, timeout: float) -> dict | None:
    """Fallback: run `compare` in a daemon thread and abandon it at the deadline."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["reply"] = compare(expected, answer)
        except BaseException as error:
            box["reply"] = {"status": "error", "error": f"{type(error).__name__}: {error}"[:300]}

    thread = threading.Thread(target=run, daemon=True, name="math-verify-fallback")
    thread.start()
    thread.join(timeout)
    return box.get("reply")  # None while the thread still runs: a timeout


def shutdown_worker() -> None:
    """Stop the worker process now (it also stops at interpreter exit)."""
    with _WORKER.lock:
        _WORKER.kill()


# ---------------------------------------------------------------------------------------
# The scorer
# ---------------------------------------------------------------------------------------


class MathAnswerSpec:
    """math/boxed-or-final-v1: reward 1.0 iff the last `\\boxed{...}` or `Final:` line
    of the completion is mathematically equal to `example.expected_answer`, as decided by
    math-verify within `timeout_seconds`. See the module docstring for every rule.

    details: reason (REASONS), parsed (the extracted answer string, None if none),
    expected, answer_source ("boxed" | "final_line" | None), format_ok (an answer was
    found and was short and shallow enough to check), answer_math / expected_math (what
    sympy made of them, cut to 200 characters), worker ("process" | "thread" | None),
    error (verifier_error only), spec_version."""

    version = "math/boxed-or-final-v1"

    def __init__(self, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        if not timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be > 0, got {timeout_seconds!r}")
        self.timeout_seconds = timeout_seconds

    def __call__(self, example: Example, completion: str) -> dict[str, Any]:
        if not isinstance(completion, str):
            raise TypeError(
                "completion must be a str (the decoded model output), got "
                f"{type(completion).__name__} {completion!r:.80}; decode the tokens first"
            )
        expected = example.expected_answer.strip(WHITESPACE)
        details: dict[str, Any] = {
            "reason": None, "parsed": None, "expected": expected, "answer_source": None,
            "format_ok": False, "answer_math": None, "expected_math": None, "worker": None,
            "error": None, "spec_version": self.version,
        }  # fmt: skip
        reason, answer, source = extract_answer(completion)
        details["answer_source"] = source
        if reason != "ok":
            details["reason"] = reason
            return {"reward": 0.0, "details": details}
        details["parsed"] = answer
        details["format_ok"] = True
        try:
            reply = _WORKER.ask(expected, answer, self.timeout_seconds)
            details["worker"] = "process"
        except WorkerUnavailable:
            reply = _ask_in_thread(expected, answer, self.timeout_seconds)
            details["worker"] = "thread"
        if reply is None:
            details["reason"] = "timeout"
            return {"reward": 0.0, "details": details}
        status = reply.get("status")
        details["answer_math"] = reply.get("answer_math")
        details["expected_math"] = reply.get("expected_math")
        if status == "ok":
            details["reason"] = "ok" if reply.get("equal") else "wrong_answer"
        elif status in ("unparsable", "expected_unparsable"):
            details["reason"] = status
        else:
            details["reason"] = "verifier_error"
            details["error"] = reply.get("error", f"unexpected reply {reply!r:.100}")
        return {"reward": 1.0 if details["reason"] == "ok" else 0.0, "details": details}

    def format_ok(self, completion: str) -> bool:
        """Whether an answer can be extracted at all, right or wrong (no sympy involved)."""
        return extract_answer(completion)[0] == "ok"

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


SPECS: dict[str, MathAnswerSpec] = {s.version: s for s in (MathAnswerSpec(),)}


def score(example: Example, completion: str, spec_version: str = "math/boxed-or-final-v1") -> dict[str, Any]:
    """Score one completion under a named spec version (so far only math/boxed-or-final-v1)."""
    if spec_version not in SPECS:
        raise ValueError(f"unknown spec_version {spec_version!r}; valid: {', '.join(SPECS)}")
    return SPECS[spec_version](example, completion)


if __name__ == "__main__":  # started by _Worker as `python -I math_answer.py`
    _serve()
