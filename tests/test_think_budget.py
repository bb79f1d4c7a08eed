"""Thinking-mode fusion: the think-v1 spec, the /think and /no_think environment, and the
thinking budget's sampler (roles/think_budget.py), counted token by token on a scripted model."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posttrain.config import SamplingParams
from posttrain.envs import make_env
from posttrain.envs.thinking_modes import fused_mode, mode_of
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.think_budget import budgeted_generate
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, Example, RolloutBatch
from posttrain.verifiers.final_int import score
from posttrain.verifiers.think_tags import EARLY_STOP, THINK_CLOSE, forced_text, split_thinking

TOK = CharTokenizer()
THINK = "final_int/think-v1"
E12 = Example("Q: 7+5 /think\n", "12")


# --- the spec: the answer is read after the thinking ------------------------------------

@pytest.mark.parametrize("completion,reward,reason", [
    ("<think>7+5=12</think>\nFinal: 12", 1.0, "ok"),
    ("Final: 12", 1.0, "ok"),  # /no_think: no block at all
    ("  <think>7+5=12</think>\n\nFinal: 12\n", 1.0, "ok"),  # surrounding whitespace, as strict-v1 allows
    ("<think>7+5=12</think>\nFinal: 13", 0.0, "wrong_answer"),
    ("<think>7+5=12\nFinal: 12", 0.0, "unclosed_think"),  # the answer is inside the open block
    ("<think>Final: 12</think>", 0.0, "no_final_line"),  # an answer written only while thinking
    ("So <think>7+5=12</think>\nFinal: 12", 0.0, "think_not_first"),
    ("<think>a</think><think>b</think>\nFinal: 12", 0.0, "think_not_first"),
    ("<think>7+5=12</think>\n7+5=12\nFinal: 12", 0.0, "extra_lines"),  # steps belong inside the thinking
    ("Final: 12</think>", 0.0, "extra_text"),  # a stray closing tag is text after the integer
])
def test_think_v1_reads_one_leading_block_then_the_strict_answer(completion, reward, reason):
    result = score(E12, completion, THINK)
    assert (result["reward"], result["details"]["reason"]) == (reward, reason)
    assert result["details"]["spec_version"] == THINK


def test_think_v1_equals_strict_v1_on_text_without_tags():
    for completion in ("Final: 12", "Final: 013", "final: 12", "Final:  12", "a\nFinal: 12", ""):
        assert score(E12, completion, THINK)["details"]["reason"] == score(E12, completion, "final_int/strict-v1")[
            "details"]["reason"]


def test_the_tag_parser_has_one_home():
    from posttrain.roles import thinking

    assert thinking.split_thinking is split_thinking  # the agent loop's parser is the verifiers' one
    assert split_thinking("<think>a</think>b<think>c") == (["a", "c"], "b", True)


# --- the environment: the switch in the prompt -----------------------------------------

def test_fused_demonstrations_are_half_each_mode_and_each_one_scores_1():
    env = make_env("arithmetic_think")
    demos = env.fixed_set("train", 400)
    modes = [mode_of(e) for e in demos]
    assert 160 <= modes.count("think") <= 240
    for example, mode in zip(demos, modes):
        solution = env.solution(example)
        assert env.score(example, solution)["reward"] == 1.0
        expression = example.prompt[len("Q: "):].split(" /")[0]
        assert mode == fused_mode(expression) == example.meta["think_mode"]
        total = sum(int(t) for t in expression.split("+"))
        if mode == "think":
            assert example.prompt == f"Q: {expression} /think\n"
            assert solution.startswith("<think>") and solution.endswith(f"</think>\nFinal: {total}")
        else:
            assert example.prompt == f"Q: {expression} /no_think\n" and solution == f"Final: {total}"
    assert [e.id for e in demos] == [e.id for e in make_env("arithmetic_think").fixed_set("train", 400)]


def test_one_mode_sets_hold_the_same_problems_and_pair_by_id():
    think = make_env("arithmetic_think", think_mode="think").fixed_set("heldout", 20)
    no_think = make_env("arithmetic_think", think_mode="no_think").fixed_set("heldout", 20)
    plain = make_env("arithmetic").fixed_set("heldout", 20)
    assert [e.id for e in think] == [f"{e.id}/think" for e in plain]
    assert [e.id for e in no_think] == [f"{e.id}/no_think" for e in plain]
    assert all(a.expected_answer == b.expected_answer for a, b in zip(think, no_think))


def test_budget_demonstrations_end_exactly_as_the_budget_sampler_ends_a_row():
    env = make_env("arithmetic_think", budget_demos=0.3)
    demos = [e for e in env.fixed_set("train", 1000) if mode_of(e) == "think"]
    cut = [e for e in demos if forced_text() in env.solution(e)]
    assert 0.2 < len(cut) / len(demos) < 0.4  # the share asked for, by a hash of each problem
    assert not any(forced_text() in make_env("arithmetic_think").solution(e) for e in demos)  # 0: none
    example = cut[0]
    demo = env.solution(example)
    thinking, answer = demo.split(forced_text())
    budget = len(thinking) - len("<think>")
    full = make_env("arithmetic_think").solution(example)  # what the model would think, uncut

    def script(text):  # thinks the full chain, and after the appended text writes the demo's answer
        written = text.split("\n", 1)[1]
        if full.startswith(written):
            return full[len(written)]
        after = text.rsplit(THINK_CLOSE + "\n", 1)[1]
        return answer[len(after)] if len(after) < len(answer) else ""

    engine = RolloutEngine(ScriptedModel(script), TOK, SamplingParams(temperature=0.0, max_new_tokens=64))
    (episode,), (use,) = budgeted_generate(engine, [example], budget, 16)
    assert use.forced and episode.completion == demo and env.score(example, episode.completion)["reward"] == 1.0


def test_bad_settings_and_prompts_are_refused_by_name():
    with pytest.raises(ValueError, match="think_mode must be one of"):
        make_env("arithmetic_think", think_mode="maybe")
    with pytest.raises(ValueError, match="budget_demos must be a share between 0 and 1"):
        make_env("arithmetic_think", budget_demos=1.5)
    with pytest.raises(ValueError, match="has no parameter"):
        make_env("arithmetic_think", cot=False)
    with pytest.raises(ValueError, match="not a thinking-mode prompt"):
        make_env("arithmetic_think").solution(Example("Q: 1+2\n", "3"))


# --- the budget: a scripted model, counted token by token ------------------------------

class ScriptCache:
    """The decode loop's KV cache, reduced to what a script needs: each row's ids so far."""

    def __init__(self):
        self.rows: list[list[int]] = []

    def batch_select_indices(self, indices):
        self.rows = [list(self.rows[i]) for i in indices.tolist()]


class ScriptedModel(torch.nn.Module):
    """Writes, greedily, the character `script(text so far)` returns ('' = EOS): a model
    whose every token is known in advance, driven through the real RolloutEngine."""

    compute_dtype = torch.float32

    def __init__(self, script):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # where model_device looks
        self.script = script
        self.config = SimpleNamespace(max_seq_len=512)

    def new_cache(self, batch, max_len):
        return ScriptCache()

    def _logits(self, rows):
        logits = torch.zeros(len(rows), TOK.vocab_size)
        for r, ids in enumerate(rows):
            char = self.script(TOK.decode(ids))
            logits[r, TOK.eos_id if char == "" else TOK.stoi[char]] = 50.0
        return logits

    def hidden_states(self, input_ids, attention_mask, kv_cache):
        kv_cache.rows = [[t for t, m in zip(ids.tolist(), mask.tolist()) if m]
                         for ids, mask in zip(input_ids, attention_mask)]
        return self._logits(kv_cache.rows)[:, None, :].expand(-1, input_ids.shape[1], -1)

    def lm_head(self, hidden):
        return hidden  # hidden_states already returned the scripted logits

    def forward(self, token, attention_mask, kv_cache):
        for ids, t in zip(kv_cache.rows, token[:, 0].tolist()):
            ids.append(t)
        return self._logits(kv_cache.rows)[:, None, :]


TARGETS = {  # what each question makes the script write, from the end of the prompt
    "never": "<think>" + "x" * 200,  # thinks forever: only the budget stops it
    "closes": "<think>1+2=3</think>\nFinal: 3",  # 13 thinking tokens, </think> included
    "direct": "Final: 3",  # /no_think: never opens a block
}


def script(text: str) -> str:
    question, written = text.split("\n", 1)
    target = TARGETS[question.split()[1]]
    if target.startswith(written):
        return target[len(written)] if len(written) < len(target) else ""
    answer = text.rsplit(THINK_CLOSE + "\n", 1)[1]  # off the target: the appended text was read; answer
    return "Final: 3"[len(answer)] if len(answer) < len("Final: 3") else ""


def run_budget(kinds, budget, answer_tokens=16):
    examples = [Example(f"Q: {kind} /think\n", "3", id=str(i)) for i, kind in enumerate(kinds)]
    engine = RolloutEngine(ScriptedModel(script), TOK, SamplingParams(temperature=0.0, max_new_tokens=64))
    return budgeted_generate(engine, examples, budget, answer_tokens)


@pytest.mark.parametrize("budget", [0, 1, 5, 12])
def test_the_answer_is_forced_after_exactly_budget_thinking_tokens(budget):
    (episode,), (use,) = run_budget(["never"], budget)
    forced = forced_text()
    assert episode.completion == "<think>" + "x" * budget + forced + "Final: 3"
    assert (use.opened, use.forced, use.thinking_tokens, use.appended_tokens) == (True, True, budget, len(forced))
    assert [turn.source for turn in episode.turns] == [MODEL_TURN, ENVIRONMENT_TURN, MODEL_TURN]
    thinking, appended, answer = episode.turns
    assert len(thinking.token_ids) == len("<think>") + budget  # the budget counts from the token that completed <think>
    assert TOK.decode(appended.token_ids) == forced == f"{EARLY_STOP}</think>\n" and appended.logp is None
    assert answer.token_ids == TOK.encode("Final: 3") + [TOK.eos_id] and episode.finished
    assert use.sampled_tokens == len(episode.response_ids) - len(forced)
    assert score(episode.example, episode.completion, THINK)["reward"] == 1.0


def test_thinking_that_closes_within_the_budget_is_never_cut():
    for budget in (13, 40):  # 13: </think> completes on the budget's last token
        (episode,), (use,) = run_budget(["closes"], budget)
        assert episode.completion == TARGETS["closes"] and episode.turns is None
        assert (use.forced, use.thinking_tokens, use.appended_tokens) == (False, 13, 0)
        assert episode.response_ids == TOK.encode(TARGETS["closes"]) + [TOK.eos_id]
    (episode,), (use,) = run_budget(["closes"], 12)  # one token short: cut before the tag's last ">"
    assert episode.completion == "<think>1+2=3</think" + forced_text() + "Final: 3" and use.forced


def test_rows_of_every_kind_in_one_batch_each_get_their_own_budget():
    kinds = ["never", "direct", "closes", "never", "closes"]
    episodes, uses = run_budget(kinds, 8)
    alone = {kind: run_budget([kind], 8)[0][0].completion for kind in set(kinds)}
    assert [e.completion for e in episodes] == [alone[k] for k in kinds]  # batching changes nothing
    assert [u.forced for u in uses] == [True, False, True, True, True]  # "closes" needs 13 > 8
    assert [u.opened for u in uses] == [True, False, True, True, True]
    assert episodes[1].completion == "Final: 3" and uses[1].thinking_tokens == 0


def test_the_appended_tokens_are_context_never_actions():
    (episode,), _ = run_budget(["never"], 3)
    batch = RolloutBatch.collate([episode], TOK.pad_id)
    prompt = len(episode.prompt_ids)
    mask = batch.response_mask[0, prompt:prompt + len(episode.response_ids)].tolist()
    n_think, n_forced = len("<think>") + 3, len(forced_text())
    assert mask == [1.0] * n_think + [0.0] * n_forced + [1.0] * (len("Final: 3") + 1)


def test_bad_budgets_are_refused():
    with pytest.raises(ValueError, match="budget must be >= 0"):
        run_budget(["never"], -1)
    with pytest.raises(ValueError, match="answer_tokens >= 1"):
        run_budget(["never"], 4, answer_tokens=0)


# --- the switch changes what a trained model does ---------------------------------------

def test_sixty_sft_steps_on_fused_demonstrations_teach_the_switch():
    """A tiny gpt_mini, SFT on level-1 fused demonstrations: the same weights open a <think>
    block for every held-out /think prompt and answer at once for every /no_think one."""
    from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
    from posttrain.pipelines.sft import demonstration_episodes
    from posttrain.roles.trainer import Trainer, sft_loss

    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=64))
    env = make_env("arithmetic_think", level=1)
    demos = demonstration_episodes(env, TOK, env.fixed_set("train", 64))
    trainer = Trainer(model, lr=3e-3, total_steps=60, warmup_steps=5, weight_decay=0.0, grad_clip=1.0)
    draw = torch.Generator().manual_seed(0)
    for _ in range(60):
        rows = torch.randint(len(demos), (16,), generator=draw).tolist()
        trainer.update(RolloutBatch.collate([demos[i] for i in rows], TOK.pad_id), sft_loss)
    engine = RolloutEngine(model, TOK, SamplingParams(temperature=0.0, max_new_tokens=40), shares_weights=True)
    heldout = {mode: make_env("arithmetic_think", level=1, think_mode=mode).fixed_set("heldout", 7)
               for mode in ("think", "no_think")}
    think = [e.completion for e in engine.generate(heldout["think"], 1)]
    no_think = [e.completion for e in engine.generate(heldout["no_think"], 1)]
    assert all(c.startswith("<think>") for c in think), think
    assert all(c.startswith("Final: ") for c in no_think), no_think


# --- posttrain think: every mode and budget, counted on a scripted policy ------------------

def test_think_command_rows_count_every_token_and_pair_to_think(tmp_path, monkeypatch):
    """run_think on a scripted policy that thinks the env's own running sum, then answers it;
    after the appended text it answers 0. So /think and /no_think solve everything, a cut
    thinking nothing, and every token count follows from the demonstrations' lengths."""
    from posttrain.config.scoring import ThinkConfig
    from posttrain.search import thinking_curve

    env = make_env("arithmetic_think")
    problems = make_env("arithmetic_think", think_mode="think").fixed_set("heldout", 6)
    demo = {e.prompt.split()[1]: env.solution(e) for e in problems}  # expression -> <think>sum</think>\nFinal: N

    def policy(text):
        question, written = text.split("\n", 1)
        expression, switch = question.split()[1:]
        target = demo[expression] if switch == "/think" else demo[expression].rsplit("\n", 1)[1]
        if target.startswith(written):
            return target[len(written)] if len(written) < len(target) else ""
        after = text.rsplit(THINK_CLOSE + "\n", 1)[1]
        return "Final: 0"[len(after)] if len(after) < len("Final: 0") else ""

    task = tmp_path / "ckpt"
    task.mkdir()
    (task / "posttrain_task.json").write_text(json.dumps({
        "format": 1, "env": {"name": "arithmetic_think"}, "spec_version": THINK, "max_new_tokens": 64,
        "system_prompt": "", "posttrain_version": "test"}))
    monkeypatch.setattr(thinking_curve, "load_checkpoint_model", lambda path, expected: ScriptedModel(policy))
    monkeypatch.setattr(thinking_curve, "load_tokenizer", lambda path: TOK)
    result = thinking_curve.run_think(ThinkConfig(checkpoint=str(task), size=6, budgets="0,8,60",
                                                  out_dir=str(tmp_path / "out")))
    rows = {r["mode"]: r for r in result["rows"]}
    thinking = [len(d) - len("<think>") - len("\nFinal: 00") for d in demo.values()]  # the sum and </think>
    assert all(30 <= n <= 38 for n in thinking) and all(len(d.rsplit(" ", 1)[1]) == 2 for d in demo.values())
    full = len("<think>") + sum(thinking) / 6 + len("\nFinal: 00") + 1  # + EOS
    assert rows["/think"]["tokens"]["mean"] == pytest.approx(full) and rows["/think"]["pass@1"]["mean"] == 1.0
    assert rows["/no_think"]["tokens"]["mean"] == len("Final: 00") + 1 and rows["/no_think"]["pass@1"]["mean"] == 1.0
    for budget in (0, 8):  # cut: <think>, B tokens, the 37 appended, "Final: 0", EOS; every answer wrong
        row = rows[f"/think, budget {budget}"]
        assert row["tokens"]["mean"] == len("<think>") + budget + 37 + len("Final: 0") + 1
        assert (row["forced"], row["thinking_tokens"], row["pass@1"]["mean"]) == (1.0, budget, 0.0)
        assert row["vs_think"]["mean_diff"] == -1.0
    uncut = rows["/think, budget 60"]  # 60 > every thinking: the same completions as /think
    assert (uncut["forced"], uncut["tokens"]["mean"], uncut["vs_think"]["mean_diff"]) == (0.0, pytest.approx(full), 0.0)
    run = Path(result["run_dir"])
    assert len((run / "samples.jsonl").read_text().splitlines()) == 6 * 5
    # the table: 61 = 7 + 8 + 37 + 8 + 1 tokens, every answer wrong, so -100 points on every problem
    assert "| /think, budget 8 | 0.0% [0.0, 0.0] | 61.0 [61.0, 61.0] | 100% | -100.0 [-100.0, -100.0] |" in (
        run / "thinking.md").read_text()
