"""The self_critique reward term (rewards/self_critique.py): the production rubric scored by a
judge, stacked on the verifier (Kimi K2's joint reward). With a scripted judge whose next-token
probabilities the test sets, the paid reward and each criterion's logged mean are worked by
hand; the question fits the judge's tokenizer or the term is refused with the judge to pass;
the policy judges only once it is given; multi-turn episodes are scored too; and two RL steps
log every criterion's mean in metrics.jsonl."""

import json

import cloudpickle
import pytest

from posttrain.config import ConfigError, RewardConfig, RLConfig, TrainConfig
from posttrain.envs.search_qa import SearchQAEnv
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import reward_stack
from posttrain.pipelines.checks import check_config, check_rl
from posttrain.rewards.judge import PRODUCTION_CRITERIA, self_critique_rubric
from posttrain.rewards.rubric import Rubric, RubricCriterion
from posttrain.rewards.self_critique import SelfCritique, critique_judge
from posttrain.rewards.stack import Accuracy, RewardStack, criterion_means
from posttrain.rewards.user_function import StackOnVerdict
from posttrain.roles.agent import AgentLoop
from posttrain.types import Episode, Example
from tests.test_joint_rewards import ScriptedEngine
from tests.test_judge import ScriptedModel, tiny_gpt_mini
from tests.test_pipeline import TINY, only_run_dir, posttrain

TOK = CharTokenizer()
E = Example(prompt="Q: 17+25\n", expected_answer="42")
# the judge's next token after "...\nCorrect? ": P(Y) 0.6, P(N) 0.2 on a right answer (mass 0.8,
# score 0.6/0.8 = 0.75), P(Y) 0.1, P(N) 0.9 on a wrong one (score 0.1)
TABLE = {"Final: 42": {"Y": 0.6, "N": 0.2, "T": 0.2}, "": {"Y": 0.1, "N": 0.9}}
RL = RLConfig(reward=RewardConfig(terms="accuracy + 0.2*self_critique"))


class SubwordTokenizer:
    """gpt_mini's characters behind a tokenizer that is not character-level, so the judge gets
    the full prompt and the 1..5 scale; `split_digits` writes each digit as two tokens."""

    def __init__(self, split_digits=False):
        self.split_digits = split_digits

    def __getattr__(self, name):
        return getattr(TOK, name)

    def encode(self, text):
        ids = TOK.encode(text)
        return ids * 2 if self.split_digits and text.isdigit() else ids


def steps_of(stack, completions):
    scored = [stack(E, c, {"reward": float(c.endswith("42")), "details": {"reason": "ok"}}) for c in completions]
    return [Episode(E, 0, [], [], [], reward=s["reward"], details=s["details"]) for s in scored]


# --- the term, worked by hand ------------------------------------------------------------------


def test_the_policy_judges_five_criteria_and_the_stack_pays_accuracy_plus_a_fifth_of_the_mean():
    policy = ScriptedModel(TABLE)
    stack = reward_stack(RL, policy, TOK)
    assert stack.version == ("1*accuracy + 0.2*self_critique(Accuracy:1,Relevance:1,Completeness:1,Clarity:1,"
                             "Helpfulness:1) by policy")
    right, wrong = steps_of(stack, ["17+25=42\nFinal: 42", "17+25=41\nFinal: 41"])
    # right: 1 + 0.2 · 0.75; wrong: 0 + 0.2 · 0.1 (P(Y) renormalised over Y and N: 0.1 / 1.0)
    assert right.reward == pytest.approx(1.15) and wrong.reward == pytest.approx(0.02)
    criteria = right.details["term_details"]["self_critique"]["criteria"]
    assert list(criteria) == list(PRODUCTION_CRITERIA)
    assert criteria["Clarity"]["score"] == pytest.approx(0.75)
    assert criteria["Clarity"]["reason"] == "expected 0.75 (Y 0.75, N 0.25); 80% of the probability on the labels"
    # gpt_mini's compact prompt does not print the criterion: its five verdicts are one question's
    assert len({c["score"] for c in criteria.values()}) == 1
    assert "compact-judge-v1, labels=Y/N" in right.details["term_details"]["self_critique"]["rubric_spec"]
    means = stack.term_means([right, wrong])
    assert means["reward/self_critique"] == pytest.approx(0.2 * (0.75 + 0.1) / 2)
    assert means["rubric/self_critique/Accuracy"] == pytest.approx(0.425)
    assert sorted(k for k in means if k.startswith("rubric/")) == sorted(
        f"rubric/self_critique/{name}" for name in PRODUCTION_CRITERIA)


def test_criterion_means_by_hand_with_a_sample_the_rubric_could_not_score():
    rubric = Rubric([RubricCriterion("a", 1.0, "", lambda e, c: (1.0, "")),
                     RubricCriterion("b", 3.0, "", lambda e, c: (0.5 if "x" in c else 0.0, ""))])
    stack = RewardStack([(1.0, Accuracy()), (0.5, rubric)])
    episodes = steps_of(stack, ["x", "y"])
    episodes.append(Episode(E, 0, [], [], [], details={"weighted": {"accuracy": 0.0, "rubric": 0.0}}))  # unscored
    # a: (1 + 1 + 0) / 3; b: (0.5 + 0 + 0) / 3 — the unscored sample counts 0, as it was paid
    assert criterion_means(["accuracy", "rubric"], episodes) == pytest.approx(
        {"rubric/rubric/a": 2 / 3, "rubric/rubric/b": 0.5 / 3})


def test_a_subword_judge_reads_the_full_prompt_per_criterion_on_the_five_point_scale():
    table = {"Criterion: Accuracy": {"1": 1.0}, "": {"5": 0.5, "4": 0.5}}  # inaccurate, otherwise good
    judge = critique_judge(ScriptedModel(table), SubwordTokenizer(), "judge-x")
    assert judge.version == "judge(judge-x, judge-prompt-v1, labels=1/2/3/4/5, min_mass=0.25)"
    term = SelfCritique("judge-x", self_critique_rubric(judge))
    out = term(E, "Final: 42", {})
    scores = {name: c["score"] for name, c in out["details"]["criteria"].items()}
    # Accuracy: all on "1" -> 0; the others E = 4.5 -> (4.5 - 1) / 4 = 0.875; the mean of five
    assert scores == pytest.approx({"Accuracy": 0.0, **{n: 0.875 for n in list(PRODUCTION_CRITERIA)[1:]}})
    assert out["reward"] == pytest.approx(4 * 0.875 / 5)


def test_a_judge_whose_labels_are_not_single_tokens_is_refused_with_the_judge_to_pass():
    with pytest.raises(ValueError, match=r"the judge 'judge-x' cannot give the self_critique verdict: the label "
                                         r"'1' is 2 tokens.*--rl.reward.judge smollm2-135m"):
        critique_judge(ScriptedModel(TABLE), SubwordTokenizer(split_digits=True), "judge-x")


def test_without_the_policy_the_term_keeps_its_place_and_refuses_to_score():
    stack = reward_stack(RL)  # what the checks build, before any model loads
    assert [term.name for _, term in stack.terms] == ["accuracy", "self_critique"]
    assert stack.version.endswith("by policy")
    with pytest.raises(RuntimeError, match="has no judge yet"):
        stack(E, "Final: 42", {"reward": 1.0, "details": {}})


def test_the_settings_are_checked_before_a_run():
    check_rl(RL)  # the policy as judge: nothing to load yet
    with pytest.raises(ConfigError, match=r"rl.reward.judge=' ' is not allowed: expected 'policy' or a judge model"):
        RewardConfig(judge=" ").validate()
    bad = RLConfig(reward=RewardConfig(terms="accuracy + 0.2*self_critique", judge="/no/such/judge"))
    with pytest.raises(ConfigError, match=r"self_critique judge '/no/such/judge' \(rl.reward.judge\) is not a model"):
        check_rl(bad)


def test_an_untaught_gpt_mini_and_a_critique_longer_than_its_positions_are_refused():
    cfg = TrainConfig(rl=RLConfig(reward=RewardConfig(terms="accuracy + 0.2*self_critique")))
    with pytest.raises(ConfigError, match=r"sft.judge_demos=0 is not allowed: expected a positive number of problems "
                                          r"with a self_critique term the policy judges on gpt_mini"):
        check_config(cfg)  # untaught, gpt_mini's every judgement is refused: the term would pay 0 throughout
    cfg.sft.judge_demos = 100
    cfg.rl.sampling.max_new_tokens = 80  # the 14-token prompt and 80 fit the policy's 96 positions; its critique:
    # <bos> + the 13-character prompt + "\n" + "Correct?" + " " = 24 tokens, + the response, + the verdict = 105
    with pytest.raises(ConfigError, match=r"rl.reward.judge='policy' is not allowed: expected a judge model with at "
                                          r"least 105 positions.*a response of up to 80 tokens"):
        check_config(cfg)
    cfg.rl.reward.judge = "a/judge"  # a judge model's own positions are its own: not the policy's check
    with pytest.raises(ConfigError, match=r"judge 'a/judge' \(rl.reward.judge\) is not a model"):
        check_config(cfg)


def test_a_gpt_mini_checkpoint_judges_as_a_frozen_model_with_the_compact_question(tmp_path):
    model = tiny_gpt_mini()
    model.save_pretrained(tmp_path / "judge", TOK)
    term = SelfCritique.from_setting(str(tmp_path / "judge"))
    assert term.judged_by(ScriptedModel(TABLE), TOK) is term  # a judge of its own: the policy does not replace it
    assert term.rubric.scored_by == f"judge({tmp_path / 'judge'}, compact-judge-v1, labels=Y/N, min_mass=0.25)"
    out = term(E, "17+25=42\nFinal: 42", {})
    assert set(out["details"]["criteria"]) == set(PRODUCTION_CRITERIA) and 0.0 <= out["reward"] <= 1.0
    cloudpickle.dumps(term)  # a frozen judge travels to Ray's rollout workers (cloudpickle) with a multi-turn loop


def test_the_policy_as_judge_does_not_travel_to_a_rollout_worker():
    term = SelfCritique("policy").judged_by(ScriptedModel(TABLE), TOK)
    with pytest.raises(ValueError, match="stale weights; use --dist.topology colocated"):
        cloudpickle.dumps(term)


def test_a_multi_turn_episode_is_critiqued_on_its_transcript():
    env = SearchQAEnv()
    example = env.fixed_set("heldout", 1)[0]
    stack = reward_stack(RL, ScriptedModel({"Final: 285": {"Y": 0.9, "N": 0.1}, "": {"N": 1.0}}), TOK)
    loop = AgentLoop(env, reward=StackOnVerdict(stack))
    [solved] = loop(ScriptedEngine({example.prompt: env.demonstration_turns(example)}), [example], 1)
    [copied] = loop(ScriptedEngine({example.prompt: env.hack_turns(example)}), [example], 1)
    assert solved.details["components"] == pytest.approx({"accuracy": 1.0, "self_critique": 0.9})
    assert copied.details["components"] == pytest.approx({"accuracy": 0.0, "self_critique": 0.0})
    assert stack.term_means([solved, copied])["rubric/self_critique/Helpfulness"] == pytest.approx(0.45)


# --- two RL steps -------------------------------------------------------------------------------


def test_two_rl_steps_log_each_criterions_mean(tmp_path):
    proc = posttrain("train", *TINY, "--rl.steps", "2", "--rl.reward.terms", "accuracy + 0.2*self_critique",
                     "--sft.judge_demos", "16", "--out_dir", str(tmp_path))
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    run = only_run_dir(tmp_path)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [row for row in rows if "reward/self_critique" in row]
    assert [row["step"] for row in rl_rows] == [0, 1]
    for row in rl_rows:
        criteria = [row[f"rubric/self_critique/{name}"] for name in PRODUCTION_CRITERIA]
        assert all(0.0 <= value <= 1.0 for value in criteria)
        # equal weights: the term pays 0.2 × the criteria's average
        assert row["reward/self_critique"] == pytest.approx(0.2 * sum(criteria) / 5)
        assert row["reward_mean"] == pytest.approx(row["reward/accuracy"] + row["reward/self_critique"])
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert sample["details"]["reward_spec"].endswith("by policy")
    assert "judge(policy, compact-judge-v1, labels=Y/N" in sample["details"]["term_details"]["self_critique"][
        "rubric_spec"]
