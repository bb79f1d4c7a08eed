"""Environments: a prompt distribution plus a scorer.

    arithmetic   generated sums with a `Final: <int>` answer (no data needed)
    jsonl        your file (JSONL, JSON, Parquet, a saved dataset), scored by any registered
                 verifier (final_int by default)
    math, code   the same with math/boxed-or-final-v2 or code/tests-v2 as the default
    gsm8k        GSM8K's own file ({question, answer} with `#### <int>`), scored by gsm8k/hash-v1
    reasoning_gym:NAME   any reasoning-gym task, graded by its own score_answer (pip install 'posttrain[tasks]')
    humaneval    the 164 HumanEval problems, all held out, their tests run in our sandbox (same extra)
    arithmetic_think the arithmetic task with a /think or /no_think switch in the prompt
                 (Qwen3's thinking-mode fusion): <think>steps</think> then the answer, or the answer
    tool_arithmetic  3-digit products with a calculator tool: a multi-turn task (reset/step,
                 envs/tool_env.py) for the agent loop
    search_qa    questions about invented towns: a search tool over a bundled corpus (BM25), then a
                 calculator; the web archetype of tool use, offline (envs/search_qa.py)

Every environment takes its settings as keyword arguments and offers the same methods
(`sample`, `fixed_set`, `solution`, `score`), so the registry is a plain dict and
callers never ask which environment they hold.
"""

from __future__ import annotations

import inspect
from typing import Any

from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.envs.gsm8k import Gsm8kEnv
from posttrain.envs.humaneval import HumanEvalEnv
from posttrain.envs.jsonl_file import CodeEnv, JsonlEnv, MathEnv
from posttrain.envs.reasoning_gym_tasks import ReasoningGymEnv
from posttrain.envs.search_qa import SearchQAEnv
from posttrain.envs.thinking_modes import ThinkingModesEnv
from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.types import Environment

# "math", "code" and "gsm8k" are "jsonl" with another default verifier (gsm8k: and GSM8K's
# columns); all four need --env.path
ENVIRONMENTS: dict[str, type] = {"arithmetic": ArithmeticEnv, "jsonl": JsonlEnv, "math": MathEnv, "code": CodeEnv,
                                 "gsm8k": Gsm8kEnv,
                                 "reasoning_gym": ReasoningGymEnv, "humaneval": HumanEvalEnv,
                                 "tool_arithmetic": ToolArithmeticEnv, "arithmetic_think": ThinkingModesEnv,
                                 "search_qa": SearchQAEnv}


def env_family(name: str) -> str:
    """The registry key of an environment name: "reasoning_gym:chain_sum" -> "reasoning_gym"."""
    return name.partition(":")[0]


def make_env(name: str | type, **kwargs: Any) -> Environment:
    """Build the environment registered as `name`, e.g. make_env("arithmetic", level=2), or
    one of your own class (any class with the same methods), e.g. make_env(MyTask, level=2).
    A name "family:task" passes the task as the `task` argument of a family that takes
    one: make_env("reasoning_gym:chain_sum") is make_env("reasoning_gym", task="chain_sum")."""
    if isinstance(name, type):
        env_class, name = name, name.__name__
    else:
        family, colon, task = name.partition(":")
        if family not in ENVIRONMENTS:
            raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(ENVIRONMENTS)} "
                             "(reasoning_gym as reasoning_gym:TASK)")
        env_class = ENVIRONMENTS[family]
        if colon:
            if "task" not in inspect.signature(env_class).parameters:
                raise ValueError(f"environment {family!r} takes no task: write --env.name {family}, without ':{task}'")
            if "task" in kwargs:
                raise ValueError(f"environment {name!r} names its task twice ({task!r} and task={kwargs['task']!r})")
            kwargs = {"task": task, **kwargs}
    signature = inspect.signature(env_class)
    parameters = [p for p in signature.parameters if p != "self"]
    # a class declared with **kwargs takes any setting: it says itself which it refuses
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    unknown = [] if takes_any else sorted(set(kwargs) - set(parameters))
    if unknown:
        raise ValueError(
            f"environment {name!r} has no parameter(s) {unknown}; "
            f"valid parameters: {', '.join(parameters)}"
        )
    return env_class(**kwargs)
