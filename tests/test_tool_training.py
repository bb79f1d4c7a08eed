"""Training on a tool-use task: SFT demonstrations laid out like sampled episodes, with the
tool's output masked, and the whole job (SFT → GRPO → held-out eval) on tool_arithmetic."""

import json
import subprocess
import sys

import pytest

from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.sft import demonstration_episodes, demonstration_turns
from posttrain.types import ENVIRONMENT_TURN, MODEL_TURN, RolloutBatch

TOK = CharTokenizer()


def test_a_demonstration_is_laid_out_like_a_sampled_episode_with_the_tool_output_masked():
    env = ToolArithmeticEnv()
    example = env.fixed_set("train", 1)[0]
    a, b = example.meta["a"], example.meta["b"]
    episode = demonstration_episodes(env, TOK, [example])[0]
    call = f"<tool_call>calculator: {a}*{b}</tool_call>"
    result = f"<tool_result>{a * b}</tool_result>\n"
    answer = f"Final: {a * b}"
    # each model turn ends with EOS as a sampled turn does; the result is its own characters
    expected = TOK.encode(call) + [TOK.eos_id] + TOK.encode(result) + TOK.encode(answer) + [TOK.eos_id]
    assert episode.response_ids == expected
    assert [t.source for t in episode.turns] == [MODEL_TURN, ENVIRONMENT_TURN, MODEL_TURN]
    batch = RolloutBatch.collate([episode], TOK.pad_id)
    P = len(episode.prompt_ids)
    mask = batch.response_mask[0, P:P + len(expected)].tolist()
    n_call, n_result = len(call) + 1, len(result)
    assert mask == [1.0] * n_call + [0.0] * n_result + [1.0] * (len(answer) + 1)
    assert batch.response_mask[0, :P].sum() == 0


def test_demonstrations_must_be_model_and_environment_turns_ending_with_the_answer():
    with pytest.raises(ValueError, match="source is 'tool'"):
        demonstration_turns([("tool", "x")], TOK)
    with pytest.raises(ValueError, match="must end with a model turn"):
        demonstration_turns([(MODEL_TURN, "call"), (ENVIRONMENT_TURN, "42")], TOK)


def test_tool_demos_sets_the_share_of_demonstrations_that_call_the_calculator():
    examples = ToolArithmeticEnv().fixed_set("train", 2000)
    for share in (0.0, 0.3, 1.0):
        env = ToolArithmeticEnv(tool_demos=share)
        calls = [len(env.demonstration_turns(e)) == 2 for e in examples]
        assert abs(sum(calls) / len(calls) - share) < 0.03
        # every demonstration, with or without the call, earns reward 1 (demonstration checks it)
        assert all(env.demonstration(e) for e in examples[:50])
    again = ToolArithmeticEnv(tool_demos=0.3)  # the same problems call the tool every time
    assert [len(again.demonstration_turns(e)) for e in examples] == \
        [len(ToolArithmeticEnv(tool_demos=0.3).demonstration_turns(e)) for e in examples]
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(ValueError, match="tool_demos"):
            ToolArithmeticEnv(tool_demos=bad)


def test_the_whole_job_runs_on_the_tool_task(tmp_path):
    tiny = ["--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
            "--model.max_seq_len", "128", "--sft.num_examples", "16", "--sft.steps", "4", "--sft.batch_size", "8",
            "--sft.warmup_steps", "1", "--rl.prompts_per_step", "4", "--rl.samples_per_prompt", "4",
            "--rl.steps", "2", "--rl.eval_every", "2", "--rl.dev_size", "8", "--heldout_size", "16",
            "--threads", "1"]
    proc = subprocess.run([sys.executable, "-m", "posttrain", "run", "--env.name", "tool_arithmetic",
                           "--env.tool_arithmetic.tool_demos", "0.5", *tiny, "--out_dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert len(rl) == 2
    for row in rl:  # every episode has at least one model turn, at most the environment's 3
        assert 1 <= row["model_turns"] <= 3
        assert 0 <= row["observed_episodes"] <= 1
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    rl_samples = [s for s in samples if s["stage"] == "rl"]
    assert rl_samples and all("ended_by" in s["details"] for s in rl_samples)
    assert (run / "rl_metrics.png").exists()
    summary = json.loads((run / "summary.json").read_text())
    for stage in ("sft", "rl"):  # how often the held-out episodes called the tool, with its CI
        used = summary[stage]["observed_episodes"]
        assert 0 <= used["ci_low"] <= used["mean"] <= used["ci_high"] <= 1 and used["n"] == 16
    assert "tool call / observation" in (run / "summary.md").read_text()
    # `posttrain eval` of the final checkpoint runs the same agent loop on the same held-out
    # problems: the same episodes, so the same pass@1 and the same details
    checkpoint = run / "checkpoints" / "rl" / (run / "checkpoints" / "rl" / "latest").read_text().strip()
    proc = subprocess.run([sys.executable, "-m", "posttrain", "eval", "--checkpoint", str(checkpoint),
                           "--env.name", "tool_arithmetic", "--size", "16", "--out_dir", str(tmp_path / "eval")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (evaluation,) = (tmp_path / "eval").iterdir()
    assert json.loads((evaluation / "summary.json").read_text())["pass_rate"] == summary["rl"]["mean"]
    rescored = [json.loads(line) for line in (evaluation / "samples.jsonl").read_text().splitlines()]
    held_out = [json.loads(line) for line in (run / "eval_rl.jsonl").read_text().splitlines()]
    assert [r["completion"] for r in rescored] == [r["completion"] for r in held_out]
    assert all("ended_by" in r["details"] for r in rescored)


def test_a_multi_turn_environment_refuses_what_cannot_train_on_it(capsys, tmp_path):
    from tests.test_validation import refused

    refused(capsys, tmp_path, ["train", "--env.name", "tool_arithmetic", "--algo", "dpo"], "rl.algo=",
            "preference losses train on pairs of single completions")
    refused(capsys, tmp_path, ["rlhf", "--env.name", "tool_arithmetic"], "multi-turn environment",
            "reward model learns from single completions")


def test_the_guides_tool_environment_runs_as_written():
    import re
    from pathlib import Path

    from posttrain.roles.environment import is_multi_turn

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "agents.md").read_text(encoding="utf-8")
    section = guide[guide.index("# Agents: tools and multi-turn episodes"):]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    assert len(code.splitlines()) < 40
    namespace = {"__name__": "readme_cubes"}
    exec(compile(code, "docs/guides/agents.md", "exec"), namespace)
    env = namespace["Cubes"]()
    assert is_multi_turn(env)
    heldout, train = env.fixed_set("heldout", 20), env.fixed_set("train", 50)
    assert not {e.prompt for e in heldout} & {e.prompt for e in train}
    example = heldout[0]
    episode = demonstration_episodes(env, TOK, [example])[0]  # runs the real calculator through step
    n = int(example.prompt[3:-4])
    assert episode.turns[1].text == f"<tool_result>{n ** 3}</tool_result>\n"
    state = env.reset(example)
    assert env.step(state, f"<tool_call>calculator: {n}**3</tool_call>").observation == episode.turns[1].text
    assert env.step(state, f"Final: {n ** 3}").reward == 1.0
    assert env.step(env.reset(example), f"Final: {n ** 3 + 1}").reward == 0.0
