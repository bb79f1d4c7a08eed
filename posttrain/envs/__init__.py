"""Environments: a prompt distribution plus a scorer.

    arithmetic   generated sums with a `Final: <int>` answer (no data needed)
    jsonl        your file (JSONL, JSON, Parquet, a saved dataset), scored by any registered
                 verifier (final_int by default)
    math, code   the same with math/boxed-or-final-v2 or code/tests-v1 as the default

Every environment takes its settings as keyword arguments and offers the same methods
(`sample`, `fixed_set`, `solution`, `score`), so the registry is a plain dict and
callers never ask which environment they hold.
"""

from __future__ import annotations

import inspect
from typing import Any

from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.envs.jsonl_file import CodeEnv, JsonlEnv, MathEnv

# "math" and "code" are "jsonl" with another default verifier; all three need --env.path
ENVIRONMENTS: dict[str, type] = {"arithmetic": ArithmeticEnv, "jsonl": JsonlEnv, "math": MathEnv, "code": CodeEnv}


def make_env(name: str | type, **kwargs: Any):
    """Build the environment registered as `name`, e.g. make_env("arithmetic", level=2), or
    one of your own class (any class with the same methods), e.g. make_env(MyTask, level=2)."""
    if isinstance(name, type):
        env_class, name = name, name.__name__
    elif name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; valid names: {', '.join(ENVIRONMENTS)}")
    else:
        env_class = ENVIRONMENTS[name]
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
