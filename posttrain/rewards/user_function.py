"""Your own reward function as a term of the reward stack, imported by name.

`rl.reward.terms` is a sum of weighted terms (posttrain/pipelines/build.py reads it):

    reward  := term ( "+" term )*
    term    := [ weight "*" ] source          weight: a finite number, 1 if left out, or
                                              START->END@STEPS: linear from START at step 0
                                              to END at step STEPS, then END (stack.Schedule)
    source  := a preset ("accuracy", "r1",     the verifier's 1/0; accuracy + 0.2 × format;
                         "rubric", ...)        rule-based criteria (rewards/rubric.py); the agentic
                                               terms of a tool environment (rewards/agentic.py)
             | MODULE:FUNCTION                 imported like `python -m` would: the current
                                               directory first, then sys.path
             | PATH.py:FUNCTION                a file (relative to the current directory)

e.g. "accuracy + 0.5*my_rewards:brevity", "./rewards.py:correct", "accuracy + -0.1*m:f",
"accuracy + 0.5->0@100*r1" (a format bonus that fades over 100 steps)
(a negative weight is written with its sign: "-" is not an operator, paths may hold one).

The function's parameter names say which of three signatures it has:

    TRL      f(prompts, completions, **columns) -> list[float | None]
    verl     compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict
    posttrain score(example, completion) -> float | dict           (the verifier contract)

Each is called once per completion, because the scorer contract is per sample
(score_episodes calls `reward(example, completion)`): a TRL function gets lists of length 1
and returns a list of length 1. Its columns are the example's fields as lists:
`expected_answer` (and `answer`, unless meta has its own), `id`, every key of `meta`; one
without `**kwargs` gets only the columns it names (TRL's `completion_ids` and
`trainer_state` are not passed: the scorer sees text). A conversational example (its prompt
a list of turns, envs/problem_rows.py) is passed as TRL passes one: prompts[0] its turns,
completions[0] `[{"role": "assistant", "content": text}]`. verl's data_source is
meta["data_source"] or the verifier's spec version, extra_info {"prompt", "id", **meta}; a
dict result holds "score" (verl) or "reward" (ours), and the rest is kept as details. An
`async def` function is run to completion.

None means "this function does not apply to this sample": it counts 0, the sample's
details["not_applicable"] names the function, and None for a whole step's worth of samples
in a row draws a warning. A bool or an int becomes a float. Anything else stops the run
with one RewardFunctionError naming the function, the sample and what went wrong (an
exception, the timeout, a TRL list of the wrong length, a value that is not a finite
number): training on a zero in place of a reward never computed would be silent and wrong.
An exception is named with its file and line, and so are SystemExit (a sys.exit() in the
function or a library it calls), GeneratorExit and other BaseExceptions: none of them ends
the process as if posttrain had exited. A KeyboardInterrupt raised in the worker thread
(rl.reward.timeout > 0) is the function's own and fails it the same way; in the training
thread (timeout 0) it may be a Ctrl-C, so it stays an interrupt, which names the function.
The run directory stays resumable after any of them.
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
import warnings
from typing import Any, Callable, Sequence

from posttrain.config.checks import PosttrainWarning
from posttrain.rewards.function_source import described, failure, import_source, where_raised
from posttrain.rewards.stack import RewardStack, RewardTerm, Schedule, Scored
from posttrain.guards.timed_calls import CallThread, FunctionTimeout, call_here
from posttrain.types import PROMPT_MESSAGES, Example
from posttrain.verifiers.contract import shown

SIGNATURES = ("TRL: f(prompts, completions, **columns) -> list[float | None]; "
              "verl: compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float | dict; "
              "posttrain: score(example, completion) -> float | dict")
# the arguments each signature is given (TRL's also get the example's columns)
SUPPLIED = {"trl": ("prompts", "completions"), "verl": ("data_source", "solution_str", "ground_truth", "extra_info"),
            "posttrain": ("example", "completion")}


class RewardFunctionError(ValueError):
    """A user's reward function failed on a sample; the message names the function, the
    sample and what to do. A ValueError, so the command line prints it without a traceback."""


# ---------------------------------------------------------------------------------------
# rl.reward.terms -> weighted terms
# ---------------------------------------------------------------------------------------


def parse_reward(text: str, presets: dict[str, Callable[[], Sequence[tuple[float, RewardTerm]]]],
                 timeout: float = 5.0, rows_per_step: int = 0) -> list[tuple[float | Schedule, RewardTerm]]:
    """The weighted terms `text` names (grammar in the module docstring). A preset's terms
    are scaled by the weight in front of it. Raises ValueError naming the term and what to
    write; a function is imported and its signature read here, so a bad one fails before
    a run starts."""
    terms: list[tuple[float | Schedule, RewardTerm]] = []
    # "+" separates terms, except inside a number's exponent (1e+3)
    for raw in re.split(r"(?<![0-9][eE])\+", text):
        term = raw.strip()
        if not term:
            raise ValueError(f"{text!r} has an empty term; write terms joined by '+', e.g. 'accuracy + 0.5*mod:f'")
        weight: float | Schedule = 1.0
        source = term
        if "*" in term:
            written, _, source = (part.strip() for part in term.partition("*"))
            weight = parse_weight(written, term, source)
        if source in presets:
            terms += [(weight.scaled(w) if isinstance(weight, Schedule) else weight * w, preset_term)
                      for w, preset_term in presets[source]()]
        elif ":" in source:
            terms.append((weight, UserFunction.load(source, timeout, rows_per_step)))
        else:
            raise ValueError(f"term {term!r} is neither a preset ({', '.join(sorted(presets))}) nor a function: "
                             "write MODULE:FUNCTION or PATH.py:FUNCTION")
    names = [term.name for _, term in terms]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{repeated} appear more than once (a preset counts its own terms: r1 holds accuracy); "
                         "give each term once, with the weight you want")
    return terms


SCHEDULE = re.compile(r"(?P<start>[^>]+)->(?P<end>[^@]+)@(?P<steps>[0-9]+)")


def parse_weight(written: str, term: str, source: str) -> float | Schedule:
    """A term's weight: a finite number, or START->END@STEPS (a Schedule)."""
    schedule = SCHEDULE.fullmatch(written.replace(" ", ""))
    how = (f"write WEIGHT*SOURCE, e.g. 0.5*{source or 'mod:f'} (a negative weight: + -0.5*mod:f), or "
           f"START->END@STEPS*SOURCE, e.g. 1->0.2@100*{source or 'mod:f'}")
    try:
        if schedule:
            return Schedule(float(schedule["start"]), float(schedule["end"]), int(schedule["steps"]))
        weight = float(written)
    except ValueError as error:
        raise ValueError(f"term {term!r}: the weight {written!r} is not a finite number or a schedule "
                         f"({error}); {how}") from None
    if not math.isfinite(weight):
        raise ValueError(f"term {term!r}: the weight {written!r} is not a finite number; {how}")
    return weight


def signature_of(source: str, fn: Any) -> str:
    """Which of the three signatures `fn` has ("trl", "verl", "posttrain"), read from its
    parameter names; ValueError if none, or if it requires an argument its signature does
    not supply."""
    if not callable(fn):
        raise ValueError(f"term {source!r} is a {type(fn).__name__} ({shown(fn)}), not a function; "
                         f"name a function with one of these signatures: {SIGNATURES}")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as error:
        raise ValueError(f"term {source!r}: its parameters cannot be read ({error}); wrap it in a def with one of "
                         f"these signatures: {SIGNATURES}") from None
    if "completions" in params:
        kind = "trl"
    elif "solution_str" in params:
        kind = "verl"
    elif "example" in params and "completion" in params:
        kind = "posttrain"
    else:
        raise ValueError(f"term {source!r}: the parameters ({', '.join(params)}) match none of the signatures "
                         f"posttrain can call, told apart by their names: {SIGNATURES}")
    required = [name for name, p in params.items() if p.default is p.empty
                and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name not in SUPPLIED[kind]]
    if required and kind != "trl":  # a TRL function's other parameters are columns, known per example
        raise ValueError(f"term {source!r} requires {required}, which the {kind} signature does not supply "
                         f"({', '.join(SUPPLIED[kind])}); give them defaults")
    return kind


# ---------------------------------------------------------------------------------------
# The term
# ---------------------------------------------------------------------------------------


class UserFunction:
    """A reward function of the user's as a RewardTerm: `name` is its source as written
    (it keys details["components"]), `spec` adds the signature it was called with.

    Unlike the stack's other terms it holds a little state, all of it for the record: the
    last call's None and extra details (read by `record`, since score_episodes scores one
    sample at a time) and a count of Nones in a row (for the warning)."""

    def __init__(self, name: str, fn: Callable[..., Any], kind: str, timeout: float = 5.0, rows_per_step: int = 0):
        self.name, self.fn, self.kind, self.timeout, self.rows_per_step = name, fn, kind, timeout, rows_per_step
        self.params = inspect.signature(fn).parameters
        self.takes_any = any(p.kind is p.VAR_KEYWORD for p in self.params.values())  # **kwargs: every column
        self.returned_none, self.nones_in_a_row = False, 0
        self.extra: dict[str, Any] = {}  # the details the last call returned beside its value
        self.thread: CallThread | None = None  # where calls run when there is a timeout

    @classmethod
    def load(cls, source: str, timeout: float = 5.0, rows_per_step: int = 0) -> UserFunction:
        fn = import_source(source, main_thread=timeout == 0)  # with no limit on calls, none on the import
        return cls(source, fn, signature_of(source, fn), timeout, rows_per_step)

    @property
    def spec(self) -> str:
        return f"{self.name}({self.kind})"

    def __call__(self, example: Example, completion: str, scored: Scored) -> float:
        value, self.extra = self.evaluate(example, completion, scored)
        self.returned_none = value is None
        self.nones_in_a_row = self.nones_in_a_row + 1 if value is None else 0
        if self.rows_per_step and self.nones_in_a_row == self.rows_per_step:
            warnings.warn(f"reward function {self.name} returned None (does not apply) for {self.rows_per_step} "
                          "samples in a row, a whole step's worth: its term adds nothing to the reward; check that "
                          "it recognises this task's completions", PosttrainWarning, stacklevel=2)
        return 0.0 if value is None else value

    def evaluate(self, example: Example, completion: str, scored: Scored) -> tuple[float | None, dict]:
        """(the value, or None; any details the function returned beside it)."""
        kwargs = self.arguments(example, completion, scored)
        try:
            if self.timeout == 0:  # no limit: in this thread (signal-based timeouts need the main thread)
                result = call_here(self.fn, kwargs)
            else:
                if self.thread is None or self.thread.busy:  # the first call, or the last one hung
                    self.thread = CallThread()
                result = self.thread.call(self.fn, kwargs, self.timeout)
        except FunctionTimeout:
            raise self.failure(example, completion, f"did not return within rl.reward.timeout={self.timeout:g} s; "
                               "make it faster, or raise --rl.reward.timeout (0 = no limit, called in the training "
                               "thread)") from None
        except Exception as error:  # SystemExit, GeneratorExit and the like too (RaisedBaseException)
            hint = ""
            if "signal only works in main thread" in str(error):
                hint = ("; it runs in a worker thread so that rl.reward.timeout can stop waiting for it: set "
                        "--rl.reward.timeout 0 to call it in the main thread (math_verify: or pass "
                        "parsing_timeout=None, timeout_seconds=None)")
            raise self.failure(example, completion, f"raised {failure(error)}{hint}") from None
        except KeyboardInterrupt as error:  # in this thread (timeout 0): a Ctrl-C, or the function's own
            raise KeyboardInterrupt(f"while reward function {self.name} ran{where_raised(error)}") from None
        extra: dict = {}
        if self.kind == "trl":
            if not isinstance(result, (list, tuple)):
                raise self.failure(example, completion, f"returned a {type(result).__name__} ({shown(result)}); a "
                                   "TRL-style function returns a list with one value per completion (here [x])")
            if len(result) != 1:
                raise self.failure(example, completion, f"returned {len(result)} values for 1 completion "
                                   f"({shown(result)}); it is called once per completion, return a list of one")
            result = result[0]
        elif isinstance(result, dict):
            key = "score" if self.kind == "verl" else "reward"
            if key not in result:
                raise self.failure(example, completion, f"returned a dict without {key!r} (keys {sorted(result)}); "
                                   f"a {self.kind} function's dict holds the value under {key!r}")
            if self.kind == "verl":
                extra = {k: v for k, v in result.items() if k != "score"}
            else:
                extra = dict(result.get("details") or {})
            result = result[key]
        return self.number(example, completion, result), extra

    def arguments(self, example: Example, completion: str, scored: Scored) -> dict[str, Any]:
        meta = dict(example.meta)
        if self.kind == "trl":
            turns = meta.pop(PROMPT_MESSAGES, None)
            columns = {k: v for k, v in meta.items() if k not in ("prompts", "completions")}
            columns.setdefault("answer", example.expected_answer)
            columns.update(expected_answer=example.expected_answer, id=example.id)
            # a conversational example as TRL passes one: its prompt's turns, and the completion as
            # one assistant turn; a text prompt as text
            prompt, answer = (turns, [{"role": "assistant", "content": completion}]) if turns else \
                (example.prompt, completion)
            given: dict[str, Any] = {"prompts": [prompt], "completions": [answer],
                                     **{k: [v] for k, v in columns.items()}}
        elif self.kind == "verl":
            source = meta.get("data_source") or scored.get("details", {}).get("spec_version", "")
            given = {"data_source": source, "solution_str": completion, "ground_truth": example.expected_answer,
                     "extra_info": {"prompt": example.prompt, "id": example.id, **meta}}
        else:
            given = {"example": example, "completion": completion}
        if self.takes_any:
            return given
        missing = [n for n, p in self.params.items() if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD,
                   p.KEYWORD_ONLY) and n not in given]
        if missing:
            raise self.failure(example, completion, f"needs the column(s) {missing}, which this example does not "
                               f"have (it has {sorted(given)}); give them defaults or take **kwargs")
        return {n: v for n, v in given.items() if n in self.params}

    def number(self, example: Example, completion: str, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, numbers.Real):  # bool and int too: True -> 1.0
            try:
                number = float(value)
            except (OverflowError, TypeError, ValueError) as error:  # 10**400; a Real whose __float__ fails
                what = f"returned a {type(value).__name__} that does not convert to a float ({described(error)}): " \
                       f"{shown(value, 40)}"
            else:
                if math.isfinite(number):
                    return number
                what = f"returned {number}"
        else:
            what = f"returned a {type(value).__name__} ({shown(value)})"
        raise self.failure(example, completion, f"{what}; return a finite number (or None when it does not apply "
                           "to the sample)")

    def failure(self, example: Example, completion: str, what: str) -> RewardFunctionError:
        return RewardFunctionError(
            f"reward function {self.name} ({self.kind} signature) {what}\n"
            f"  on the prompt {shown(example.prompt, 100)}\n"
            f"  and the completion {shown(completion, 100)}\n"
            "The run stops rather than train on a reward that was never computed: fix the function, then continue "
            "the run from its last checkpoint with --resume")

    def record(self, details: dict[str, Any]) -> None:
        """Add the last call's None and extra details to a sample's details."""
        if self.returned_none:
            details.setdefault("not_applicable", []).append(self.name)
        if self.extra:
            details.setdefault("function_details", {})[self.name] = self.extra

    def __repr__(self) -> str:
        return f"<UserFunction {self.spec}>"


def stack_scorer(stack: RewardStack, scorer: Callable[[Example, str], Scored]) -> Callable[[Example, str], Scored]:
    """stack.wrap(scorer), with each user function's None and extra details recorded."""
    wrapped = stack.wrap(scorer)
    functions = [term for _, term in stack.terms if isinstance(term, UserFunction)]
    if not functions:
        return wrapped

    def score(example: Example, completion: str) -> Scored:
        result = wrapped(example, completion)
        for function in functions:
            function.record(result["details"])
        return result

    score.version = wrapped.version  # type: ignore[attr-defined]
    return score


class StackOnVerdict:
    """`stack` on a verdict already given: (example, completion, scored) -> {reward, details},
    each user function's None and extra details recorded as stack_scorer records them. What
    the agent loop applies to a finished multi-turn episode (roles/agent.py::EpisodeReward),
    whose verdict its environment gave along the way. A class, not a closure: the loop is
    pickled to rollout workers."""

    def __init__(self, stack: RewardStack) -> None:
        self.stack = stack
        self.version = stack.version
        self.functions = [term for _, term in stack.terms if isinstance(term, UserFunction)]

    def __call__(self, example: Example, completion: str, scored: Scored) -> Scored:
        result = self.stack(example, completion, scored)
        for function in self.functions:
            function.record(result["details"])
        return result
