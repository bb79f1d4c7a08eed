"""The sampler against the trainer, token by token (lessons 22b and 25): sample with the
real rollout engine decoding in some precision, then score the very same tokens with the
trainer's float32 teacher-forced pass, and compare the two log-probs.

In float32 the two are the same computation done two ways (a KV-cached decode one token
at a time, against one pass over the whole sequence), and agree to float rounding, ~1e-6.
Any other kernel in the sampler (bf16 matmuls, int8 weights) makes it a different policy:
its `old_logp` is then log π_sampler, not the log π_old the update's ratio assumes.
"""

from __future__ import annotations

import copy

import torch

from posttrain.config import SamplingParams
from posttrain.models.device import place
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.logprobs import response_logp
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.engines import make_engine
from posttrain.systems.stragglers import Mismatch, logprob_mismatch
from posttrain.types import Example, RolloutBatch, Tokenizer

# how the sampler decodes: its copy's forward passes in float32, under bf16 autocast
# (models/device.py), or with int8 Linear weights (models/int8.py)
SAMPLER_PRECISIONS = ("float32", "bfloat16", "int8")


def make_run_policy(seed: int = 0) -> tuple[GPTMini, CharTokenizer]:
    """make run's gpt_mini shape (dim 128, 4 layers, ~0.8M parameters), freshly initialised:
    the mismatch is a property of the kernels, and needs no training to show."""
    torch.manual_seed(seed)
    tok = CharTokenizer()
    return GPTMini(GPTMiniConfig(vocab_size=tok.vocab_size)).eval(), tok


def sample_and_score(model: torch.nn.Module, tok: Tokenizer, examples: list[Example], samples_per_prompt: int,
                     precision: str, max_new_tokens: int = 32, seed: int = 0) -> tuple[RolloutBatch, torch.Tensor]:
    """(the sampled batch, whose old_logp the sampler captured, (B, T); the trainer's
    log-probs of the same tokens, (B, T), exactly 0 off the response). The sampler decodes
    a copy of `model` in `precision`; the trainer's pass reads `model` itself in float32."""
    if precision not in SAMPLER_PRECISIONS:
        raise ValueError(f"precision={precision!r}: expected one of {SAMPLER_PRECISIONS}")
    sampler = copy.deepcopy(model)
    if precision == "bfloat16":
        place(sampler, "cpu", "bfloat16")  # float32 weights, bf16 matmuls under autocast
    params = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens,
                            weights="int8" if precision == "int8" else "float32")
    engine = make_engine(sampler, tok, params)
    episodes = engine.generate(examples, samples_per_prompt, generator=torch.Generator().manual_seed(seed))
    batch = RolloutBatch.collate(episodes, tok.pad_id)
    with torch.no_grad():
        trainer_logp = response_logp(model, batch)  # (B, T) the trainer's forward, float32
    return batch, trainer_logp


def mismatch(batch: RolloutBatch, trainer_logp: torch.Tensor, cap: float = 2.0) -> tuple[Mismatch, float]:
    """The library's mismatch statistics over the response tokens (stragglers.logprob_mismatch),
    and the largest |log π_trainer − log π_sampler| of any one token."""
    on = batch.response_mask.bool()
    gap = (trainer_logp - batch.old_logp)[on]  # (n tokens,)
    return logprob_mismatch(batch.old_logp[on].tolist(), trainer_logp[on].tolist(), cap), gap.abs().max().item()
