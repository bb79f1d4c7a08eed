"""reasoning-gym's own graders behind our contract (posttrain/verifiers/contract.py).

    example.meta["entry"]   the task's item as reasoning-gym made it: {"question", "answer",
                            "metadata": {"source_dataset": "chain_sum", ...}}
    completion              "4 - 1 = 3, 3 - 7 = -4\\n<answer>-4</answer>"
    score(...)              {"reward": 1.0, "details": {"reason": "ok", "correct": True,
                                                        "parsed": "-4", "grader_reward": 1.0, ...}}

The answer is what the last `<answer>...</answer>` pair holds (reasoning-gym's own
convention, read by its `extract_answer`), and the task's `score_answer(answer, entry)`
grades it. Which task is named by the entry itself (`metadata.source_dataset`), so one spec
serves all of them, and a completions file saved from a run can be scored again later.

Many graders give partial credit (a number close to the answer, the right letters in the
wrong order). Under reasoning_gym/answer-tag-v1 the reward is the grader's number;
`details["correct"]` is True only for its full 1.0, and held-out pass@1 counts that
(posttrain/eval/evaluate.py::solved), with the mean reward beside it. Partial credit can
be farmed: reasoning-gym's default grader pays len(answer)/len(reply) when the reply merely
contains the answer, so "111" earns 1/3 for any answer that is 1 or 11, and a GRPO run on
chain_sum learnt to answer "-111111..." (docs/guides/your-task.md, "External tasks"). The second spec,
reasoning_gym/answer-tag-exact-v1, pays 1.0 for full credit and 0.0 otherwise, keeping the
grader's number in `details["grader_reward"]`: train on it when the partial credit is not
a step toward the answer.

The grader is someone else's code: anything it does wrong is caught here. It raising, or
returning something that is not a number in [0, 1], scores 0.0 with reason
"grader_error" and the particulars in `details["error"]`, so a bad item shows up in a
report's reason counts instead of ending a run, and a broken grader never pays. A grader
that does not return within GRADER_TIMEOUT seconds scores 0.0 with reason "grader_timeout";
it is abandoned in its daemon thread (Python cannot stop a thread) and the next call gets
a fresh one (posttrain/guards/timed_calls.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from posttrain.guards.timed_calls import CallThread, FunctionTimeout
from posttrain.types import Example
from posttrain.verifiers.contract import CONTRACT_REASONS, admit, shown

INSTALL_HINT = "pip install 'posttrain[tasks]' (or: pip install reasoning-gym)"
# seconds one score_answer call may take: the graders we tried take well under a millisecond,
# and one that hangs must cost its sample, not the run
GRADER_TIMEOUT = 5.0

REASONS: dict[str, str] = {
    "ok": "the grader gave full credit (1.0)",
    "partial": "the grader gave partial credit, between 0 and 1: not counted as solved",
    "wrong_answer": "the grader gave 0 to the answer",
    "no_answer": "the completion has no <answer>...</answer> pair",
    "grader_timeout": f"the task's own grader did not return within {GRADER_TIMEOUT:g} s: scored 0, the run goes on",
    "grader_error": "the task's own grader raised, or returned something that is not a number in [0, 1] "
    "(details['error'] says what): scored 0, the run goes on",
    "bad_entry": "meta['entry'] is missing or is not a reasoning-gym item (question, answer, "
    "metadata.source_dataset): a dataset bug, the environment builds it",
    "missing_package": f"reasoning-gym is not installed: {INSTALL_HINT}",
    **CONTRACT_REASONS,  # bad_example, not_text
}


def load_reasoning_gym():
    """The reasoning_gym module, or ImportError saying how to install it. An optional
    extra: only these tasks need it, so it is imported on first use, not at start-up."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(f"reasoning-gym tasks need the reasoning-gym package ({error}): {INSTALL_HINT}") from None
    return reasoning_gym


def answer_tag(answer: str) -> str:
    """The completion that states `answer` in the format this spec reads."""
    return f"<answer>{answer}</answer>"


class ReasoningGymAnswer:
    """reasoning_gym/answer-tag-v1: the last <answer>...</answer> of the completion, graded
    by the task's own `score_answer`; reward = its number, correct = full credit.
    reasoning_gym/answer-tag-exact-v1 (`exact=True`): reward = 1.0 for full credit, else 0.0."""

    version = "reasoning_gym/answer-tag-v1"

    def __init__(self, exact: bool = False) -> None:
        self.exact = exact  # pay only full credit: a partial reward becomes 0.0 (reason "partial" stays)
        if exact:
            self.version = "reasoning_gym/answer-tag-exact-v1"
        self._graders: dict[str, Any] = {}  # task name -> its score_answer: building one can be slow
        self._thread: CallThread | None = None  # where the grader runs, with its time limit

    def __call__(self, example: Any, completion: Any) -> dict[str, Any]:
        example, refused, error = admit(example, completion)
        if refused:
            return self._result(refused, error=error)
        problem = self.check_example(example)
        if problem:
            reason = "missing_package" if INSTALL_HINT in problem else "bad_entry"
            return self._result(reason, error=problem)
        entry = example.meta["entry"]
        task = entry["metadata"]["source_dataset"]
        parsed = load_reasoning_gym().utils.extract_answer(completion)
        if parsed is None:
            return self._result("no_answer", task=task)
        try:
            grader_reward = self._call_grader(task, parsed, entry)
        except FunctionTimeout:
            return self._result("grader_timeout", task=task, parsed=parsed,
                                error=f"{task}'s score_answer did not return within {GRADER_TIMEOUT:g} s")
        except Exception as error:  # someone else's code: its failure costs this sample, not the run
            return self._result("grader_error", task=task, parsed=parsed,
                                error=f"{task}'s score_answer raised {type(error).__name__}: {shown(error, 300)}")
        if isinstance(grader_reward, bool) or not isinstance(grader_reward, (int, float)) \
                or not math.isfinite(grader_reward) or not 0.0 <= grader_reward <= 1.0:
            return self._result("grader_error", task=task, parsed=parsed,
                                error=f"{task}'s score_answer returned {shown(grader_reward)}, not a number in [0, 1]")
        grader_reward = float(grader_reward)
        reason = "ok" if grader_reward == 1.0 else ("partial" if grader_reward > 0 else "wrong_answer")
        reward = float(reason == "ok") if self.exact else grader_reward
        return self._result(reason, reward=reward, task=task, parsed=parsed, grader_reward=grader_reward)

    def _call_grader(self, task: str, parsed: str, entry: dict) -> Any:
        """The task's score_answer(parsed, entry) in a daemon thread, FunctionTimeout after GRADER_TIMEOUT."""
        grader = self._grader(task)
        if self._thread is None or self._thread.busy:  # the first call, or the last one hung
            self._thread = CallThread()
        return self._thread.call(lambda: grader(parsed, entry), {}, GRADER_TIMEOUT)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_thread": None}  # a thread does not cross a process boundary

    def _grader(self, task: str):
        if task not in self._graders:
            self._graders[task] = load_reasoning_gym().get_score_answer_fn(task)
        return self._graders[task]

    def check_example(self, example: Example) -> str | None:
        """None when the example carries a reasoning-gym item this machine can grade."""
        entry = example.meta.get("entry")
        if not isinstance(entry, Mapping) or "answer" not in entry or not isinstance(entry.get("metadata"), Mapping):
            return (f"meta['entry'] must be a reasoning-gym item (a mapping with 'question', 'answer' and "
                    f"'metadata'), got {shown(entry, 120)}")
        task = entry["metadata"].get("source_dataset")
        try:
            known = load_reasoning_gym().factory.DATASETS
        except ImportError as error:
            return str(error)
        if task not in known:
            return f"meta['entry']['metadata']['source_dataset'] is {shown(task)}, not a reasoning-gym task name"
        return None

    def _result(self, reason: str, reward: float = 0.0, task: str | None = None, parsed: str | None = None,
                grader_reward: float | None = None, error: str | None = None) -> dict[str, Any]:
        return {"reward": reward, "details": {
            "reason": reason, "spec_version": self.version,
            "correct": reason == "ok",  # pass@1 counts this, never a partial reward
            "task": task, "parsed": parsed, "grader_reward": grader_reward, "error": error}}

    def __repr__(self) -> str:
        return f"<spec {self.version}>"


SPECS: dict[str, ReasoningGymAnswer] = {spec.version: spec for spec in (ReasoningGymAnswer(),
                                                                       ReasoningGymAnswer(exact=True))}
# the spec that pays only full credit, for each spec here that pays the grader's partial credit:
# the one flag a run names when its grader pays partial credit (--env.spec_version ...)
EXACT_SPECS: dict[str, str] = {ReasoningGymAnswer.version: ReasoningGymAnswer(exact=True).version}


def score(example: Any, completion: Any) -> dict[str, Any]:
    """Score one completion under reasoning_gym/answer-tag-v1 (the only spec here)."""
    return SPECS[ReasoningGymAnswer.version](example, completion)
