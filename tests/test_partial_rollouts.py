"""Partial rollouts (dist.partial_rollout_tokens): rows sampled a chunk at a time, continued
under whatever weights the engine holds when the next chunk starts.

    engine      a row interrupted at any chunk boundary and continued under the same weights
                draws the tokens of one uninterrupted `generate` call, log-probs to float
                rounding; under new weights the continued tokens carry the new weights'
                log-probs and version, the earlier ones keep theirs
    staleness   per-token staleness, and the episodes staler than the bound dropped
    async run   on 2 Ray workers: pushes land between chunks, per token versions, exact resume
"""

import copy

import pytest
import torch

from posttrain.config import ConfigError, DistConfig, SamplingParams
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import STOP_BUDGET, PartialRows, ResumableEngine, example_prompt_ids
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, Example, RolloutBatch

TOK = CharTokenizer()
BUDGET = 20
K = 4


def tiny_model(seed: int = 0) -> GPTMini:
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=64))


def examples() -> list[Example]:
    # prompts of different lengths (left padding), and at temperature 2 with a newline as a stop
    # token the rows stop at different positions: some within a chunk, some run to the budget
    return [Example("Q: 1+2\n", "3", "a"), Example("Q: 10+20+30\n", "60", "b"), Example("Q: 7\n", "7", "c")]


PARAMS = SamplingParams(max_new_tokens=BUDGET, temperature=2.0, stop_at_newline=True)


def start(seed: int = 5) -> PartialRows:
    return PartialRows.start([example_prompt_ids(TOK, e) for e in examples()], K, BUDGET,
                             torch.Generator().manual_seed(seed))


def in_chunks(engine: RolloutEngine, chunk: int, seed: int = 5) -> list[Episode]:
    partial = start(seed)
    while partial.running():
        engine.advance(partial, chunk)
    return partial.episodes(examples(), TOK)


def test_the_torch_engine_can_resume_rows():
    assert isinstance(RolloutEngine(tiny_model(), TOK, PARAMS), ResumableEngine)


@pytest.mark.parametrize("chunk", [1, 3, 7, BUDGET])
def test_interrupted_rows_draw_what_an_uninterrupted_call_draws(chunk):
    """The test issue #41 names: interrupted and resumed at every chunk boundary under
    unchanged weights, the same tokens, text and stops, the same log-probs to float rounding."""
    engine = RolloutEngine(tiny_model(), TOK, PARAMS)
    whole = engine.generate(examples(), K, torch.Generator().manual_seed(5))
    parts = in_chunks(engine, chunk)
    lengths = [len(e.response_ids) for e in whole]
    assert min(lengths) < chunk + 2 or chunk == 1  # rows stop inside chunks, not only at their ends
    assert lengths == [20, 20, 20, 20, 13, 18, 15, 20, 20, 20, 4, 20]  # ragged: stopped rows stay in the draw
    assert [e.response_ids for e in parts] == [e.response_ids for e in whole]
    assert [(e.completion, e.finished, e.group_id) for e in parts] == [(e.completion, e.finished, e.group_id)
                                                                      for e in whole]
    for a, b in zip(parts, whole):
        torch.testing.assert_close(torch.tensor(a.response_logp), torch.tensor(b.response_logp), atol=2e-6, rtol=0)
    assert all(e.token_versions == [0] * len(e.response_ids) and e.weight_version == 0 for e in parts)


def test_where_the_interruption_falls_does_not_move_a_draw():
    """Chunks of 3 and of 7 cut the rows at different places; they draw the same tokens."""
    engine = RolloutEngine(tiny_model(), TOK, PARAMS)
    assert [e.response_ids for e in in_chunks(engine, 3)] == [e.response_ids for e in in_chunks(engine, 7)]
    assert [e.response_ids for e in in_chunks(engine, 3, seed=6)] != [e.response_ids for e in in_chunks(engine, 3)]


def test_rows_continued_under_new_weights_keep_each_tokens_own_log_prob():
    """Tokens 0-5 drawn by v0, the rest by v1: each token's log-prob is the one of the weights
    that drew it (a teacher-forced pass of that version over the finished rows agrees token by
    token), and its version says which."""
    old, new = tiny_model(0), tiny_model(1)
    engine = RolloutEngine(copy.deepcopy(old), TOK, PARAMS)
    partial = start()
    engine.advance(partial, 6)
    engine.load_weights(new.state_dict())
    engine.weight_version = 1
    while partial.running():
        engine.advance(partial, 6)
    episodes = partial.episodes(examples(), TOK)
    batch = RolloutBatch.collate(episodes, TOK.pad_id, temperature=PARAMS.temperature)
    mask = batch.response_mask.bool()  # (B, T)
    by_version = torch.full_like(batch.old_logp, -1, dtype=torch.long)  # (B, T), -1 off the response
    for i, e in enumerate(episodes):
        by_version[i, mask[i]] = torch.tensor(e.token_versions)
    with torch.no_grad():
        logp_old = Trainer(old, lr=1e-3, total_steps=1).forward(batch).logp  # (B, T)
        logp_new = Trainer(new, lr=1e-3, total_steps=1).forward(batch).logp
    drawn_by_old, drawn_by_new = mask & (by_version == 0), mask & (by_version == 1)
    assert int(drawn_by_old.sum()) == 6 * len(episodes) - sum(6 - len(e.response_ids) for e in episodes
                                                               if len(e.response_ids) < 6)
    assert int(drawn_by_new.sum()) > 50  # most rows ran on past the push
    torch.testing.assert_close(batch.old_logp[drawn_by_old], logp_old[drawn_by_old], atol=1e-5, rtol=0)
    torch.testing.assert_close(batch.old_logp[drawn_by_new], logp_new[drawn_by_new], atol=1e-5, rtol=0)
    assert (batch.old_logp[drawn_by_new] - logp_old[drawn_by_new]).abs().max() > 0.1  # the versions do differ
    assert all(e.weight_version == 0 for e in episodes)  # an episode is as stale as its oldest token


def test_a_partial_rollout_is_refused_what_it_cannot_resume():
    engine = RolloutEngine(tiny_model(), TOK, PARAMS)
    engine.max_rows = 8
    with pytest.raises(ValueError, match=r"12 rows is more than this engine decodes at once \(max_rows=8\)"):
        engine.advance(start(), 4)
    with pytest.raises(ValueError, match=r"rows \[0, 1, 2, .*are still sampling"):
        start().episodes(examples(), TOK)
    partial = start()
    RolloutEngine(tiny_model(), TOK, PARAMS).advance(partial, BUDGET)
    assert partial.running() == [] and partial.stops.count(STOP_BUDGET) == 8
