"""Scheduling tricks of inference engines as one throughput model whose gains compose.

A rollout's time is prefill (the prompts) plus decode (the responses), and each trick acts
on one of the two terms, so their gains multiply within a term and add up by Amdahl's law
across terms: halving a term that is a tenth of the time saves a twentieth.

    continuous batching   a finished row's slot goes to the next request at once, so decode
                          pays for the mean length rather than each batch's longest (Yu et al.
                          2022, Orca): decode × mean / E[max]
    prefix caching        a prompt shared by K samples is prefilled once (RadixAttention);
                          a shared system prompt once for all: prefill × (tokens left) / (tokens)
    chunked prefill       prompts are cut into chunks that ride along decode steps, which are
                          bandwidth-bound and leave compute idle (Agrawal et al. 2024,
                          Sarathi): the prefill's time hides in decode's spare compute
    speculative decoding  a draft proposes γ tokens, the target checks them in one pass:
                          E[tokens per pass] = (1 − α^(γ+1)) / (1 − α) for acceptance rate α
                          (Leviathan et al. 2023, https://arxiv.org/abs/2211.17192), at the cost
                          of γ draft steps per pass: decode × (1 + γ·c) / E[tokens]

`apply_tricks` applies them in that order to a RolloutTime and returns each step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RolloutTime:
    """A rollout's time in its two terms, seconds."""

    prefill: float
    decode: float

    @property
    def total(self) -> float:
        return self.prefill + self.decode


def continuous_batching_factor(mean_length: float, max_length: float) -> float:
    """Decode's time after continuous batching, as a fraction of a static batch's: the
    engine keeps every slot busy, so it pays the mean length per row instead of the max."""
    if not 0 < mean_length <= max_length:
        raise ValueError(f"mean_length={mean_length}, max_length={max_length}: need 0 < mean <= max")
    return mean_length / max_length


def prefix_caching_factor(prompt_tokens: int, samples_per_prompt: int, shared_system_tokens: int = 0,
                          prompts: int = 1) -> float:
    """Prefill's time with each distinct prompt computed once, as a fraction of prefilling
    every sample's copy: (S + G·P) / (G·K·(S + P)) for G prompts of P tokens after a
    common S-token system prompt, K samples each."""
    G, K, S, P = prompts, samples_per_prompt, shared_system_tokens, prompt_tokens
    if min(G, K) < 1 or P + S < 1:
        raise ValueError(f"prompts={G}, samples_per_prompt={K}, tokens={P}+{S}: need at least one of each")
    return (S + G * P) / (G * K * (S + P))


def chunked_prefill_hidden(prefill_seconds: float, decode_seconds: float, decode_compute_fraction: float) -> float:
    """Seconds of prefill that chunked prefill hides inside decode steps: decode is busy
    computing only `decode_compute_fraction` of its time (its compute bound over its memory
    bound, roofline.Roofline), and the rest of its compute can run prefill chunks."""
    if not 0 <= decode_compute_fraction <= 1:
        raise ValueError(f"decode_compute_fraction={decode_compute_fraction}: a fraction in [0, 1]")
    return min(prefill_seconds, decode_seconds * (1 - decode_compute_fraction))


def speculative_tokens_per_pass(acceptance: float, draft_tokens: int) -> float:
    """E[tokens a target pass yields] with γ = draft_tokens drafted and each accepted with
    probability α: 1 + α + α² + ... + α^γ (the accepted run, plus the target's own token)."""
    if not 0 <= acceptance < 1 or draft_tokens < 1:
        raise ValueError(f"acceptance={acceptance}, draft_tokens={draft_tokens}: need 0 <= α < 1 and γ >= 1")
    return (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)


def speculative_decoding_factor(acceptance: float, draft_tokens: int, draft_cost: float) -> float:
    """Decode's time with speculation, as a fraction of plain decoding: each target pass
    costs 1 + γ·c (c = a draft step's cost relative to a target step, e.g. 0.05) and
    yields E[tokens per pass]. Above 1 the speculation does not pay. It assumes the
    bandwidth-bound regime (small batches), where checking γ + 1 tokens in one pass costs
    what one token does; a compute-bound batch pays for every checked token and gains little."""
    if draft_cost < 0:
        raise ValueError(f"draft_cost={draft_cost}: a draft step's cost relative to the target's, >= 0")
    return (1 + draft_tokens * draft_cost) / speculative_tokens_per_pass(acceptance, draft_tokens)


@dataclass(frozen=True)
class Tricks:
    """Which tricks apply, with their parameters (None / 0 = off)."""

    mean_length: float = 0.0  # continuous batching: the responses' mean and max length
    max_length: float = 0.0
    prompt_tokens: int = 0  # prefix caching: tokens per prompt, samples per prompt, shared system tokens
    samples_per_prompt: int = 1
    shared_system_tokens: int = 0
    prompts: int = 1
    decode_compute_fraction: float | None = None  # chunked prefill: how busy decode keeps the compute units
    acceptance: float | None = None  # speculative decoding: α, γ and the draft's relative cost
    draft_tokens: int = 4
    draft_cost: float = 0.05


@dataclass(frozen=True)
class TrickStep:
    trick: str
    time: RolloutTime

    def speedup_over(self, before: TrickStep) -> float:
        return before.time.total / self.time.total


def apply_tricks(base: RolloutTime, tricks: Tricks) -> list[TrickStep]:
    """The rollout time before and after each trick that is on, cumulatively, in the
    order continuous batching, prefix caching, chunked prefill, speculative decoding.
    Chunked prefill reads the decode time left by continuous batching; speculation
    shortens decode after the prefill has been hidden in it, so the hidden prefill
    comes back out when decode shrinks below it."""
    steps = [TrickStep("none", base)]
    prefill, decode, hidden = base.prefill, base.decode, 0.0
    if tricks.mean_length:
        decode *= continuous_batching_factor(tricks.mean_length, tricks.max_length)
        steps.append(TrickStep("continuous batching", RolloutTime(prefill, decode)))
    if tricks.prompt_tokens and tricks.samples_per_prompt > 1:
        prefill *= prefix_caching_factor(tricks.prompt_tokens, tricks.samples_per_prompt,
                                         tricks.shared_system_tokens, tricks.prompts)
        steps.append(TrickStep("prefix caching", RolloutTime(prefill, decode)))
    if tricks.decode_compute_fraction is not None:
        hidden = chunked_prefill_hidden(prefill, decode, tricks.decode_compute_fraction)
        steps.append(TrickStep("chunked prefill", RolloutTime(prefill - hidden, decode)))
    if tricks.acceptance is not None:
        decode *= speculative_decoding_factor(tricks.acceptance, tricks.draft_tokens, tricks.draft_cost)
        hidden = min(hidden, decode * (1 - (tricks.decode_compute_fraction or 0.0)))
        steps.append(TrickStep("speculative decoding", RolloutTime(prefill - hidden, decode)))
    return steps
