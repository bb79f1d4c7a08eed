"""Joint rewards on multi-turn episodes (Kimi K2's joint RL): the agent loop stacks
rl.reward.terms on the environment's verdict, the agentic terms read the tool calls, GDPO
normalises each term; and search_qa, the web archetype offline: its BM25 search tool ranks
the right document, and its verifier pays the right answer, never the copied snippet."""

import json
import math

import pytest

from posttrain.cli import main
from posttrain.config import ConfigError, SamplingParams, TrainConfig
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.envs.corpus_search import CORPUS_PATH, SearchIndex, generate_corpus, search_tool
from posttrain.envs.search_qa import SearchQAEnv
from posttrain.envs.tool_arithmetic import ToolArithmeticEnv
from posttrain.envs.tools import ToolCall, ToolRegistry
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.turn_checks import check_multi_turn
from posttrain.rewards.agentic import OnTranscript, ToolCallCost, ToolCallValidity, UsedToolResult
from posttrain.rewards.rubric import rule_based_rubric
from posttrain.rewards.stack import Accuracy, RewardStack
from posttrain.rewards.user_function import StackOnVerdict
from posttrain.roles.agent import AgentLoop
from posttrain.roles.engines.contract import STOP_TOKEN, Continuation

TOK = CharTokenizer()
ENV = SearchQAEnv()


class ScriptedEngine:
    """Writes, for each prompt, the turns of a script: the k-th model turn of an episode is
    script[prompt][k] (k = the observations so far), each ended by EOS."""

    def __init__(self, scripts: dict[str, list[str]], max_seq_len: int = 1000):
        self.tokenizer, self.params, self.max_seq_len, self.weight_version = TOK, SamplingParams(max_new_tokens=96), \
            max_seq_len, 0
        self.scripts = scripts

    def continue_rows(self, contexts, budgets, generator=None, params=None, stop_strings=()):
        rows = []
        for context in contexts:
            text = TOK.decode(context)
            prompt = text.split("\n", 1)[0] + "\n"
            turn = self.scripts[prompt][text.count("</tool_result>") + text.count("</tool_error>")]
            ids = TOK.encode(turn) + [TOK.eos_id]
            rows.append(Continuation(ids, [0.0] * len(ids), turn, STOP_TOKEN))
        return rows


def joint_stack() -> RewardStack:
    return RewardStack([(1.0, Accuracy()), (0.2, ToolCallValidity()), (0.1, UsedToolResult()),
                        (0.05, ToolCallCost()), (0.1, OnTranscript(rule_based_rubric(), "transcript_rubric"))])


def episodes_of(scripts: dict[str, list[str]], examples, env=ENV, stack=None):
    loop = AgentLoop(env, reward=StackOnVerdict(stack or joint_stack()))
    return loop(ScriptedEngine(scripts), examples, 1)


# --- the reward stack on an episode -------------------------------------------------------------


def test_each_term_scores_the_episode_and_the_verifier_pays_the_answer_not_the_copied_snippet():
    example = ENV.fixed_set("heldout", 1)[0]  # "Q: Tenen bridges*wells": 15 bridges, 19 wells, 285
    assert (example.prompt, example.expected_answer) == ("Q: Tenen bridges*wells\n", "285")
    right = ENV.demonstration_turns(example)
    hack = ENV.hack_turns(example)
    assert hack == ["<tool_call>search: Tenen</tool_call>", "Final: 15"]
    [solved] = episodes_of({example.prompt: right}, [example])
    [copied] = episodes_of({example.prompt: hack}, [example])
    # the verifier recomputes bridges*wells: it pays 285, never the 15 copied from the snippet
    assert solved.details["components"]["accuracy"] == 1.0 and copied.details["components"]["accuracy"] == 0.0
    assert copied.details["answer"]["reason"] == "wrong_answer" and not copied.details["correct"]
    # the evidence check (used_tool_result) pays both: the copy is grounded in what it retrieved
    assert solved.details["components"]["used_tool_result"] == 1.0
    assert copied.details["components"]["used_tool_result"] == 1.0
    # two clean calls and one: validity 1 both, the cost −2 and −1
    assert solved.details["components"]["tool_validity"] == copied.details["components"]["tool_validity"] == 1.0
    assert (solved.details["components"]["call_cost"], copied.details["components"]["call_cost"]) == (-2.0, -1.0)
    # the sum of the weighted terms is the reward: 1 + 0.2 + 0.1 − 0.1 + 0.1 × rubric
    rubric = solved.details["components"]["transcript_rubric"]
    assert solved.reward == pytest.approx(1.2 + 0.1 * rubric)
    assert copied.reward == pytest.approx(0.0 + 0.2 + 0.1 - 0.05 + 0.1 * copied.details["components"]["transcript_rubric"])
    # the transcript rubric read the whole episode, tool results included (its length criterion counts them)
    length = solved.details["term_details"]["transcript_rubric"]["criteria"]["length"]["reason"]
    assert length.startswith(f"{len(solved.completion)} within")
    assert len(solved.completion) > len("Final: 285") + 100


def test_malformed_calls_lower_validity_and_an_episode_a_budget_ends_keeps_its_calls():
    example = ENV.fixed_set("heldout", 1)[0]
    script = ["<tool_call>serch: Tenen</tool_call>", "<tool_call>search: Tenen</tool_call>",
              "<tool_call>calculator: 15*19</tool_call>", "<tool_call>calculator: 15*19</tool_call>"]
    [episode] = episodes_of({example.prompt: script}, [example], env=SearchQAEnv(max_total_tokens=800))
    # a malformed call (unknown tool), then three that ran; the fourth turn is the last: max_turns, reward 0
    assert episode.details["reason"] == "max_turns" and episode.details["components"]["accuracy"] == 0.0
    assert episode.details["components"]["tool_validity"] == pytest.approx(2 / 3)  # 2 ran of 3 attempts
    assert episode.details["components"]["call_cost"] == -3.0
    short = SearchQAEnv(max_turns=10, max_total_tokens=150)  # the budget runs out mid-episode
    [cut] = episodes_of({example.prompt: script[1:] * 3}, [example], env=short)
    assert cut.details["budget_exhausted"] == "max_total_tokens"
    assert cut.details["n_tool_calls"] == 2 and cut.details["components"]["call_cost"] == -2.0  # not free


def test_an_agentic_term_on_an_environment_without_tool_calls_names_itself():
    stack = RewardStack([(1.0, Accuracy()), (0.2, ToolCallValidity())])
    with pytest.raises(ValueError, match="reward term tool_validity reads the tool calls a tool environment records"):
        stack(ENV.fixed_set("heldout", 1)[0], "Final: 1", {"reward": 1.0, "details": {"reason": "ok"}})


# --- the search tool ------------------------------------------------------------------------------


def test_bm25_ranks_a_towns_own_document_first_and_its_neighbours_next():
    records = generate_corpus()
    index = SearchIndex.load()
    town = records[0]  # "Zedoputh has 45 towers, ... Zedoputh lies east of Sasi."
    assert town["text"].startswith("Zedoputh has 45 towers")
    mentions = [r["id"] for r in records if r["neighbour"] == "Zedoputh"]
    hits = index.search("Zedoputh", k=1 + len(mentions))
    assert hits[0][0] == 0  # its own document names it twice
    assert sorted(doc for doc, _ in hits[1:]) == sorted(mentions)  # those naming it once, as a neighbour
    assert hits[0][1] > hits[1][1]
    # every town's own document ranks first for its name
    assert all(index.search(r["name"], 1)[0][0] == r["id"] for r in records)
    assert index.search("nothing here", 3) == []
    registry = ToolRegistry([search_tool(index)])
    result = registry.call(ToolCall("search", {"query": "Zedoputh"}))
    assert result.ok and result.output == town["text"]


def test_bm25_scores_a_small_corpus_as_worked_by_hand():
    index = SearchIndex(["cat cat dog", "dog", "bird"])
    # N = 3, avgdl = 5/3; idf(cat) = ln(1 + 2.5/1.5) = 0.98083; tf 2 in a 3-term document:
    # k1·(1 − b + b·3/(5/3)) = 1.5 · 1.6 = 2.4, so 0.98083 · 2 · 2.5 / (2 + 2.4) = 1.11458
    assert index.search("cat", 3) == [(0, pytest.approx(math.log(1 + 2.5 / 1.5) * 5 / 4.4))]
    assert index.search("cat", 3)[0][1] == pytest.approx(1.11458, abs=1e-5)
    assert [doc for doc, _ in index.search("dog", 3)] == [1, 0]  # the shorter document first


def test_the_bundled_corpus_is_what_the_generator_writes():
    lines = CORPUS_PATH.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == generate_corpus()
    for r in generate_corpus():  # no copied count is ever the answer to a question about two others
        values = [r["towers"], r["bridges"], r["wells"]]
        assert len(set(values)) == 3
        for i, v in enumerate(values):
            x, y = [values[j] for j in range(3) if j != i]
            assert v not in (x + y, x * y)


def test_search_qa_splits_are_disjoint_and_its_demonstrations_score_1():
    splits = {split: {e.prompt for e in ENV.fixed_set(split, 100)} for split in ("train", "dev", "heldout")}
    assert not (splits["train"] & splits["dev"] or splits["train"] & splits["heldout"] or splits["dev"] & splits["heldout"])
    assert len(ENV.fixed_set("heldout", 500)) == 500  # the default heldout_size fits
    for example in ENV.fixed_set("dev", 5):
        segments = ENV.demonstration(example)  # raises unless the episode's answer scores 1
        assert [source for source, _ in segments] == ["model", "environment"] * 2 + ["model"]


# --- the settings -----------------------------------------------------------------------------------


def test_what_a_multi_turn_episode_still_cannot_take_is_refused_with_the_reason():
    cfg = TrainConfig()
    cfg.env.name = "search_qa"
    cfg.rl.reward.terms = "accuracy + 0.2*tool_validity + 0.1*rubric + 0.1*transcript_rubric + -0.05*call_cost"
    check_multi_turn(cfg, ENV)  # the joint reward: accepted
    cfg.rl.rm.path = "runs/x/reward_model"
    with pytest.raises(ConfigError, match="a reward model learned from single completions"):
        check_multi_turn(cfg, ENV)
    cfg.rl.rm.path = ""
    cfg.rl.reward.length_reward = 0.5
    with pytest.raises(ConfigError, match="Kimi's length reward reads the response ids, tool results included"):
        check_multi_turn(cfg, ENV)
    cfg.rl.reward.length_reward = 0
    cfg.env.name, cfg.rl.reward.terms = "arithmetic", "accuracy + 0.2*used_tool_result"
    with pytest.raises(ConfigError, match=r"terms without \['used_tool_result'\] for env.name='arithmetic'"):
        check_multi_turn(cfg, ArithmeticEnv())
    cfg.env.name = "tool_arithmetic"
    check_multi_turn(cfg, ToolArithmeticEnv())


# --- a run -------------------------------------------------------------------------------------------


def test_a_joint_reward_run_on_search_qa_logs_each_term_and_normalises_each(tmp_path):
    tiny = ["--model.dim", "32", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "64",
            "--model.max_seq_len", "320", "--sft.num_examples", "16", "--sft.steps", "4", "--sft.batch_size", "8",
            "--sft.warmup_steps", "1", "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "4",
            "--rl.steps", "2", "--rl.eval_every", "2", "--rl.dev_size", "4", "--heldout_size", "4", "--threads", "1"]
    terms = "accuracy + 0.2*tool_validity + 0.1*rubric"
    assert main(["train", "--env.name", "search_qa", "--rl.reward.terms", terms, "--rl.reward.normalize", "per_term",
                 *tiny, "--out_dir", str(tmp_path)]) == 0
    (run,) = tmp_path.iterdir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("stage") == "rl"]
    assert len(rl) == 2
    for row in rl:  # each term on its own, summing to the reward; GDPO's per-term flat-group share
        parts = [row[f"reward/{name}"] for name in ("accuracy", "tool_validity", "rubric")]
        assert sum(parts) == pytest.approx(row["reward_mean"])
        assert 0 <= row["reward/tool_validity"] <= 0.2 and 0 <= row["reward/rubric"] <= 0.1
        assert all(0 <= row[f"reward_flat_groups/{name}"] <= 1 for name in ("accuracy", "tool_validity", "rubric"))
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    episode = next(s for s in samples if s["stage"] == "rl")
    assert episode["details"]["reward_spec"] == ("1*accuracy + 0.2*tool_validity + "
                                                 "0.1*rubric(final_answer:2,no_repetition:1,length:1)")
    assert episode["reward"] == pytest.approx(sum(episode["details"]["weighted"].values()))
