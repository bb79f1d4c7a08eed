"""Process rewards and search on a reasoning-gym task, which has no step checker: worked-step
demonstrations (envs/reasoning_gym_tasks.py), the answer_tag step format, Monte-Carlo step
labels against a scripted policy whose labels are known by hand, `posttrain prm --labels mc`
and `posttrain search` at a tiny scale, with every budget counted."""

import json
import re
from collections import Counter

import pytest
import torch

from posttrain.cli import main
from posttrain.config.commands import PrmConfig
from posttrain.config import ConfigError, EnvConfig, ReasoningGymConfig, SamplingParams
from posttrain.envs import make_env
from posttrain.models import load_checkpoint_model
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines import prm_labels
from posttrain.rewards.monte_carlo_labels import monte_carlo_step_labels
from posttrain.rewards.process_reward_model import get_step_format, save_step_reward_model, task_step_format
from posttrain.rewards.reward_model import RewardModel
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_STRING, STOP_TOKEN, Continuation
from posttrain.config.scoring import SearchConfig
from posttrain.search.budget import Problem, sample_completions
from posttrain.search.mcts import mcts
from posttrain.search.methods import beam_search, greedy
from posttrain.types import Episode

reasoning_gym = pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (pip install 'posttrain[tasks]')")

TOK = CharTokenizer()
FMT = get_step_format("answer_tag")
TASK = {"min_animals": 2, "max_animals": 3, "max_instances": 3}
FLAGS = ["--env.name", "reasoning_gym:leg_counting", "--env.reasoning_gym.task_config", json.dumps(TASK),
         "--env.spec_version", "reasoning_gym/answer-tag-exact-v1"]
LEGS = reasoning_gym.arithmetic.leg_counting.ANIMALS


@pytest.fixture(scope="module")
def env():
    return make_env("reasoning_gym:leg_counting", task_config=TASK, spec_version="reasoning_gym/answer-tag-exact-v1",
                    worked_steps=True)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# --- a scripted policy that writes leg_counting's worked steps ----------------------------------


def animals_of(prompt):
    """[(count, singular name, as written), ...] from the question's list."""
    listed = re.search(r"if you have (.*)\?\n", prompt).group(1).split(", ")
    out = []
    for item in listed:
        count, name = item.split(" ", 1)
        out.append((int(count), name[:-1] if int(count) > 1 else name, item))
    return out


def next_line(animals, written, wrong):
    """The line after the complete lines `written`, from the running total as written; a
    wrong line's product (or answer) is one too high."""
    if len(written) == len(animals):
        total = int(written[-1].rsplit("=", 1)[1])
        return f"<answer>{total + wrong}</answer>"
    count, name, item = animals[len(written)]
    product = count * LEGS[name] + wrong
    line = f"{item}: {count}*{LEGS[name]}={product}"
    if written:
        total = int(written[-1].rsplit("=", 1)[1])
        line += f", {total}+{product}={total + product}"
    return line + "\n"


class ScriptedLegs:
    """Continues a leg_counting context: of the rows continuing one context in one call, the
    first writes every line wrong and the next right, alternately (`always_right`: every row
    right, from the total as written). With stop strings it writes one line; without, to the
    answer and EOS. Every row it draws is kept in `drawn` as (context, ids)."""

    def __init__(self, always_right=False):
        self.tokenizer, self.params, self.drawn, self.always_right = TOK, SamplingParams(max_new_tokens=120), [], always_right

    def continue_rows(self, contexts, budgets, generator=None, params=None, stop_strings=()):
        seen, rows = Counter(), []
        for context, budget in zip(contexts, budgets):
            wrong = 0 if self.always_right else int(seen[tuple(context)] % 2 == 0)
            seen[tuple(context)] += 1
            prompt, completion = TOK.decode(context).split("</answer>.\n", 1)
            animals, text = animals_of(prompt), ""
            while True:
                written = [line for line in (completion + text).split("\n")[:-1] if line]
                text += next_line(animals, written, wrong)
                if stop_strings or text.endswith("</answer>"):
                    break
            ids = TOK.encode(text) + ([TOK.eos_id] if text.endswith("</answer>") else [])
            stop = STOP_TOKEN if text.endswith("</answer>") else STOP_STRING
            if len(ids) > budget:
                ids, stop = ids[:budget], STOP_BUDGET
            self.drawn.append((context, ids))
            rows.append(Continuation(ids, [0.0] * len(ids), TOK.decode(ids[:-1] if stop == STOP_TOKEN else ids), stop))
        return rows

    def generate(self, examples, samples_per_prompt=1, generator=None, params=None):
        contexts = [[TOK.bos_id] + TOK.encode(e.prompt) for e in examples for _ in range(samples_per_prompt)]
        rows = self.continue_rows(contexts, [120] * len(contexts))
        return [Episode(examples[i // samples_per_prompt], i // samples_per_prompt, c, r.token_ids, r.logp, r.text)
                for i, (c, r) in enumerate(zip(contexts, rows))]


class LegOracle:
    """A step scorer that knows the legs: 1.0 while every line so far is right (a PRM with
    first-error labels, as a perfect one would score)."""

    def score_steps(self, prompts, steps):
        out = []
        for prompt, lines in zip(prompts, steps):
            animals, scores, ok = animals_of(prompt), [], True
            for k, line in enumerate(lines):
                ok = ok and k <= len(animals) and line + ("\n" if "<answer>" not in line else "") == next_line(
                    animals, lines[:k], 0)
                scores.append(float(ok))
            out.append(scores)
        return out


# --- worked steps and their format ---------------------------------------------------------


def test_worked_steps_by_hand_and_full_credit(env):
    example = next(e for e in env.fixed_set("train", 200) if len(e.meta["entry"]["metadata"]["animals"]) == 3)
    animals = animals_of(example.prompt)
    solution = env.solution(example)
    a, b, c = (count * LEGS[name] for count, name, _ in animals)
    assert solution == (f"{animals[0][2]}: {animals[0][0]}*{LEGS[animals[0][1]]}={a}\n"
                        f"{animals[1][2]}: {animals[1][0]}*{LEGS[animals[1][1]]}={b}, {a}+{b}={a + b}\n"
                        f"{animals[2][2]}: {animals[2][0]}*{LEGS[animals[2][1]]}={c}, {a + b}+{c}={a + b + c}\n"
                        f"<answer>{a + b + c}</answer>")
    assert env.score(example, solution)["reward"] == 1.0
    assert all(env.score(e, env.solution(e))["reward"] == 1.0 for e in env.fixed_set("heldout", 50))
    # the scripted policy writes exactly the demonstrations when right
    assert ScriptedLegs(always_right=True).generate([example])[0].completion == solution
    chain = make_env("reasoning_gym:chain_sum", worked_steps=True, task_config={"min_terms": 3, "max_terms": 3})
    item = chain.fixed_set("train", 1)[0]
    x, op1, y, op2, z = item.meta["entry"]["metadata"]["expression"].split()
    first = int(x) + int(y) if op1 == "+" else int(x) - int(y)
    second = first + int(z) if op2 == "+" else first - int(z)
    assert chain.solution(item) == f"{x} {op1} {y} = {first}\n{first} {op2} {z} = {second}\n<answer>{second}</answer>"
    assert make_env("reasoning_gym:chain_sum").solution(item) == f"<answer>{second}</answer>"  # off by default


def test_worked_steps_need_a_step_writer():
    with pytest.raises(ValueError, match=r"no step writer.*one of \['aiw', 'chain_sum', 'leg_counting'\]"):
        make_env("reasoning_gym:gcd", worked_steps=True)
    with pytest.raises(ValueError, match="true or false"):
        make_env("reasoning_gym:chain_sum", worked_steps=1)


def test_the_answer_tag_format_splits_lines_and_ends_at_the_answer():
    text = "2 cats: 2*4=8\n1 crab: 1*10=10, 8+10=18\n<answer>18</answer>"
    steps = FMT.split(text)
    assert steps == ["2 cats: 2*4=8", "1 crab: 1*10=10, 8+10=18", "<answer>18</answer>"]
    assert FMT.join(steps) == text and FMT.ends(steps[-1]) and not FMT.ends(steps[0])
    assert task_step_format("reasoning_gym:leg_counting") == "answer_tag"
    assert task_step_format("arithmetic") == "arithmetic" and task_step_format("jsonl") == "newline"


# --- Monte-Carlo labels on the task's format --------------------------------------------------


def test_monte_carlo_labels_follow_the_first_wrong_line(env):
    """A policy that always continues right from the total as written: a rollout succeeds
    exactly when the prefix holds no wrong line, so the labels are the first-error labels."""
    example = next(e for e in env.fixed_set("train", 200) if len(e.meta["entry"]["metadata"]["animals"]) == 3)
    right = FMT.split(env.solution(example))
    animals = animals_of(example.prompt)
    wrong_second = [right[0]]
    wrong_second.append(next_line(animals, wrong_second, 1).rstrip("\n"))  # its product one too high
    wrong_second.append(next_line(animals, wrong_second, 0).rstrip("\n"))  # right, from the wrong total
    wrong_second.append(next_line(animals, wrong_second, 0))  # the answer line: that total
    engine = ScriptedLegs(always_right=True)
    labels = monte_carlo_step_labels(engine, [example, example], [right, wrong_second], env.score, n_rollouts=3,
                                     max_new_tokens=120, separators=FMT.separators)
    assert labels[0].soft == [1.0, 1.0, 1.0, 1.0] and labels[1].soft == [1.0, 0.0, 0.0, 0.0]
    assert labels[1].hard == [True, False, False, False]
    assert labels[0].tokens + labels[1].tokens == sum(len(ids) for _, ids in engine.drawn)  # every token counted
    # a rollout's budget is what its prefix leaves of the completion's cap: prefix + rollout fits
    prompt = len(TOK.encode(example.prompt)) + 1
    assert all(len(context) - prompt + len(ids) <= 120 for context, ids in engine.drawn)
    # alternating rollouts (the first wrong, the next right): a right prefix scores 1/2
    alternating = monte_carlo_step_labels(ScriptedLegs(), [example], [right], env.score, n_rollouts=2,
                                          max_new_tokens=120, separators=FMT.separators)
    assert alternating[0].soft == [0.5, 0.5, 0.5, 1.0] and alternating[0].hard == [True] * 4


def test_the_audit_of_monte_carlo_labels_against_the_demonstrations_lines(env, tmp_path):
    import importlib.util
    from pathlib import Path

    from posttrain.data.stepwise import save_stepwise_jsonl
    from posttrain.rewards.process_reward_model import StepRecord

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "mc_labels_audit.py"
    spec = importlib.util.spec_from_file_location("mc_labels_audit", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    example = next(e for e in env.fixed_set("train", 200) if len(e.meta["entry"]["metadata"]["animals"]) == 3)
    right = FMT.split(env.solution(example))
    assert bench.demonstration(example.prompt) == right
    wrong = [right[0], right[1].replace("=", "=1", 1)] + right[2:]  # the second line's product: wrong
    assert bench.true_labels(example.prompt, wrong) == [True, False, False, False]
    # a miscopied animal changes no number: counted apart, not wrong
    typo = [right[0], "7 unicorns:" + right[1].split(":", 1)[1]] + right[2:]
    assert bench.true_labels(example.prompt, typo) == [True] * 4 and bench.miscopied(example.prompt, typo) == 1
    # Monte-Carlo labels that call one right step wrong (of 5) and one wrong step right (of 3)
    records = [StepRecord(example.prompt, right, [1.0, 0.0, 1.0, 1.0], 1.0),
               StepRecord(example.prompt, wrong, [1.0, 1.0, 0.0, 0.0], 0.0)]
    save_stepwise_jsonl(records, tmp_path / "labels.jsonl")
    result = bench.audit(tmp_path / "labels.jsonl")
    assert (result["steps"], result["truly_wrong_steps"], result["steps_not_a_leg_line"]) == (8, 3, 0)
    assert result["lines_with_a_miscopied_animal"] == 0
    assert result["disagreement"]["mean"] == 2 / 8
    assert result["right_steps_labelled_wrong"]["mean"] == 1 / 5
    assert result["wrong_steps_labelled_right"]["mean"] == 1 / 3


# --- the commands at a tiny scale ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("policy") / "gpt_mini"
    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                          max_seq_len=352)).save_pretrained(directory, TOK)
    return directory


def test_prm_with_monte_carlo_labels_on_the_scripted_policy(tmp_path, tiny_checkpoint, monkeypatch, env):
    """Of each prompt's two samples the first writes every line wrong and the second every
    line right; rollouts from a wrong prefix continue from its wrong total and all fail, and
    from a right one half succeed: hard labels all 0 and all 1, soft 0 and 1/2."""
    engines = []
    monkeypatch.setattr(prm_labels, "make_engine", lambda *a, **k: engines.append(ScriptedLegs()) or engines[-1])
    args = ["prm", "--init", str(tiny_checkpoint), *FLAGS, "--labels", "mc", "--mc_rollouts", "2", "--prompts", "6",
            "--heldout_prompts", "3", "--samples_per_prompt", "2", "--max_new_tokens", "120", "--steps", "4",
            "--out_dir", str(tmp_path / "runs")]
    assert main(args) == 0
    run = next((tmp_path / "runs").iterdir())
    rows = [json.loads(line) for line in (run / "prm_train.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and all(row["completions"][-1].startswith("<answer>") for row in rows)
    assert [row["labels"] for row in rows[0::2]] == [[False] * len(row["labels"]) for row in rows[0::2]]
    assert [row["labels"] for row in rows[1::2]] == [[True] * len(row["labels"]) for row in rows[1::2]]
    assert [row["outcome"] for row in rows] == [0.0, 1.0] * 6
    samples = json.loads((run / "summary.json").read_text())["data"]["samples"]["train"]
    assert samples["outcome_correct"] == 0.5 and samples["completions_with_a_wrong_step"] == 0.5
    mc_drawn = sum(len(ids) for _, ids in engines[0].drawn[12:])  # after the 12 samples: the rollouts
    assert samples["mc_tokens"] == mc_drawn and "labels_agree_with_the_step_checker" not in samples
    assert "Monte-Carlo" in (run / "summary.md").read_text()
    # soft labels: a right prefix is worth 1/2 under this policy, the last step its verdict
    soft_cfg = PrmConfig(labels="mc", mc_label="soft", mc_rollouts=2, samples_per_prompt=2)
    records, _ = prm_labels.labelled_samples(soft_cfg, env, "answer_tag", 120, None, TOK, "train", 3)
    assert [r.labels for r in records[1::2]] == [[0.5] * (len(r.steps) - 1) + [1.0] for r in records[1::2]]
    assert all(set(r.labels) == {0.0} for r in records[0::2])
    # the ORM on the same samples, from the PRM run's files
    assert main(["prm", "--kind", "orm", "--init", str(tiny_checkpoint), *FLAGS, "--data", str(run / "prm_train.jsonl"),
                 "--heldout_data", str(run / "prm_heldout.jsonl"), "--steps", "2", "--out_dir",
                 str(tmp_path / "orm")]) == 0
    orm = json.loads((next((tmp_path / "orm").iterdir()) / "summary.json").read_text())
    assert orm["data"]["train_records"] == 12 and orm["heldout"]["heldout_completions"] == 6
    assert orm["data"]["step_format"] == "answer_tag"


def test_prm_refuses_what_it_cannot_label(tmp_path, tiny_checkpoint, capsys):
    base = ["prm", "--init", str(tiny_checkpoint), *FLAGS, "--out_dir", str(tmp_path)]
    assert main(base) == 2 and "labels='checker' is not allowed: expected mc for env" in capsys.readouterr().err
    assert main(base + ["--labels", "mc", "--kind", "orm"]) == 2
    assert "an ORM trains on outcomes alone" in capsys.readouterr().err
    assert main(["prm", *FLAGS, "--labels", "mc", "--out_dir", str(tmp_path)]) == 2
    assert "without --init the policy is `posttrain run`'s SFT" in capsys.readouterr().err
    assert main(base + ["--labels", "mc", "--step_format", "arithmetic"]) == 2
    assert "split by its own format" in capsys.readouterr().err
    assert main(["prm", "--heldout_data", str(tmp_path)]) == 2 and "without --data" in capsys.readouterr().err


# --- search: budgets on the task's format, and the command --------------------------------------


def tiny_engine():
    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                                  max_seq_len=352))
    return RolloutEngine(model, TOK, SamplingParams(max_new_tokens=60))


@pytest.mark.parametrize("limit", [1, 40, 160])
def test_search_on_the_task_never_exceeds_its_budget_and_finds_the_right_lines(env, limit):
    examples = env.fixed_set("heldout", 2)
    for engine in (ScriptedLegs(), tiny_engine()):
        if isinstance(engine, RolloutEngine):  # record the real sampler's draws the way the scripted one does
            inner, engine.drawn = engine.continue_rows, []
            engine.continue_rows = lambda c, b, *a, _i=inner, _e=engine, **k: (
                lambda rows: _e.drawn.extend(zip(c, [r.token_ids for r in rows])) or rows)(_i(c, b, *a, **k))
        runs = {"greedy": lambda p: greedy(engine, p, 120),
                "samples": lambda p: sample_completions(engine, p, 3, 120, torch.Generator().manual_seed(0)),
                "beam": lambda p: beam_search(engine, p, LegOracle(), FMT, ("\n",), 2, 2, 48, 120, torch.Generator()),
                "mcts": lambda p: mcts(engine, p, LegOracle(), FMT, ("\n",), 2, 48, 120, generator=torch.Generator())}
        for name, run in runs.items():
            engine.drawn.clear()
            problems = Problem.of(examples, TOK, limit)
            run(problems)
            counted = Counter()
            for context, ids in engine.drawn:
                counted[next(p.example.id for p in problems if context[: len(p.prompt_ids)] == p.prompt_ids)] += len(ids)
            assert all(p.budget.spent == counted[p.example.id] <= limit for p in problems), name


def test_search_guided_by_a_step_oracle_keeps_the_right_lines(env):
    """The scripted policy's first draw of every line is wrong: greedy is wrong, beam search
    and MCTS guided by a scorer that knows the legs find the demonstration."""
    examples = env.fixed_set("heldout", 2)
    answers = beam_search(ScriptedLegs(), Problem.of(examples, TOK, 2000), LegOracle(), FMT, ("\n",), 2, 2, 48, 120)
    assert [a.text for a in answers] == [env.solution(e) for e in examples]
    answers = mcts(ScriptedLegs(), Problem.of(examples, TOK, 4000), LegOracle(), FMT, ("\n",), 2, 48, 120)
    assert [a.text for a in answers] == [env.solution(e) for e in examples]
    assert not any(a.text == env.solution(e) for a, e in zip(greedy(ScriptedLegs(), Problem.of(examples, TOK, 400),
                                                                    120), examples))


def test_a_completion_without_an_answer_casts_no_vote(env):
    from posttrain.search.budget import Partial
    from posttrain.search.compare import answer_of
    from posttrain.search.methods import majority_vote

    example = env.fixed_set("heldout", 1)[0]
    assert answer_of(env, example, "1 cat: 1*4=4\n<answer>4</answer>") == "4"
    assert answer_of(env, example, "1 cat: 1*4=4") is None
    votes = [Partial([0], "no answer", True), Partial([0], "nor here", True), Partial([0], "<answer>4</answer>", True)]
    assert majority_vote(votes, lambda text: answer_of(env, example, text)) is votes[2]


def test_the_search_command_on_the_task_leaves_the_step_oracle_out(tmp_path, tiny_checkpoint):
    from posttrain.pipelines.checks import check_config
    from posttrain.search.compare import run_search

    model = RewardModel.from_policy(load_checkpoint_model(tiny_checkpoint))  # untrained: any scores will do
    save_step_reward_model(model, tmp_path / "prm", TOK, "prm", "answer_tag")
    task = EnvConfig(name="reasoning_gym:leg_counting", reasoning_gym=ReasoningGymConfig(task_config=json.dumps(TASK)),
                     spec_version="reasoning_gym/answer-tag-exact-v1")
    cfg = SearchConfig(checkpoint=str(tiny_checkpoint), env=task, size=3, budgets="30,120", max_new_tokens=30,
                       prm=str(tmp_path / "prm"), step_tokens=12, out_dir=str(tmp_path / "runs"))
    check_config(cfg)
    summary = run_search(cfg)
    methods = {r["method"] for r in summary["rows"]}
    assert {"beam 1x2 (PRM)", "beam 2x2 (PRM)", "MCTS (PRM)", "best-of-4 (PRM min)", "best-of-4 (verifier)"} <= methods
    assert not any("oracle" in m for m in methods)  # no step checker for this task: left out, no error
    assert all(r["tokens_spent"] <= max(r["budget"], 30) for r in summary["rows"])
    with pytest.raises(ConfigError, match="reads steps in the 'answer_tag' format"):
        run_search(SearchConfig(**{**vars(cfg), "step_format": "arithmetic"}))
