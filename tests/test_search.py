"""Test-time search (posttrain/search/): budgets never exceeded and counted exactly, each
method's choice on a scripted policy whose first draw of every step is wrong, and the
`posttrain search` command end to end on a tiny checkpoint."""

import json
from collections import Counter

import pytest
import torch

from posttrain.config import ConfigError, SamplingParams
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.process_reward_model import get_step_format
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_STRING, STOP_TOKEN, Continuation
from posttrain.config.scoring import SearchConfig
from posttrain.search.budget import Budget, Partial, Problem, extend_steps, sample_completions
from posttrain.search.mcts import mcts
from posttrain.search.methods import (
    NoisyScorer,
    OracleOutcomeScorer,
    OracleStepScorer,
    beam_search,
    greedy,
    majority_vote,
    pick_highest,
)
from posttrain.verifiers.final_int import get_spec
from posttrain.types import Example

TOK = CharTokenizer()
FMT = get_step_format("arithmetic")
SEPARATORS = (",", "\n")
EXAMPLES = [Example("Q: 1+2+3\n", "6", id="a"), Example("Q: 4+5+1+2\n", "12", id="b")]


class ScriptedEngine:
    """Writes arithmetic chains: of the rows continuing one context in one call, the first
    writes each step wrong (its sum one too high) and the next writes it right, alternately.
    Whole completions (no stop strings) come out right or wrong the same way. With
    `across_calls` the alternation runs over every draw from a context, not within a call
    (so a regrowth from the same context comes out the other way). Every row it draws is
    kept in `drawn` as (context, ids)."""

    def __init__(self, across_calls=False):
        self.tokenizer, self.params, self.drawn = TOK, SamplingParams(max_new_tokens=48), []
        self.across_calls, self.seen = across_calls, Counter()

    def continue_rows(self, contexts, budgets, generator=None, params=None, stop_strings=()):
        seen, rows = (self.seen if self.across_calls else Counter()), []
        for context, budget in zip(contexts, budgets):
            wrong = seen[tuple(context)] % 2 == 0
            seen[tuple(context)] += 1
            prompt, partial = TOK.decode(context).split("\n", 1)
            terms = [int(t) for t in prompt[3:].split("+")]
            text = ""
            while True:
                piece = next_step(terms, partial + text, wrong)
                text += piece
                if stop_strings or piece.startswith("Final") or piece == "":
                    break
            ids = TOK.encode(text) + ([TOK.eos_id] if text.startswith("Final") or "Final" in text else [])
            stop = STOP_TOKEN if ids and ids[-1] == TOK.eos_id else STOP_STRING
            if len(ids) > budget:
                ids, stop = ids[:budget], STOP_BUDGET
            self.drawn.append((context, ids))
            shown = ids[:-1] if stop == STOP_TOKEN else ids
            rows.append(Continuation(ids, [0.0] * len(ids), TOK.decode(shown), stop))
        return rows


def next_step(terms, written, wrong):
    """The next step after `written`, continuing from its last result as written."""
    if "Final" in written:
        return ""
    chain = [s for s in written.replace("\n", ",").split(",") if s]
    value = int(chain[-1].split("=")[1]) if chain else terms[0]
    if len(chain) == len(terms) - 1:
        return f"Final: {value}"
    total = value + terms[len(chain) + 1] + (1 if wrong else 0)
    return f"{value}+{terms[len(chain) + 1]}={total}" + ("\n" if len(chain) + 2 == len(terms) else ",")


def tiny_engine():
    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=96))
    return RolloutEngine(model, TOK, SamplingParams(max_new_tokens=24))


def correct(problem, partial):
    return partial is not None and partial.done and partial.text.endswith(f"Final: {problem.example.expected_answer}")


def spent_by_problem(engine, problems):
    """Tokens drawn per problem, counted from the engine's own record of every row."""
    counts = Counter()
    for context, ids in engine.drawn:
        owner = next(p for p in problems if context[: len(p.prompt_ids)] == p.prompt_ids)
        counts[owner.example.id] += len(ids)
    return counts


def test_the_scripted_policy_writes_a_wrong_step_first_and_a_right_one_second():
    engine, problems = ScriptedEngine(), Problem.of(EXAMPLES, TOK, 400)
    first, second = extend_steps(engine, [(problems[0], Partial())] * 2, SEPARATORS, 16, 48)
    assert (first.text, second.text) == ("1+2=4,", "1+2=3,") and not first.done
    whole = sample_completions(engine, problems[:1], 2, 48)[0]
    assert [w.text for w in whole] == ["1+2=4,4+3=8\nFinal: 8", "1+2=3,3+3=6\nFinal: 6"] and whole[0].done


def test_search_with_the_step_oracle_finds_the_right_chain_where_the_first_draw_is_wrong():
    for search in ("beam", "mcts"):
        engine, problems = ScriptedEngine(), Problem.of(EXAMPLES, TOK, 400)
        scorer = OracleStepScorer(EXAMPLES)
        if search == "beam":
            answers = beam_search(engine, problems, scorer, FMT, SEPARATORS, width=2, expansions=2, step_tokens=16,
                                  max_new_tokens=48)
        else:
            answers = mcts(engine, problems, scorer, FMT, SEPARATORS, children=2, step_tokens=16, max_new_tokens=48)
        assert [a.text for a in answers] == ["1+2=3,3+3=6\nFinal: 6", "4+5=9,9+1=10,10+2=12\nFinal: 12"], search
        assert all(correct(p, a) for p, a in zip(problems, answers))
    greedy_answers = greedy(ScriptedEngine(), Problem.of(EXAMPLES, TOK, 400), 48)  # the first draw: wrong
    assert not any(correct(p, a) for p, a in zip(problems, greedy_answers))


def test_the_outcome_oracle_is_the_verifier_and_pays_a_right_answer_reached_by_wrong_steps():
    orm, prm = OracleOutcomeScorer(EXAMPLES, get_spec("final_int/cot-v1")), OracleStepScorer(EXAMPLES)
    lucky = "1+2=4,4+3=6\nFinal: 6"  # the right answer after a wrong first step
    assert orm.score_outcomes([EXAMPLES[0].prompt] * 2, [lucky, "Final: 7"]) == [1.0, 0.0]
    assert prm.score_steps([EXAMPLES[0].prompt], [FMT.split(lucky)]) == [[0.0, 0.0, 0.0]]


def test_a_noisy_scorer_blends_in_a_fixed_hash_of_the_text():
    prompts, chain = [EXAMPLES[0].prompt], ["1+2=3", "3+3=6", "Final: 6"]
    exact = OracleStepScorer(EXAMPLES)
    assert NoisyScorer(exact, 0.0).score_steps(prompts, [chain]) == [[1.0, 1.0, 1.0]]
    half = NoisyScorer(exact, 0.5).score_steps(prompts, [chain])[0]
    assert all(0.5 <= s < 1.0 for s in half) and len(set(half)) == 3  # 0.5·1 + 0.5·u, u different per prefix
    # the same prefix scores the same in another completion and in another batch: a fixed
    # mistake, as a trained model's would be, not a fresh draw
    other = NoisyScorer(exact, 0.5).score_steps(prompts * 2, [chain[:2] + ["6+1=7"], chain[:1]])
    assert other[0][:2] == half[:2] and other[1] == half[:1]
    # noise 1 ignores the scorer: a right and a wrong step with the same text score alike
    wrong = OracleStepScorer([Example(EXAMPLES[0].prompt, "7")])
    assert NoisyScorer(exact, 1.0).score_steps(prompts, [chain]) == NoisyScorer(wrong, 1.0).score_steps(prompts, [chain])
    assert NoisyScorer(exact, 0.5, seed=1).score_steps(prompts, [chain])[0] != half  # the seed picks the mistakes
    outcome = NoisyScorer(OracleOutcomeScorer(EXAMPLES, get_spec("final_int/cot-v1")), 0.3)
    assert outcome.score_outcomes(prompts, ["Final: 6"])[0] >= 0.7 > outcome.score_outcomes(prompts, ["Final: 5"])[0]
    with pytest.raises(ValueError, match=r"noise must be in \[0, 1\].*got 1.5"):
        NoisyScorer(exact, 1.5)


@pytest.mark.parametrize("limit", [1, 7, 25, 60, 200])
def test_no_method_ever_spends_more_than_its_budget_and_every_token_is_counted(limit):
    for engine in (ScriptedEngine(), tiny_engine()):
        recorded = engine.continue_rows
        if isinstance(engine, RolloutEngine):  # record the real sampler's draws the way the scripted one does
            engine.drawn = []

            def recording(contexts, budgets, *args, _inner=recorded, _engine=engine, **kwargs):
                rows = _inner(contexts, budgets, *args, **kwargs)
                _engine.drawn += [(c, r.token_ids) for c, r in zip(contexts, rows)]
                return rows

            engine.continue_rows = recording
        scorer = OracleStepScorer(EXAMPLES)
        runs = {
            "greedy": lambda p: greedy(engine, p, 20),
            "samples": lambda p: sample_completions(engine, p, 3, 20, torch.Generator().manual_seed(0)),
            "beam": lambda p: beam_search(engine, p, scorer, FMT, SEPARATORS, 3, 2, 8, 20, torch.Generator()),
            "mcts": lambda p: mcts(engine, p, scorer, FMT, SEPARATORS, 3, 8, 20, generator=torch.Generator()),
        }
        for name, run in runs.items():
            engine.drawn.clear()
            problems = Problem.of(EXAMPLES, TOK, limit)
            run(problems)
            counted = spent_by_problem(engine, problems)
            for p in problems:
                assert p.budget.spent == counted[p.example.id] <= limit, (name, type(engine).__name__)
            if name in ("beam", "mcts") and limit == 60:  # too little to finish: they use what they are given
                assert min(p.budget.spent for p in problems) > limit // 2


def test_a_budget_refuses_to_be_overspent():
    budget = Budget(10)
    budget.charge(10)
    with pytest.raises(RuntimeError, match="with 0 of its 10 left"):
        budget.charge(1)


def test_majority_vote_and_selection_rules():
    def done(text):
        return Partial([0], text, True)

    answer_of = lambda text: text.split("Final: ")[-1]  # noqa: E731
    votes = [done("Final: 3"), done("Final: 5"), done("Final: 5"), Partial([0], "Final: 3", False), done("Final: 3")]
    assert majority_vote(votes, answer_of) is votes[0]  # 3 and 5 tie at two finished votes: the first drawn wins
    assert majority_vote(votes[1:3], answer_of) is votes[1]
    assert majority_vote([Partial([0], "x", False)], answer_of).text == "x"  # nothing finished: the first draw
    assert majority_vote([], answer_of) is None
    candidates = [Partial([0], "a", False), done("b"), done("c")]
    assert pick_highest(candidates, [0.9, 0.2, 0.2]) is candidates[1]  # finished first; ties: drawn first
    assert pick_highest(candidates, [0.9, 0.2, 0.7]) is candidates[2]
    assert pick_highest([], []) is None


def test_the_command_writes_one_table_and_refuses_bad_settings(tmp_path):
    from posttrain.pipelines.checks import check_config
    from posttrain.search.compare import run_search

    torch.manual_seed(0)
    model = GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64,
                                  max_seq_len=96))
    model.save_pretrained(tmp_path / "ckpt", TOK)
    cfg = SearchConfig(checkpoint=str(tmp_path / "ckpt"), size=4, budgets="24,48", max_new_tokens=12,
                       out_dir=str(tmp_path / "runs"), step_tokens=6)
    check_config(cfg)
    summary = run_search(cfg)
    methods = [(r["budget"], r["method"]) for r in summary["rows"]]
    assert methods == [(12, "greedy"), (24, "majority vote (2)"), (24, "best-of-2 (verifier)"),
                       (24, "best-of-2 (policy log-prob)"), (24, "beam 1x2 (oracle steps)"), (48, "majority vote (4)"),
                       (48, "best-of-4 (verifier)"), (48, "best-of-4 (policy log-prob)"), (48, "beam 2x2 (oracle steps)")]  # the beam as wide as each budget pays for
    assert all(r["tokens_spent"] <= r["budget"] for r in summary["rows"])
    run = tmp_path / "runs"
    out = next(run.iterdir())
    assert (out / "search.png").stat().st_size > 0 and "| 48 | best-of-4 (verifier) |" in (out / "compare.md").read_text()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 9 * 4 and all(s["tokens"] <= max(s["budget"], 12) for s in samples)
    for bad, message in ((dict(budgets="64,x"), "expected integers"), (dict(budgets="0"), "positive token counts"),
                         (dict(prm=str(tmp_path / "none")), "no such directory"),
                         (dict(checkpoint=""), "give --checkpoint DIR"), (dict(aggregation="mean"), "min, product")):
        with pytest.raises(ConfigError, match=message):
            check_config(SearchConfig(**{**vars(cfg), **bad}))


def test_revision_from_the_first_flagged_step_and_the_audit_of_the_verifier():
    from posttrain.search.self_verify import audit, policy_confidence, scorer_verifier, verify_and_revise

    def run(verifier, revisions=2, limit=400):
        problems = Problem.of(EXAMPLES, TOK, limit)
        result = verify_and_revise(ScriptedEngine(across_calls=True), problems, verifier, FMT, SEPARATORS, 0.5,
                                   revisions, 16, 48, correct)
        return problems, result

    # the drafts are wrong from their first step; the oracle cuts there and regrows, and each regrowth from a
    # context already drawn from comes out right: 1+2+3 (two chain steps) is fixed by its second revision,
    # 4+5+1+2 (three) would need a third
    problems, result = run(scorer_verifier(OracleStepScorer(EXAMPLES), FMT))
    assert result.draft_correct == [False, False] and result.final_correct == [True, False]
    rates = audit(result)
    assert rates["false_positive_rate"] == 0.0 and rates["wrong_steps"] == 3 + 4 and rates["right_steps"] == 0
    assert (rates["revisions"], rates["fixed"], rates["broke"]) == (4, 1, 0)
    assert all(p.budget.spent <= 400 for p in problems)
    # a verifier that passes everything: no revision, every wrong step a false positive
    _, result = run(lambda prompts, rows: [[1.0] * len(r) for r in rows])
    assert result.final_correct == result.draft_correct and audit(result)["false_positive_rate"] == 1.0
    assert audit(result)["revisions"] == 0
    # the policy's own confidence: exp of each step's mean drawn log-prob, a running minimum over the steps
    rows = [[("1+2=4,", [0.0, -0.1]), ("4+3=7\n", [-0.5, -0.5]), ("Final: 7", [-0.01])]]
    assert policy_confidence(["q"], rows) == [[pytest.approx(0.951229), pytest.approx(0.606531)] * 1
                                              + [pytest.approx(0.606531)]]
    # no revisions: verify only
    _, result = run(scorer_verifier(OracleStepScorer(EXAMPLES), FMT), revisions=0)
    assert result.final_correct == result.draft_correct and result.revisions == []
    # a budget too small to finish: wrong, never an error, never overspent
    problems, result = run(scorer_verifier(OracleStepScorer(EXAMPLES), FMT), limit=9)
    assert result.final_correct == [False, False] and all(p.budget.spent <= 9 for p in problems)


def test_the_verify_command_writes_its_table_and_refuses_bad_settings(tmp_path):
    from posttrain.pipelines.checks import check_config
    from posttrain.config.scoring import VerifyConfig
    from posttrain.search.self_verify import run_verify

    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64,
                          max_seq_len=96)).save_pretrained(tmp_path / "ckpt", TOK)
    cfg = VerifyConfig(checkpoint=str(tmp_path / "ckpt"), size=4, max_new_tokens=12, out_dir=str(tmp_path / "runs"))
    check_config(cfg)
    summary = run_verify(cfg)
    assert [(r["verifier"], r["threshold"]) for r in summary["rows"]] == [
        ("self (policy confidence)", 0.5), ("oracle (step checker)", 0.5), ("self (policy confidence)", 0.9)]
    oracle = summary["rows"][1]
    assert oracle["false_positive_rate"] == 0.0 and oracle["wrong_steps"] > 0  # an untrained policy errs
    assert all(r["tokens"] <= 12 * 3 for r in summary["rows"])  # draft + 2 revisions at most
    table = (next((tmp_path / "runs").iterdir()) / "verify.md").read_text()
    assert "| oracle (step checker) | 0.5 | 0.0% of" in table
    assert table.count("; noise rule: ") == 3  # 4 problems: every revision's effect gets the rule's verdict
    for bad, message in ((dict(thresholds="0.5,1"), "strictly between 0 and 1"), (dict(thresholds="a"), "numbers"),
                         (dict(max_revisions=-1), ">= 0")):
        with pytest.raises(ConfigError, match=message):
            check_config(VerifyConfig(**{**vars(cfg), **bad}))
