"""posttrain's own engine: eager PyTorch with a KV cache, sampling in the trainer's process.

The one thing this engine must get right for RL is `old_logp`: the log-probability the
sampling distribution gave each token *at the moment it was sampled*. The algorithm's
importance ratio π_θ / π_old divides by it, so it is captured here, from the same logits
that chose the token, rather than recomputed later by a model that may have moved on.

Sampling is batched with a KV cache: one forward pass over the distinct (left-padded)
prompts fills the cache, which is then copied out to each prompt's K rows, and one
single-token forward pass per generated position follows. A row that
stops is dropped from the batch (and from the cache), so the forward passes only ever
compute rows still running; with RL's short, ragged answers most of the decode work of a
fixed-size batch would otherwise be spent on rows that are already done.

The model supplies its own cache (`model.new_cache`) and the tokenizer the prompt layout
(`encode_prompt`), so the same code samples from gpt_mini and from any transformers model.

`continue_rows` runs the same decode loop on arbitrary token contexts, one row each, with
a budget per row and stop strings: the multi-turn agent loop (roles/agent.py) continues
each episode's prompt and turns so far with it, one model turn per call. `advance` runs it
on the rows of a partial rollout (contract.py::PartialRows), a chunk of tokens at a time,
re-reading each row's prompt and tokens so far from the weights it holds now.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping

import torch
import torch.nn.functional as F

from posttrain.config import SamplingParams
from posttrain.models.device import autocast, model_device
from posttrain.models.int8 import Int8Sampler
from posttrain.models.policy import Policy
from posttrain.roles.engines.contract import (
    STOP_BUDGET,
    STOP_CODES,
    STOP_STRING,
    STOP_TOKEN,
    Continuation,
    PartialRows,
    example_prompt_ids,
)
from posttrain.types import Episode, Example, Tokenizer


def sample_next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Choose one token per row; return (token (N,), its log-prob (N,)).

    The log-prob is that of the temperature-scaled distribution, before top-p truncation:
    the trainer recomputes exactly this quantity, so the ratio is 1 before any update.

    The draw is inverse-CDF sampling: one uniform u per row, and the first token whose
    cumulative probability exceeds u × (the row's total). `torch.multinomial` draws an
    exponential for every vocabulary entry instead (49,152 per row per token for SmolLM2),
    18% of SmolLM2's decode time at 64 rows (BENCHMARKS.md). The N uniforms are drawn at once, one
    per row, so a row's token depends only on the generator's state and its own logits:
    the caller relies on this to keep a row's draws independent of when the others stop.
    """
    # .float(): under --dtype bfloat16 the logits arrive in bf16 (3 significant digits); the
    # log-softmax, old_logp and the CDF below are computed from their float32 upcast
    if params.temperature == 0:
        logp = F.log_softmax(logits.float(), dim=-1)  # (N, V)
        token = logp.argmax(dim=-1)  # (N,)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)
    logp = F.log_softmax(logits.float() / params.temperature, dim=-1)  # (N, V)
    probs = logp.exp()  # (N, V)
    vocab_order = None
    if params.top_p < 1.0:
        # keep the smallest set of tokens whose probability mass reaches top_p; the draw
        # below runs over the sorted order (same distribution), so nothing is scattered back
        probs, vocab_order = probs.sort(dim=-1, descending=True)  # (N, V), (N, V)
        mass_before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(mass_before >= params.top_p, 0.0)
    # float64 for u and the cumulative sum, measured at V = 49,152 (benchmarks/sampling_draw.py):
    # a float32 CDF stores each entry rounded to ~6e-8, which moves a token's share by up to
    # 1.5e-7 and the whole draw a total-variation distance of 3e-4 from `probs` (a running
    # sum kept in float32 moves one token by up to 6e-5); and a float32 u lies on a grid of
    # 2^-24, so a token less likely than 6e-8 is drawn with probability 0 or 6e-8. In
    # float64 both errors are below 1e-12, for about 2 ms more a call at 64 rows (3.6 against 1.8).
    # (Apple's MPS has no float64: there the draw stays float32, 3e-4 from `probs`.)
    wide = torch.float32 if probs.device.type == "mps" else torch.float64
    # u is drawn where the generator lives (the seeded ones are CPU generators, seeds.py) and then
    # moved: N numbers, and the same seed draws the same u, so the same tokens, on every device
    where = generator.device if generator is not None else probs.device
    u = torch.rand(probs.shape[0], dtype=wide, device=where, generator=generator).to(probs.device)  # (N,)
    # summed in place: cumsum(dtype=float64) allocates a second (N, V) float64 buffer, and
    # fresh buffers that size page-fault (measured at 64 rows: 17 ms, against 3 ms in place)
    cdf = probs.to(wide).cumsum_(dim=-1)  # (N, V)
    total = cdf[:, -1:].contiguous()  # (N, 1): ≈ 1 without top-p, the nucleus mass with it
    if not torch.isfinite(total).all():  # a NaN would otherwise choose a token silently
        bad = (~torch.isfinite(total)).squeeze(-1).nonzero().squeeze(-1).tolist()
        raise ValueError(f"logit rows {bad[:8]} give no probability distribution (a NaN or +inf logit, "
                         f"or every logit -inf): check the model's output for these rows")
    # right=True: the first index whose cumulative mass *exceeds* u × total. A token of
    # probability 0 (cut by top-p, or exp underflow) leaves the running sum exactly where
    # the token before it left it (x + 0 = x), so whenever its entry exceeds u × total so
    # does an earlier one, and the search stops there; at u = 0 the search skips every
    # leading zero. (This relies on a cumsum that adds along the row, as torch's CPU kernel
    # does; a tree-shaped scan could leave a zero-probability token a one-ulp sliver.)
    index = torch.searchsorted(cdf, u[:, None] * total, right=True)  # (N, 1), in [0, V]
    # u < 1, but if u × total rounded up to total nothing would exceed it and the search
    # would return V, one past the end. The token that owns the top of the CDF is the
    # first to reach total: the last one with positive probability (clamping to V - 1
    # could pick a token of probability 0).
    index = torch.minimum(index, torch.searchsorted(cdf, total))  # (N, 1)
    token = (index if vocab_order is None else vocab_order.gather(-1, index)).squeeze(-1)  # (N,)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)



class RolloutEngine:
    """A policy and a tokenizer; turns Examples into Episodes (the `Engine` of
    engines/contract.py, registered as "torch").

    By default the engine owns its model (a copy, kept fresh by roles/weight_sync.py) and
    freezes it. With `shares_weights=True` the model is the trainer's own module: nothing
    is frozen or copied, and sampling only switches it to eval mode for the duration. In
    one process that saves a whole copy of the weights (540 MB for SmolLM2-135M) and makes
    weight sync free; an engine in another process always owns its copy.

    With `params.weights == "int8"` the engine decodes with an int8 copy of the model
    (models/int8.py), quantised again whenever its weight version changes: every weight
    sync bumps the version, both after an optimizer step on a shared module and after a
    load_state_dict into an owned copy. `old_logp` is then log π_int8, not the trainer's
    log π_old, and the update has to correct for it (roles/off_policy.py).
    """

    max_rows = 512  # sequences decoded at once: generate splits a larger call (an instance may set its own)

    def __init__(self, model: Policy, tokenizer: Tokenizer, params: SamplingParams, shares_weights: bool = False):
        self.model = model if shares_weights else model.eval().requires_grad_(False)
        self.shares_weights = shares_weights
        self.tokenizer = tokenizer
        self.params = params
        self.weight_version = 0
        self._compiled_decode: Callable[..., torch.Tensor] | None = None  # made on first use when params.compile
        self._int8: Int8Sampler | None = None  # made on first int8 sampling call
        self._int8_version: int | None = None  # the weight version it was quantised from
        self.requantize_seconds = 0.0  # the last re-quantisation's cost, for the step's metrics

    @property
    def max_seq_len(self) -> int:
        return self.model.config.max_seq_len

    @torch.no_grad()
    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy the trainer's weights into the model this engine owns (the caller bumps
        weight_version, which makes an int8 copy quantise again before its next draw)."""
        self.model.load_state_dict(state)

    def metrics(self) -> dict[str, float]:
        """The last re-quantisation's cost under int8 weights; nothing otherwise."""
        return {} if self.params.weights == "float32" else {f"{self.params.weights}/requantize_seconds":
                                                              self.requantize_seconds}

    def decoding_model(self, params: SamplingParams) -> Policy:
        """The module that decodes under `params`: the model, or its int8 copy quantised
        from the weights of the current version."""
        if params.weights == "float32":
            return self.model
        if self._int8 is None:
            self._int8 = Int8Sampler(self.model)
        elif self._int8_version != self.weight_version:
            start = time.perf_counter()
            self._int8.refresh()
            self.requantize_seconds = time.perf_counter() - start
        self._int8_version = self.weight_version
        return self._int8.module

    def _decode_step(self, params: SamplingParams, model: Policy) -> Callable[..., torch.Tensor]:
        """The module that runs one-token decode steps: `model`, or the model's compiled form.
        The compiled form reads the same parameters (they are graph inputs, not constants),
        so it samples from the weights as they are after every optimizer step."""
        if not params.compile:  # (SamplingParams refuses compile with int8 weights)
            return model
        if self._compiled_decode is None:
            self._compiled_decode = torch.compile(self.model, dynamic=True)
        return self._compiled_decode

    @torch.no_grad()
    def generate(
        self,
        examples: list[Example],
        samples_per_prompt: int = 1,
        generator: torch.Generator | None = None,
        params: SamplingParams | None = None,
    ) -> list[Episode]:
        """K = samples_per_prompt completions for each example, grouped by example (episode
        group_id = the example's index in `examples`).

        At most `max_rows` sequences decode at once: the KV cache and logits grow with the
        row count (3,200 prompts × 8 samples in one batch took a gpt_mini run past 7 GB), while
        a few hundred rows already keep the matrix multiplies busy. A call within the limit is
        one batch, so its samples do not depend on the limit."""
        was_training = self.model.training
        self.model.eval()
        per_batch = max(1, self.max_rows // samples_per_prompt)  # whole groups: a group is never split
        episodes = []
        try:
            for first in range(0, len(examples), per_batch):
                episodes += self._generate(examples[first : first + per_batch], samples_per_prompt, generator,
                                           params or self.params, first_group=first)
            return episodes
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def continue_rows(
        self,
        contexts: list[list[int]],
        budgets: list[int],
        generator: torch.Generator | None = None,
        params: SamplingParams | None = None,
        stop_strings: tuple[str, ...] = (),
    ) -> list[Continuation]:
        """Continue each token context (one row each: a prompt and the turns so far of a
        multi-turn episode, roles/agent.py) by at most `budgets[i]` tokens, in one batch.

        A row stops at a stop token (EOS; a newline with params.stop_at_newline), at the
        first of `stop_strings` in the decoded text of its new tokens, or at its budget. The
        text is checked rather than the ids because a subword tokenizer may write a closing
        tag such as "</tool_call>" in several different splits; the ids stay as drawn,
        never re-tokenised. Same sampler, same decode loop as `generate` (`_sample_rows`)."""
        if len(budgets) != len(contexts):
            raise ValueError(f"continue_rows got {len(contexts)} contexts but {len(budgets)} budgets: give one each")
        if contexts and (min(budgets) < 1 or min(len(c) for c in contexts) < 1):
            raise ValueError(f"every context needs at least one token and every budget at least 1 (got budgets "
                             f"{sorted(set(budgets))[:4]}...): leave finished rows out instead of passing budget 0")
        was_training = self.model.training
        self.model.eval()
        rows = []
        try:
            for first in range(0, len(contexts), self.max_rows):
                rows += self._sample_rows(contexts[first : first + self.max_rows], 1,
                                          budgets[first : first + self.max_rows], generator, params or self.params,
                                          stop_strings)
            return rows
        finally:
            self.model.train(was_training)

    @torch.no_grad()
    def advance(self, partial: PartialRows, tokens: int, params: SamplingParams | None = None) -> None:
        """Continue every running row of `partial` by at most `tokens` tokens, from the weights
        this engine holds now (contract.py::ResumableEngine).

        Each running row's prompt and tokens so far are prefilled afresh: the weights may have
        changed since the last chunk, and keys and values from the old ones would mix two
        policies inside one forward pass. Under unchanged weights the prefill reproduces the
        cached decode's logits up to float rounding, so the tokens are those of one `generate`
        call and the log-probs agree to ~1e-6 (tests/test_partial_rollouts.py)."""
        rows = len(partial.tokens)
        if rows > self.max_rows:  # generate would cut them into batches, each with its own stretch of the stream
            raise ValueError(f"a partial rollout of {rows} rows is more than this engine decodes at once "
                             f"(max_rows={self.max_rows}): use more dist.rollout_shards, or fewer prompts per step")
        running = partial.running()
        if not running or tokens < 1:
            return
        was_training = self.model.training
        self.model.eval()
        generator = torch.Generator()
        generator.set_state(partial.generator_state)
        K = partial.repeats
        try:
            drawn = self._sample_rows([partial.prompts[r // K] + partial.tokens[r] for r in running], 1,
                                      [min(tokens, partial.budget - len(partial.tokens[r])) for r in running],
                                      generator, params or self.params, draw_slots=running, draw_width=rows)
        finally:
            self.model.train(was_training)
        partial.generator_state = generator.get_state()
        for r, row in zip(running, drawn):
            partial.tokens[r] += row.token_ids
            partial.logp[r] += row.logp
            partial.versions[r] += [self.weight_version] * len(row.token_ids)
            if row.stop != STOP_BUDGET or len(partial.tokens[r]) >= partial.budget:
                partial.stops[r] = row.stop  # a chunk's end is not the row's budget unless the budget is spent

    def _generate(self, examples: list[Example], samples_per_prompt: int, generator: torch.Generator | None,
                  params: SamplingParams, first_group: int = 0) -> list[Episode]:
        K = samples_per_prompt
        distinct_prompts = [example_prompt_ids(self.tokenizer, ex) for ex in examples]
        rows = self._sample_rows(distinct_prompts, K, [params.max_new_tokens] * (len(examples) * K), generator, params)
        return [Episode(example=examples[i // K], group_id=first_group + i // K, prompt_ids=distinct_prompts[i // K],
                        response_ids=row.token_ids, response_logp=row.logp, completion=row.text,
                        weight_version=self.weight_version, finished=row.stop != STOP_BUDGET)
                for i, row in enumerate(rows)]

    def _sample_rows(self, contexts: list[list[int]], repeats: int, budgets: list[int],
                     generator: torch.Generator | None, params: SamplingParams,
                     stop_strings: tuple[str, ...] = (), draw_slots: list[int] | None = None,
                     draw_width: int | None = None) -> list[Continuation]:
        """The decode loop `generate`, `continue_rows` and `advance` share: row i continues
        contexts[i // repeats] by at most budgets[i] tokens. Each position draws `draw_width`
        uniforms and row i takes the draw_slots[i]-th (default: one each, in row order):
        `advance` keeps a partial batch's stopped rows in the draw, so the others' uniforms stay put."""
        tok = self.tokenizer
        K = repeats
        prompts = [p for p in contexts for _ in range(K)]  # row i continues context i // K
        N, P = len(prompts), max(len(p) for p in prompts)
        longest = max(budgets)
        max_len = P + longest  # columns of the left-padded batch (and its KV cache)
        # Positions come from the attention mask (default_position_ids), so what must fit the
        # model is each row's own prompt + budget, not the batch's columns: a long multi-turn
        # context with a short budget may share a batch with a short one given a long budget.
        worst = max(range(N), key=lambda i: len(prompts[i]) + budgets[i])
        if len(prompts[worst]) + budgets[worst] > self.model.config.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompts[worst])} tokens) + max_new_tokens ({budgets[worst]}) = "
                f"{len(prompts[worst]) + budgets[worst]} exceeds the model's "
                f"max_seq_len={self.model.config.max_seq_len}: lower max_new_tokens or raise model.max_seq_len"
            )

        # left-pad so every prompt ends at the same column and decoding is one column per step;
        # assembled on the CPU from the lists, then moved once to the policy's device
        cpu, device = torch.device("cpu"), model_device(self.model)
        input_ids = torch.full((N, P), tok.pad_id, dtype=torch.long, device=cpu)
        attention_mask = torch.zeros(N, max_len, device=cpu)
        for i, p in enumerate(prompts):
            input_ids[i, P - len(p) :] = torch.tensor(p, device=cpu)
            attention_mask[i, P - len(p) : P] = 1.0
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)

        stop_ids = torch.tensor([tok.eos_id] + ([tok.encode("\n")[-1]] if params.stop_at_newline else []),
                                device=device)
        # prefill each distinct prompt once, then copy its cache out to the group's K rows:
        # the K prompts of a group are the same tokens, and their keys and values would be too
        model = self.decoding_model(params)  # the float policy, or its int8 copy
        cache = self.model.new_cache(len(contexts), max_len)  # float32 keys and values either way
        with autocast(self.model):  # the policy's precision; sample_next_token reads the logits in float32
            hidden = model.hidden_states(input_ids[::K], attention_mask=attention_mask[::K, :P], kv_cache=cache)
            logits = model.lm_head(hidden[:, -1])  # (G, V): only the last position's are needed
        if K > 1:
            cache.batch_select_indices(torch.arange(len(contexts), device=device).repeat_interleave(K))  # (N rows)
            logits = logits.repeat_interleave(K, dim=0)  # (N, V)

        tokens = torch.full((N, longest), tok.pad_id, dtype=torch.long, device=device)
        logps = torch.zeros(N, longest, device=device)
        budget = torch.tensor(budgets, dtype=torch.long, device=device)  # (N,)
        lengths = budget.clone()  # a row that never stops runs to its budget
        stop = torch.full((N,), STOP_CODES.index(STOP_BUDGET), dtype=torch.long, device=device)
        active = torch.arange(N, device=device)  # the rows still running, in the order the cache holds them
        slot = torch.arange(N, device=device) if draw_slots is None else torch.tensor(draw_slots, device=device)
        all_logits = torch.zeros(draw_width or N, logits.shape[-1], device=device)
        decode = self._decode_step(params, model)
        for t in range(longest):
            # Draw for all N rows (finished ones from dummy logits) so that a row's random
            # stream does not depend on when the other rows stopped.
            all_logits[slot[active]] = logits.float()
            token, logp = sample_next_token(all_logits, params, generator)  # (width,), (width,)
            token, logp = token[slot[active]], logp[slot[active]]  # (n,)
            tokens[active, t], logps[active, t] = token, logp
            stopped = torch.isin(token, stop_ids)  # (n,)
            stop[active[stopped]] = STOP_CODES.index(STOP_TOKEN)
            if stop_strings:
                by_text = self._stop_string_rows(tokens, active, ~stopped, t, stop_strings)  # (n,)
                stop[active[by_text]] = STOP_CODES.index(STOP_STRING)
                stopped |= by_text
            lengths[active[stopped]] = t + 1  # the stop token is part of the response
            ended = stopped | (budget[active] <= t + 1)  # (n,)
            if ended.all() or t == longest - 1:
                break
            if ended.any():  # drop finished rows from the batch and the cache
                keep = (~ended).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                active, token, attention_mask = active[keep], token[keep], attention_mask[keep]
            attention_mask[:, P + t] = 1.0
            with autocast(self.model):
                logits = decode(token[:, None], attention_mask=attention_mask[:, : P + t + 1], kv_cache=cache)[:, -1]

        # back to the CPU once, not one small copy per row below
        tokens, logps, lengths, stop = tokens.cpu(), logps.cpu(), lengths.cpu(), stop.cpu()
        rows = []
        for i in range(N):
            n = int(lengths[i])
            response = tokens[i, :n].tolist()
            reason = STOP_CODES[int(stop[i])]
            text_ids = response[:-1] if reason == STOP_TOKEN and response[-1] == tok.eos_id else response
            rows.append(Continuation(response, logps[i, :n].tolist(), tok.decode(text_ids), reason))
        return rows

    def _stop_string_rows(self, tokens: torch.Tensor, active: torch.Tensor, candidates: torch.Tensor, t: int,
                          stop_strings: tuple[str, ...]) -> torch.Tensor:
        """(n,) bool: the running rows (among `candidates`) whose new tokens, decoded, now
        hold one of `stop_strings`. The whole new text is decoded each time, not the last
        token alone: a tag can close across a token boundary."""
        found = torch.zeros_like(candidates)
        for j in candidates.nonzero().squeeze(1).tolist():
            text = self.tokenizer.decode(tokens[int(active[j]), : t + 1].tolist())
            found[j] = any(s in text for s in stop_strings)
        return found
