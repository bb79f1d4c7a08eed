"""STaR / rejection-sampling fine-tuning (pipelines/star.py): only verified rationales are
trained on, rationalised ones under the hint-free prompt, and a tiny run changes the weights."""

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

import posttrain.pipelines.star as star_module
from posttrain.cli import main
from posttrain.config.commands import StarConfig
from posttrain.config import TrainConfig
from posttrain.envs import make_env
from posttrain.models import load_checkpoint_model
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.star import HINT, verified_rationales, with_answer_hint
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.types import PROMPT_MESSAGES, Episode, Example
from tests.test_cli import help_entries, help_of, leaf_flags, reason
from tests.test_online_dpo import only_run

TOKENIZER = CharTokenizer()


class ScriptedEngine:
    """A rollout engine whose completions are fixed per prompt text: the test knows every
    sample, so it can name the exact training set. Records the prompts it was asked for."""

    def __init__(self, script: dict[str, list[tuple[str, bool]]]):
        self.script, self.tokenizer, self.calls = script, TOKENIZER, []

    def generate(self, examples, samples_per_prompt, generator=None):
        self.calls.append([e.prompt for e in examples])
        episodes = []
        for g, example in enumerate(examples):
            for text, finished in self.script[example.prompt][:samples_per_prompt]:
                ids = TOKENIZER.encode(text) + ([TOKENIZER.eos_id] if finished else [])
                episodes.append(Episode(example=example, group_id=g, prompt_ids=example_prompt_ids(TOKENIZER, example),
                                        response_ids=ids, response_logp=[-1.0] * len(ids), completion=text,
                                        finished=finished))
        return episodes


class StubVerifier:
    """Passes exactly the completions that contain "ok"."""

    def score(self, example, completion):
        return {"reward": float("ok" in completion), "details": {"stub": True}}


A, B, C = (Example(f"Q: {x}\n", str(i), id=x) for i, x in enumerate(["1+1", "2+2", "3+3"]))
SCRIPT = {
    A.prompt: [("ok one", True), ("bad", True), ("ok one", True), ("ok two", True)],  # a duplicate
    B.prompt: [("bad", True), ("nope", True), ("ok but cut off", False), ("bad", True)],  # its pass is unfinished
    C.prompt: [("bad", True)] * 4,
    with_answer_hint(B).prompt: [("ok hinted", True), ("bad", True), ("ok hinted", True), ("ok hinted 2", True)],
    with_answer_hint(C).prompt: [("bad", True)] * 4,
}


@pytest.mark.parametrize("rationalize", [False, True])
def test_only_verified_finished_distinct_rationales_are_kept(rationalize):
    engine = ScriptedEngine(SCRIPT)
    kept, stats = verified_rationales(engine, StubVerifier(), [A, B, C], 4, None, rationalize, distinct=True)
    expected = [(A.prompt, "ok one"), (A.prompt, "ok two")]
    if rationalize:
        expected += [(B.prompt, "ok hinted"), (B.prompt, "ok hinted 2")]
    assert [(e.example.prompt, e.completion) for e in kept] == expected
    assert all(e.reward == 1.0 and e.details["stub"] for e in kept)
    assert all(e.response_logp == [0.0] * len(e.response_ids) for e in kept)  # SFT targets, no sampler log-probs
    assert stats["samples"] == 12 and stats["kept"] == len(expected) and stats["prompts_solved"] == pytest.approx(1 / 3)
    # B's only pass was cut off by the budget: not kept, so B (and C) are rationalised
    assert stats["rationalization_samples"] == (8 if rationalize else 0)
    assert stats["rationalized"] == (2 if rationalize else 0)
    tokens = sum(len(t) + f for p in (A, B, C) for t, f in SCRIPT[p.prompt])
    if rationalize:
        tokens += sum(len(t) + f for p in (B, C) for t, f in SCRIPT[with_answer_hint(p).prompt])
    assert stats["tokens"] == tokens
    if rationalize:  # the hinted prompts were sampled, but the rationales are trained on the plain prompt
        assert engine.calls[1] == [B.prompt + "Answer: 1\n", C.prompt + "Answer: 2\n"]
        for e in kept[2:]:
            assert e.example == B and e.details["rationalized"]
            assert e.prompt_ids == example_prompt_ids(TOKENIZER, B) and "Answer" not in TOKENIZER.decode(e.prompt_ids)
    assert [e.completion for e in verified_rationales(ScriptedEngine(SCRIPT), StubVerifier(), [A], 4, None, False,
                                                      distinct=False)[0]] == ["ok one", "ok one", "ok two"]


def test_step_check_drops_right_answers_from_wrong_chains():
    env = make_env("arithmetic")
    (problem,) = env.fixed_set("train", 1)
    right = env.solution(problem)  # e.g. "7+5=12,12+9=21,...\nFinal: 25"
    first, rest = right.split(",", 1)
    a, b = first.split("=")[0].split("+")
    wrong_step = f"{a}+{b}={int(a) + int(b) + 1}," + rest  # an off-by-one first sum, the right final answer
    script = {problem.prompt: [(right, True), (wrong_step, True), ("Final: 0", True)]}
    assert env.score(problem, wrong_step)["reward"] == 1.0  # the outcome verifier lets it through
    outcome_only, _ = verified_rationales(ScriptedEngine(script), env, [problem], 3, None, False, True)
    checked, stats = verified_rationales(ScriptedEngine(script), env, [problem], 3, None, False, True, step_check=True)
    assert [e.completion for e in outcome_only] == [right, wrong_step]
    assert [e.completion for e in checked] == [right] and stats["step_rejected"] == 1 and stats["kept"] == 1


def test_answer_hint_is_a_line_after_the_prompt_and_ends_the_last_user_turn():
    assert HINT.format(answer=7) == "Answer: 7\n"
    assert with_answer_hint(Example("Q: 3+4", "7")).prompt == "Q: 3+4\nAnswer: 7\n"
    chat = Example("Q: 3+4\n", "7", meta={PROMPT_MESSAGES: [{"role": "system", "content": "be brief"},
                                                            {"role": "user", "content": "Q: 3+4"},
                                                            {"role": "assistant", "content": "?"}]})
    turns = with_answer_hint(chat).meta[PROMPT_MESSAGES]
    assert turns[1]["content"] == "Q: 3+4\nAnswer: 7\n" and turns[0]["content"] == "be brief"
    assert chat.meta[PROMPT_MESSAGES][1]["content"] == "Q: 3+4"  # the original is left alone


TINY_STAR = [
    "--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
    "--env.arithmetic.level", "2", "--env.cot", "false",
    "--sft.num_examples", "200", "--sft.steps", "80", "--sft.batch_size", "32", "--sft.lr", "1e-2",
    "--sft.warmup_steps", "2", "--heldout_size", "32", "--rl.dev_size", "8", "--threads", "1",
    "--checkpoint_every", "2",
    "--star.iterations", "2", "--star.prompts", "16", "--star.samples_per_prompt", "4", "--star.steps", "3",
    "--star.batch_size", "8", "--star.lr", "1e-3", "--star.warmup_steps", "1", "--star.rationalize", "true",
]


def test_star_end_to_end_trains_only_on_verified_data_changes_the_weights_and_resumes(tmp_path, monkeypatch):
    trained_on = []
    real_fine_tune = star_module.fine_tune

    def recording_fine_tune(run, stage, demos, *args, **kwargs):
        trained_on.append((stage, [(e.example.prompt, e.completion) for e in demos]))
        return real_fine_tune(run, stage, demos, *args, **kwargs)

    monkeypatch.setattr(star_module, "fine_tune", recording_fine_tune)
    assert main(["star", *TINY_STAR, "--out_dir", str(tmp_path)]) == 0
    run = only_run(tmp_path)
    log = json.loads((run / "star_iterations.json").read_text())
    env = make_env("arithmetic", level=2, cot=False)
    assert [stage for stage, _ in trained_on] == ["star0", "star1"]
    for i, (_, pairs) in enumerate(trained_on):
        rows = [json.loads(line) for line in (run / f"star_data_{i}.jsonl").read_text().splitlines()]
        assert pairs == [(r["prompt"], r["completion"]) for r in rows] and len(rows) == log["iterations"][i]["kept"] > 0
        # every trained rationale passes the real verifier on its hint-free prompt
        assert all(env.score(Example(p, r["expected_answer"]), c)["reward"] == 1.0 for (p, c), r in zip(pairs, rows))
        assert all("Answer:" not in p for p, _ in pairs)
        record = log["iterations"][i]
        assert record["samples"] == 16 * 4 and record["tokens"] > record["samples"]
        assert record["rationalization_samples"] == 4 * round(16 * (1 - record["prompts_solved"]))
        assert 0 <= record["heldout"]["ci_low"] <= record["heldout"]["mean"] <= record["heldout"]["ci_high"] <= 1
    start = load_checkpoint_model(run / "checkpoints" / "sft" / "step_000079")
    after = load_checkpoint_model(run / "checkpoints" / "star1" / "step_000002")
    changed = [name for name, w in start.state_dict().items() if not torch.equal(w, after.state_dict()[name])]
    assert len(changed) == len(start.state_dict())  # every tensor moved

    # killed after iteration 0: the resume retrains iteration 1 on its saved data, to the same result
    first = log["iterations"][1]["heldout"]
    (run / "star_iterations.json").write_text(json.dumps({**log, "iterations": log["iterations"][:1]}))
    shutil.rmtree(run / "checkpoints" / "star1")
    trained_on.clear()
    assert main(["star", "--resume", str(run)]) == 0
    assert [stage for stage, _ in trained_on] == ["star1"]
    assert json.loads((run / "star_iterations.json").read_text())["iterations"][1]["heldout"] == first


def test_star_refuses_bad_settings_with_the_setting_named(tmp_path, capsys):
    assert main(["star", "--star.iterations", "0", "--out_dir", str(tmp_path)]) == 2
    assert "star.iterations=0" in capsys.readouterr().err
    assert main(["star", "--grpo.kl_coef", "0.1", "--out_dir", str(tmp_path)]) == 2
    assert "--grpo.kl_coef" in capsys.readouterr().err
    assert main(["star", "--env.name", "tool_arithmetic", "--model.max_seq_len", "128",
                 "--out_dir", str(tmp_path)]) == 2
    assert "multi-turn" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before any run directory was made


def test_star_help_shows_every_setting_with_its_reason(capsys):
    entries = help_entries(help_of(capsys, "star", "--help-all"))  # --help: the sections star reads
    star_flags = [f"--star.{f.name}" for f in dataclasses.fields(StarConfig)]
    for flag in leaf_flags(TrainConfig) + star_flags + ["--config", "--resume"]:
        if flag == "--rl.algo_params":
            continue
        assert flag in entries, f"{flag} missing from `posttrain star --help`"
        assert len(reason(entries[flag]).split()) >= 3, f"{flag}: {entries[flag]!r} gives no reason"


def test_majority_vote_of_the_comparison_picks_the_most_common_parsed_answer():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "selection_vs_rft_vs_rl.py"
    spec = importlib.util.spec_from_file_location("selection_vs_rft_vs_rl", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def votes(*parsed):
        return [Episode(A, 0, [], [], [], completion=str(i), details={"parsed": p}) for i, p in enumerate(parsed)]

    assert bench.majority_answer(votes(3, 5, 5, None, None, None)).completion == "1"  # unparsed answers never win
    assert bench.majority_answer(votes(7, 5, 5, 7)).completion == "0"  # a tie goes to the answer seen first
    assert bench.majority_answer(votes(None, None)).completion == "0"  # nothing parsed: the first sample
