"""The engine contract: what the rollout role asks of whatever samples for it.

    Engine          generate(examples, K) -> Episodes with the log-probs of every token drawn;
                    continue_rows(contexts, budgets) -> Continuations (the agent loop's turns);
                    load_weights(state) when it holds its own copy; the weight version it samples with
    EngineClass     how one is built: (policy, tokenizer, params, shares_weights) -> Engine
    Continuation    the tokens one row drew, exactly as drawn, and why it stopped
    PartialRows     rows part-way through sampling, kept between two chunks (partial rollouts);
                    ResumableEngine: an engine that can start and advance them
    encode_prompt   the token layout every engine samples a prompt from, and so the one SFT
                    demonstrations and preference pairs are trained on too

An engine is one file in this folder and one entry in `ENGINES` (engines/__init__.py); the
rollout role (roles/rollout.py), the evaluation loop and the search methods call nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, runtime_checkable

import torch

from posttrain.config import SamplingParams
from posttrain.models.policy import Policy
from posttrain.types import PROMPT_MESSAGES, Episode, Example, Tokenizer


def encode_prompt(tokenizer: Tokenizer, prompt: str, messages: list[dict[str, str]] | None = None) -> list[int]:
    """The token layout every prompt is sampled from, and so the one SFT demonstrations and
    preference pairs must be trained on too: the tokenizer's `prompt_ids`, `[bos] + prompt`
    for gpt_mini, an instruct model's chat template (models/hf.py::HFTokenizer), which
    renders `messages`, the prompt's turns when it is a conversation (types.PROMPT_MESSAGES)."""
    return tokenizer.prompt_ids(prompt, messages)


def prompt_template(tokenizer: Tokenizer) -> str:
    """How a problem's text reaches the model, with "{prompt}" where the text goes, special
    tokens shown: "<bos>{prompt}" for gpt_mini, the chat template's turns and system prompt for
    an instruct model. Run directories record it: the same weights behind another template
    (another system prompt) are measured on another task."""
    return tokenizer.decode(encode_prompt(tokenizer, "{prompt}"), skip_special_tokens=False)


def example_prompt_ids(tokenizer: Tokenizer, example: Example) -> list[int]:
    """`encode_prompt` of an Example: its conversation when it has one, else its text."""
    return encode_prompt(tokenizer, example.prompt, example.meta.get(PROMPT_MESSAGES))


# why a row stopped: its stop token (EOS, or a newline with stop_at_newline), one of the
# caller's stop strings in its text, or its token budget (then it is cut off, unfinished)
STOP_TOKEN, STOP_STRING, STOP_BUDGET = "stop_token", "stop_string", "budget"
STOP_CODES = (STOP_BUDGET, STOP_TOKEN, STOP_STRING)  # index = the code the decode loop keeps per row


@dataclass
class Continuation:
    """The tokens one row of the sampler drew, exactly as drawn."""

    token_ids: list[int]  # ends with the stop token when it stopped on one
    logp: list[float]  # log π_old of each token, captured while sampling
    text: str  # the decoded tokens, a final EOS left out
    stop: str  # STOP_TOKEN, STOP_STRING or STOP_BUDGET


class Engine(Protocol):
    """What samples for the rollout role: prompts in, completions with their log-probs out.

    The one thing an engine must get right for RL is the log-probability of every token it
    draws, *at the moment it draws it*, from the distribution it drew from (the
    temperature-scaled one): the algorithm's importance ratio π_θ / π_old divides by it.
    The update corrects for an engine whose distribution is not the trainer's
    (roles/mismatch.py): int8 weights (`params.weights`), bf16 autocast, and every engine but
    posttrain's own "torch" (mismatch.TRAINER_ENGINES), whose kernels make it another policy:
    a vLLM engine registered in ENGINES is corrected from its first step."""

    params: SamplingParams  # what a call samples with unless it passes its own
    tokenizer: Tokenizer  # the prompt layout (encode_prompt) and the text of what it drew
    max_rows: int  # sequences sampled at once: a larger call is split into batches of whole groups
    weight_version: int  # stamped on every episode: staleness = the trainer's version − this
    # True when it samples from the trainer's own module: a weight sync is then a version bump
    # (roles/weight_sync.py::SharedWeights); False when it holds a copy that load_weights refreshes
    shares_weights: bool

    @property
    def max_seq_len(self) -> int:
        """Positions the model holds: a prompt and its completion must fit in them together."""
        ...

    def generate(self, examples: list[Example], samples_per_prompt: int = 1,
                 generator: torch.Generator | None = None, params: SamplingParams | None = None) -> list[Episode]:
        """K = samples_per_prompt completions of each example, grouped by example (an
        episode's group_id is its example's index in `examples`), each with response_ids,
        response_logp (log π of each drawn token), completion text and whether it finished."""
        ...

    def continue_rows(self, contexts: list[list[int]], budgets: list[int], generator: torch.Generator | None = None,
                      params: SamplingParams | None = None, stop_strings: tuple[str, ...] = ()) -> list[Continuation]:
        """Continue each token context by at most budgets[i] tokens, stopping at EOS or a stop
        string: one model turn of a multi-turn episode (roles/agent.py)."""
        ...

    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take the trainer's weights (a state dict) into the copy this engine samples from."""
        ...

    def metrics(self) -> dict[str, float]:
        """What the engine's own work cost since the last call, for the step's log ({} for none)."""
        ...


class EngineClass(Protocol):
    """How an engine is built: around a policy and its tokenizer, with the sampling settings
    (engines/__init__.py::make_engine says what shares_weights means). An engine's class is
    one, and ENGINES maps each name to one."""

    def __call__(self, policy: Policy, tokenizer: Tokenizer, params: SamplingParams, /,
                 shares_weights: bool = False) -> Engine: ...


@dataclass
class PartialRows:
    """The K rows of each prompt, part-way through sampling: what a rollout worker keeps
    between two chunks of a partial rollout (dist.partial_rollout_tokens,
    distributed/async_rollout.py), and what a checkpoint saves of them.

    Each row keeps its tokens so far with the log-prob each was drawn with and the weight
    version that drew it, so a token's behaviour log-prob is always that of the weights that
    sampled it, whatever weights continue the row. The seeded stream's position is kept
    too, and the draw stays as wide as the whole batch, stopped rows included: the draw of
    row r's t-th token is the r-th of the t-th set of uniforms, wherever chunks begin and
    end, so a row continued under unchanged weights draws what an uninterrupted one draws."""

    prompts: list[list[int]]  # the distinct prompts; row r continues prompts[r // repeats]
    repeats: int  # K rows per prompt
    budget: int  # new tokens a row may draw in all (max_new_tokens)
    tokens: list[list[int]]  # per row, the tokens drawn so far
    logp: list[list[float]]  # per row, log π of each, taken from the weights that drew it
    versions: list[list[int]]  # per row, the weight version that drew each token
    stops: list[str | None]  # per row, why it stopped (STOP_TOKEN, STOP_BUDGET), None while it runs
    generator_state: torch.Tensor  # torch.Generator.get_state(): the next draw continues the stream

    @classmethod
    def start(cls, prompts: list[list[int]], repeats: int, budget: int, generator: torch.Generator) -> PartialRows:
        """Nothing drawn yet: the rows as a fresh `generate` call would begin them."""
        rows = len(prompts) * repeats
        return cls(prompts, repeats, budget, [[] for _ in range(rows)], [[] for _ in range(rows)],
                   [[] for _ in range(rows)], [None] * rows, generator.get_state())

    def running(self) -> list[int]:
        """The rows still sampling, in row order."""
        return [r for r, stop in enumerate(self.stops) if stop is None]

    def episodes(self, examples: list[Example], tokenizer: Tokenizer) -> list[Episode]:
        """The finished rows as `generate` returns them: grouped by example, the text without
        a final EOS; each episode stamped with the version of its first token (its oldest, so
        staleness is never understated) and every token's version kept."""
        if self.running():
            raise ValueError(f"rows {self.running()[:8]} are still sampling: advance them to the end before "
                             "taking their episodes")
        out = []
        for r, ids in enumerate(self.tokens):
            text_ids = ids[:-1] if self.stops[r] == STOP_TOKEN and ids[-1] == tokenizer.eos_id else ids
            out.append(Episode(example=examples[r // self.repeats], group_id=r // self.repeats,
                               prompt_ids=self.prompts[r // self.repeats], response_ids=list(ids),
                               response_logp=list(self.logp[r]), completion=tokenizer.decode(text_ids),
                               weight_version=self.versions[r][0], finished=self.stops[r] != STOP_BUDGET,
                               token_versions=list(self.versions[r])))
        return out


@runtime_checkable
class ResumableEngine(Engine, Protocol):
    """An engine that samples in chunks (partial rollouts): posttrain's "torch" engine. Others
    sample whole responses only, and dist.partial_rollout_tokens refuses them at config time."""

    def advance(self, partial: PartialRows, tokens: int, params: SamplingParams | None = None) -> None:
        """Continue every running row of `partial` by at most `tokens` tokens, in place, from
        this engine's weights now (stamping each new token with its weight_version)."""
        ...
