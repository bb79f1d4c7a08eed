"""Partial rollouts (dist.partial_rollout_tokens): rows sampled a chunk at a time, continued
under whatever weights the engine holds when the next chunk starts.

    engine      a row interrupted at any chunk boundary and continued under the same weights
                draws the tokens of one uninterrupted `generate` call, log-probs to float
                rounding; under new weights the continued tokens carry the new weights'
                log-probs and version, the earlier ones keep theirs
    staleness   per-token staleness, and the episodes staler than the bound dropped
    async run   on 2 Ray workers: pushes land between chunks, per-token versions; killed and
                resumed, the same metrics and samples (slow: `pytest -m slow`, ~45 s on 2 loaded cores)
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


# -- staleness -----------------------------------------------------------------------------------


def episode(group: int, version: int, token_versions: list[int] | None = None) -> Episode:
    ids = [5] * (len(token_versions) if token_versions else 3)
    return Episode(example=Example(f"p{group}", "", f"id{group}"), group_id=group, prompt_ids=[1], response_ids=ids,
                   response_logp=[-1.0] * len(ids), weight_version=version, token_versions=token_versions)


def test_token_staleness_worked_by_hand():
    from posttrain.distributed.async_rollout import token_staleness

    # trained at version 3: tokens of versions 1, 1, 2, 3 (staleness 2, 2, 1, 0) and 2, 2, 2 (1, 1, 1)
    stats = token_staleness([episode(0, 1, [1, 1, 2, 3]), episode(1, 2, [2, 2, 2])], version=3)
    assert stats == {"staleness_token_mean": pytest.approx(8 / 7), "partial/continued_tokens": 2}
    # whole responses (no token_versions): every token is as stale as its episode
    assert token_staleness([episode(0, 1), episode(1, 3)], version=3) == {"staleness_token_mean": 1.0,
                                                                          "partial/continued_tokens": 0}


def test_partial_rollouts_are_checked_at_config_time():
    with pytest.raises(ConfigError, match=r"dist.partial_rollout_tokens=8 is not allowed: expected 0 with "
                                          r"dist.topology='auto': only the async topology samples ahead"):
        DistConfig(workers=2, partial_rollout_tokens=8).validate()
    with pytest.raises(ConfigError, match=r"dist.partial_rollout_tokens=-1 is not allowed: expected an integer >= 0"):
        DistConfig(workers=2, topology="async", partial_rollout_tokens=-1).validate()
    DistConfig(workers=2, topology="async", partial_rollout_tokens=8).validate()


def test_a_multi_turn_environment_is_refused_partial_rollouts():
    from posttrain.config import TrainConfig
    from posttrain.pipelines.checks import check_train
    from tests.test_agent_loop import FixedToolEnv

    cfg = TrainConfig()
    cfg.dist = DistConfig(workers=2, topology="async", partial_rollout_tokens=8)
    with pytest.raises(ConfigError, match=r"dist.partial_rollout_tokens=8 is not allowed: expected 0 with "
                                          r"rl.sampling.engine='torch' and env 'arithmetic': partial rollouts resume "
                                          r"single completions of the torch engine only; drop"):
        check_train(cfg, FixedToolEnv())


def test_stale_groups_are_dropped_and_sampled_again():
    """drop_stale on its own (the Ray calls stood in for): trained at version 5 with a bound of
    2, group 1 (an episode of version 2) goes, all K of it, and comes back sampled by v5 from
    the seed given, in its place; groups 0 and 2 (versions 3 and 4) stay."""
    from posttrain.distributed.async_rollout import AsyncRayRollout

    rollout = object.__new__(AsyncRayRollout)  # no workers: submit and gather are stood in for below
    rollout.version, rollout.max_staleness = 5, 2
    asked = []

    def submit(request, min_version):
        asked.append(([e.id for e in request.examples], request.samples_per_prompt, request.seed, min_version))
        return request

    def gather(request, k, min_version):
        return [episode(g, 5) for g in range(len(request.examples)) for _ in range(k)]

    rollout.submit, rollout.gather = submit, gather
    batch = [episode(0, 3), episode(0, 3), episode(1, 4), episode(1, 2), episode(2, 4), episode(2, 4)]
    kept = rollout.drop_stale(batch, k=2, seed=77)
    assert asked == [(["id1"], 2, 77, 5)]
    assert [(e.group_id, e.weight_version) for e in kept] == [(0, 3), (0, 3), (1, 5), (1, 5), (2, 4), (2, 4)]
    assert rollout.dropped_stale == 2
    assert rollout.drop_stale(kept, k=2, seed=77) == kept and rollout.dropped_stale == 0 and len(asked) == 1


# -- the async topology on 2 Ray workers -------------------------------------------------------------

STEPS = 4
PARTIAL = {"workers": 2, "topology": "async", "max_staleness": 2, "partial_rollout_tokens": 3}


def tiny_partial(out):
    """test_distributed.py's tiny run, sampled in chunks of 3 tokens (its responses run to ~10)."""
    from tests.test_distributed import STEPS as DISTRIBUTED_STEPS, tiny

    assert DISTRIBUTED_STEPS == STEPS  # the assertions below count that run's steps
    return tiny(out, **PARTIAL)


def run_rows(run, name: str = "metrics.jsonl", stage: str = "rl") -> list[dict]:
    import json

    return [r for r in map(json.loads, (run / name).read_text().splitlines()) if r["stage"] == stage]


@pytest.fixture(scope="module")
def partial_run(cluster, tmp_path_factory):
    from posttrain.pipelines.run import run_pipeline, start_run

    cfg = tiny_partial(tmp_path_factory.mktemp("partial"))
    run = start_run(cfg, "train")
    run_pipeline(cfg, run)
    return run.path


def test_pushes_land_between_chunks_and_each_token_is_as_stale_as_its_weights(partial_run):
    k = PARTIAL["max_staleness"]
    metrics = run_rows(partial_run)
    assert [r["step"] for r in metrics] == list(range(STEPS))
    # an episode is as stale as its first token: its batch began k updates before it trains
    assert [r["staleness_max"] for r in metrics] == [min(s, k) for s in range(STEPS)]
    assert {r["step"]: r["weight_version"] for r in run_rows(partial_run, "samples.jsonl")} == \
        {s: max(0, s - k) for s in range(STEPS)}
    # from step 1 on, pushes landed inside the batches in flight: tokens continued under newer weights,
    # so the mean token is fresher than the mean episode; step 0 was sampled before any push
    assert metrics[0]["partial/continued_tokens"] == 0 and metrics[0]["staleness_token_mean"] == 0
    assert all(r["partial/continued_tokens"] > 0 for r in metrics[1:])
    assert all(r["staleness_token_mean"] < r["staleness_mean"] for r in metrics[1:])
    assert all(r["partial/dropped_stale"] == 0 for r in metrics)  # the schedule keeps every token within k
    assert all(0 < r["mismatch/weight_mean"] <= 2 for r in metrics)


@pytest.mark.slow
def test_killed_partial_run_resumes_to_the_same_numbers(partial_run, tmp_path, monkeypatch):
    """Killed in step 1 after the checkpoint of step 0 (the reference run checkpoints every 2
    steps: a checkpoint copies the rows in flight and must not move a draw). The resumed run
    gives the rows back to the workers and continues them under the same pushes."""
    from posttrain.pipelines.run import run_pipeline
    from posttrain.runs.rundir import RunDir
    from tests.test_distributed import killed_in_rl_step_1

    cfg = tiny_partial(tmp_path)
    cfg.checkpoint_every = 1
    run = killed_in_rl_step_1(cfg, monkeypatch)
    run_pipeline(cfg, RunDir.open(str(run.path)))
    untimed = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
    assert untimed(run_rows(run.path)) == untimed(run_rows(partial_run))
    assert run_rows(run.path, "samples.jsonl") == run_rows(partial_run, "samples.jsonl")
