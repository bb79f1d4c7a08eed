"""The engines the rollout role can sample with: a name -> class dict, and the one factory.

    ENGINES       "torch": posttrain's own sampler (eager PyTorch, KV cache), in this process
    make_engine   the engine `params.engine` names, around a policy and its tokenizer

Every place that samples builds its engine here, so a new engine (vLLM, a server) is one file
in this folder that follows engines/contract.py::Engine and one entry in ENGINES; every job —
RL, evaluation, preference pairs, search — can then sample with it (`--rl.sampling.engine NAME`).
"""

from __future__ import annotations

from posttrain.config import SamplingParams
from posttrain.models.policy import Policy
from posttrain.roles.engines.contract import Engine, EngineClass
from posttrain.roles.engines.torch_engine import RolloutEngine
from posttrain.types import Tokenizer

ENGINES: dict[str, EngineClass] = {
    "torch": RolloutEngine,  # eager PyTorch with a KV cache; float32, bf16 or int8 weights (params.weights)
}


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


__all__ = ["ENGINES", "Engine", "EngineClass", "RolloutEngine", "make_engine"]
