"""Thinking across tool calls (roles/thinking.py) in the agent loop: keep_last and drop strip
earlier <think> ids from the next turn's context, and training then reads one row per model
turn, each in the context it was sampled in, its group statistics counting episodes."""

import copy

import pytest
import torch

from posttrain.algorithms import make_algorithm
from posttrain.config import ConfigError, SamplingParams, TrainConfig
from posttrain.roles.rollout import ColocatedRollout, RolloutRequest
from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.turn_checks import check_multi_turn
from posttrain.roles.agent import AgentLoop
from posttrain.roles.controller import Controller, StepSettings
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import STOP_TOKEN, Continuation
from posttrain.roles.thinking import thinking_token_mask
from posttrain.roles.trainer import Trainer
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Example, RolloutBatch, TurnResult

TOK = CharTokenizer()
OBSERVATION = "<r>42</r>\n"
# what the model "writes" on its 1st, 2nd and 3rd turn: thinking, then a call or an answer
TURNS = ["<think>aa</think>call", "<think>bbb</think>call", "<think>c</think>Final: 7"]


class ThinkingToolEnv:
    """Two tool turns, then the answer; the reward is given per episode by `rewards`."""

    spec_version = "thinking-tool-1"
    max_turns, max_total_tokens = 4, 200

    def __init__(self, thinking="keep_all", rewards=None):
        self.thinking, self.rewards = thinking, rewards or {}

    def sample(self, split, n, seed):
        return [Example(f"Q: {i}\n", "7", id=str(i)) for i in range(n)]

    def fixed_set(self, split, n, seed=0):
        return self.sample(split, n, seed)

    def solution(self, example):
        return "Final: 7"

    def demonstration(self, example):
        return [(MODEL_TURN, "call"), (ENVIRONMENT_TURN, OBSERVATION), (MODEL_TURN, "Final: 7")]

    def score(self, example, completion):
        raise AssertionError("scored by step")

    def reset(self, example):
        self.episodes = getattr(self, "episodes", -1) + 1
        return {"calls": 0, "episode": self.episodes}

    def step(self, state, model_turn):
        if state["calls"] < 2:
            state["calls"] += 1
            return TurnResult(observation=OBSERVATION)
        return TurnResult(done=True, reward=self.rewards.get(state["episode"], 1.0), details={"reason": "ok"})


def tiny_model():
    torch.manual_seed(0)
    return GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=160))


def forced_engine(model):
    """An engine whose turns are TURNS in order (one per call), each with the log-probs the
    model gives it in the context it is continued from: what sampling it would have recorded.
    `contexts` keeps every context the loop asked it to continue."""
    engine = RolloutEngine(copy.deepcopy(model), TOK, SamplingParams(max_new_tokens=40))
    engine.contexts = []

    def continue_rows(contexts, budgets, generator=None, params=None, stop_strings=()):
        text = TURNS[len(engine.contexts) % len(TURNS)]  # the k-th call writes every row's k-th turn
        engine.contexts.append(contexts)
        ids = TOK.encode(text) + [TOK.eos_id]
        rows = []
        for context in contexts:
            with torch.no_grad():
                logits = engine.model(torch.tensor([context + ids]))
                logits = logits.logits if hasattr(logits, "logits") else logits
                logp = torch.log_softmax(logits[0, len(context) - 1 : -1], dim=-1)
            rows.append(Continuation(ids, logp.gather(-1, torch.tensor(ids)[:, None])[:, 0].tolist(), text, STOP_TOKEN))
        return rows

    engine.continue_rows = continue_rows
    return engine


def run(thinking, rewards=None, model=None):
    model = model or tiny_model()
    engine = forced_engine(model)
    env = ThinkingToolEnv(thinking, rewards)
    episodes = AgentLoop(env)(engine, env.sample("train", 2, 0), 2)
    return episodes, engine.contexts, model


def test_the_mask_marks_whole_ids_inside_a_block_and_keeps_one_that_spans_its_edge():
    text = "<think>ab</think>c<think>d"  # the second block never closes: thinking to the end
    assert thinking_token_mask(TOK.decode, TOK.encode(text)) == [True] * 17 + [False] + [True] * 8
    pieces = ["<think>", "ab", "</think>\n", "call"]  # a BPE-like split: the closing tag merged with a newline
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    assert thinking_token_mask(decode, [0, 1, 2, 3]) == [True, True, False, False]
    assert thinking_token_mask(decode, []) == []


@pytest.mark.parametrize("thinking", ["keep_last", "drop"])
def test_the_next_turn_reads_the_trajectory_less_the_stripped_thinking_ids(thinking):
    episodes, contexts, _ = run(thinking)
    obs = TOK.encode(OBSERVATION)
    drawn = [TOK.encode(text) + [TOK.eos_id] for text in TURNS]
    stripped = [TOK.encode(text.split("</think>")[1]) + [TOK.eos_id] for text in TURNS]
    for b, e in enumerate(episodes):
        first, second, third = (contexts[k][b] for k in range(3))
        assert first == e.prompt_ids
        assert second == e.prompt_ids + (drawn[0] if thinking == "keep_last" else stripped[0]) + obs
        assert third == e.prompt_ids + stripped[0] + obs + (drawn[1] if thinking == "keep_last" else stripped[1]) + obs
        model_turns = e.turns[::2]
        assert [t.token_ids for t in model_turns] == drawn  # the turns themselves stay as drawn
        # None where the context is the trajectory itself (keep_last strips nothing before turn 3)
        assert [t.context_ids for t in model_turns] == [None, None if thinking == "keep_last" else second, third]
        assert e.response_ids == [i for t in e.turns for i in t.token_ids]


def test_keep_all_reads_the_whole_trajectory_and_trains_one_row():
    episodes, contexts, _ = run("keep_all")
    e = episodes[0]
    assert contexts[2][0] == e.prompt_ids + e.response_ids[: len(contexts[2][0]) - len(e.prompt_ids)]
    assert all(t.context_ids is None for t in e.turns)
    assert e.training_rows() == [e]


@pytest.mark.parametrize("thinking", ["keep_last", "drop"])
def test_each_rows_old_logp_equals_the_trainers_pass_over_that_row(thinking):
    episodes, _, model = run(thinking)
    rows = [row for e in episodes for row in e.training_rows()]
    assert len(rows) == 3 * len(episodes) and all(row.episode_rows == 3 for row in rows)
    batch = RolloutBatch.collate(rows, TOK.pad_id)
    with torch.no_grad():
        logp = Trainer(model, lr=1e-3, total_steps=1).forward(batch).logp * batch.response_mask
    assert batch.response_mask.sum() == sum(len(TOK.encode(t)) + 1 for t in TURNS) * len(episodes)
    torch.testing.assert_close(logp, batch.old_logp, atol=1e-5, rtol=0)
    # the same episodes read as one row each would score turns 2 and 3 in contexts never sampled
    whole = RolloutBatch.collate(episodes, TOK.pad_id)
    with torch.no_grad():
        whole_logp = Trainer(model, lr=1e-3, total_steps=1).forward(whole).logp * whole.response_mask
    assert (whole_logp - whole.old_logp).abs().max() > 1e-3
    torch.testing.assert_close(batch.row_weights, torch.full((len(rows),), 1 / 3))


def test_group_statistics_count_episodes_not_the_rows_they_became():
    # episode 0 is cut into 3 rows, episodes 1..3 are one row each: the weighted statistics
    # must equal those of the four episodes as four rows
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    group_ids = torch.zeros(6, dtype=torch.long)
    weights = torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0, 1.0, 1.0])
    episode_rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    ids = torch.zeros(4, dtype=torch.long)
    for name in ("grpo", "dr_grpo", "rloo", "reinforce", "cispo"):
        params = {"reinforce": {"baseline": "group_mean"}, "dr_grpo": {"max_len": 8}}.get(name, {})
        rows = RolloutBatch(tokens=torch.zeros(6, 2, dtype=torch.long), attention_mask=torch.ones(6, 2),
                            response_mask=torch.ones(6, 2), old_logp=torch.zeros(6, 2), rewards=rewards,
                            group_ids=group_ids, row_weights=weights)
        plain = RolloutBatch(tokens=torch.zeros(4, 2, dtype=torch.long), attention_mask=torch.ones(4, 2),
                             response_mask=torch.ones(4, 2), old_logp=torch.zeros(4, 2), rewards=episode_rewards,
                             group_ids=ids)
        got = make_algorithm(name, **params).compute_advantages(rows)["advantages"][:, 0]
        want = make_algorithm(name, **params).compute_advantages(plain)["advantages"][:, 0]
        torch.testing.assert_close(got, want[[0, 0, 0, 1, 2, 3]], msg=name)
        assert make_algorithm(name, **params).accepts_turn_rows
    for norm in ("group-mean-batch-std", "group-mean-pooled-std", "batch-mean-batch-std"):
        got = make_algorithm("grpo", adv_norm=norm).compute_advantages(rows)["advantages"][:, 0]
        want = make_algorithm("grpo", adv_norm=norm).compute_advantages(plain)["advantages"][:, 0]
        torch.testing.assert_close(got, want[[0, 0, 0, 1, 2, 3]], msg=norm)


def test_algorithms_that_read_a_row_as_a_whole_episode_are_refused():
    cfg = TrainConfig()
    check_multi_turn(cfg, ToolArithmeticEnv(thinking="drop"))  # grpo: allowed
    for algo in ("ppo", "reinforce_pp", "gspo", "dapo"):  # a critic, reward-to-go, a sequence ratio, overlong
        cfg.rl.algo = algo
        with pytest.raises(ConfigError, match="one row per model turn") as refused:
            check_multi_turn(cfg, ToolArithmeticEnv(thinking="drop"))
        # the message names the registry's turn-row algorithms, new ones included
        assert "grpo, dr_grpo, lite_ppo, cispo, sapo, dppo_tv, dppo_kl, or dapo with" in str(refused.value)
        check_multi_turn(cfg, ToolArithmeticEnv())  # keep_all: one row, any algorithm
    assert not make_algorithm("dapo", max_len=48).accepts_turn_rows
    assert make_algorithm("dapo", overlong_cache=0).accepts_turn_rows
    with pytest.raises(ValueError, match="thinking policy must be one of"):
        ToolArithmeticEnv(thinking="keep_some")


def test_one_grpo_step_trains_the_turn_rows_and_logs_per_episode():
    model = tiny_model()
    before = copy.deepcopy(model.state_dict())
    env = ThinkingToolEnv("drop", rewards={0: 1.0, 1: 0.0, 2: 0.0, 3: 1.0})
    engine = forced_engine(model)
    request = lambda step, round: RolloutRequest(env.sample("train", 2, 0), 2, 7)  # noqa: E731
    rollout = ColocatedRollout(model, TOK, SamplingParams(max_new_tokens=40), request, sampler=AgentLoop(env))
    rollout.engine.continue_rows = engine.continue_rows  # the forced turns, scored by the same weights
    controller = Controller(rollout, env.score, make_algorithm("grpo", loss_agg="token-mean"),
                            Trainer(model, lr=1e-2, total_steps=1), StepSettings(prompts_per_step=2, seed=0, pad_id=TOK.pad_id))
    metrics, episodes = controller.step(0)
    assert len(episodes) == 4 and metrics["model_turns"] == 3.0  # per episode, not per row
    assert metrics["reward_mean"] == 0.5 and metrics["skipped_rows"] == 0.0
    assert metrics["response_length"] == sum(len(TOK.encode(t)) + 1 for t in TURNS)
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_bpe_tokenizers_thinking_ids_are_found_in_the_ids_it_drew():
    from transformers import AutoTokenizer

    from posttrain.models.hf import HFTokenizer
    from posttrain.models.smollm2 import convert_smollm2
    from posttrain.roles.thinking import split_thinking

    tok = HFTokenizer(AutoTokenizer.from_pretrained(convert_smollm2(), local_files_only=True))
    for text, thought in (("<think>17 times 3 is 51</think>\nFinal: 51", "17 times 3"),
                          ("Let me see.<think>carry the one</think> Final: 9", "carry the one"),
                          ("<think>never closed, so all of it is thinking", "never closed")):
        ids = tok.encode(text)
        kept = tok.decode([i for i, thinking in zip(ids, thinking_token_mask(tok.decode, ids)) if not thinking])
        outside = split_thinking(text)[1]
        # the thought is gone; every character written outside it stays (a BPE id that spans
        # a tag's edge, like SmolLM2's ".<", stays whole: at most a tag's fragment is left)
        assert thought not in kept
        assert all(piece in kept for piece in outside.split()) and len(kept) - len(outside) <= 2 * len("</think>")
