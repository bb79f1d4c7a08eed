"""The engines the rollout role can sample with: a name -> class dict, and the one factory.

    ENGINES       "torch": posttrain's own sampler (eager PyTorch, KV cache), in this process;
                  "vllm": vLLM's LLM in this process, its own copy of the weights (vllm_engine.py)
    check_engine  what an engine refuses of the sampling settings, as a ConfigError before anything loads
    make_engine   the engine `params.engine` names, around a policy and its tokenizer

Every place that samples builds its engine here, so a new engine (vLLM, a server) is one file
in this folder that follows engines/contract.py::Engine and one entry in ENGINES; every job —
RL, evaluation, preference pairs, search — can then sample with it (`--rl.sampling.engine NAME`).
"""

from __future__ import annotations

from typing import Callable

from posttrain.config import SamplingParams
from posttrain.models.policy import Policy
from posttrain.roles.engines.contract import Engine, EngineClass
from posttrain.roles.engines.torch_engine import RolloutEngine
from posttrain.roles.engines.vllm_engine import VLLMEngine, check_vllm_settings
from posttrain.types import Tokenizer

ENGINES: dict[str, EngineClass] = {
    "torch": RolloutEngine,  # eager PyTorch with a KV cache; float32, bf16 or int8 weights (params.weights)
    "vllm": VLLMEngine,  # needs the package vllm (make vllm-test); imported only when one is built
}

# the settings an engine cannot honour, refused by pipelines/checks.py before any model loads
# (an engine without an entry takes every setting SamplingParams.validate allows)
ENGINE_CHECKS: dict[str, Callable[[SamplingParams, str], None]] = {
    "vllm": check_vllm_settings,  # vllm installed; top_p 1 (its log-probs); no compile; float32 weights
}


def check_engine(params: SamplingParams, prefix: str = "rl.sampling") -> None:
    """Raise ConfigError when the engine `params.engine` names cannot sample with `params`."""
    if params.engine in ENGINE_CHECKS:
        ENGINE_CHECKS[params.engine](params, prefix)


def make_engine(policy: Policy, tokenizer: Tokenizer, params: SamplingParams, shares_weights: bool = False) -> Engine:
    """The engine registered as params.engine, sampling `policy` with `tokenizer`'s prompt layout.

    shares_weights=True: it samples from `policy` itself (the trainer's module, in this
    process), so nothing is copied and a weight sync is a version bump. False: `policy` is
    its own copy (the caller gives it one: `copy.deepcopy(policy)` to keep training the
    original), frozen, and refreshed by load_weights."""
    if params.engine not in ENGINES:
        raise ValueError(f"rl.sampling.engine={params.engine!r} is not an engine; the engines are: "
                         f"{', '.join(sorted(ENGINES))}")
    return ENGINES[params.engine](policy, tokenizer, params, shares_weights=shares_weights)


__all__ = ["ENGINES", "ENGINE_CHECKS", "Engine", "EngineClass", "RolloutEngine", "VLLMEngine", "check_engine",
           "make_engine"]
