"""The engine contract: what the rollout role asks of whatever samples for it.

    Engine          generate(examples, K) -> Episodes with the log-probs of every token drawn;
                    continue_rows(contexts, budgets) -> Continuations (the agent loop's turns);
                    load_weights(state) when it holds its own copy; the weight version it samples with
    EngineClass     how one is built: (policy, tokenizer, params, shares_weights) -> Engine
    Continuation    the tokens one row drew, exactly as drawn, and why it stopped
    encode_prompt   the token layout every engine samples a prompt from, and so the one SFT
                    demonstrations and preference pairs are trained on too

An engine is one file in this folder and one entry in `ENGINES` (engines/__init__.py); the
rollout role (roles/rollout.py), the evaluation loop and the search methods call nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

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
