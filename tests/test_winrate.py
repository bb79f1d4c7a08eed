"""The pairwise win-rate (posttrain/eval/winrate.py) by hand, its length control against
an explicit fit, and `posttrain winrate` end to end on tiny checkpoints, with the errors a
user gets for bad input."""

from __future__ import annotations

import json
import math

import pytest
import torch

from posttrain.cli import main
from posttrain.config import ArithmeticConfig, EnvConfig
from posttrain.config.files import to_dict
from posttrain.eval.head_to_head import Side, check_comparable
from posttrain.eval.winrate import (
    LENGTH_RIDGE,
    fit_length_logistic,
    length_controlled,
    pairwise_outcomes,
    verifier_agreement,
    win_rate,
)
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.reward_model import RewardModel, save_reward_model

# --- the math, by hand ------------------------------------------------------------------


def test_wins_ties_and_losses_give_the_rate_by_hand():
    outcomes = pairwise_outcomes([3.0, 2.0, 1.0, 0.5, 7.0], [1.0, 2.0, 4.0, 0.5, 6.9])
    assert outcomes == [1.0, 0.5, 0.0, 0.5, 1.0]
    result = win_rate(outcomes)
    assert result["win_rate"] == pytest.approx((1 + 0.5 + 0 + 0.5 + 1) / 5)  # 0.6
    assert (result["wins"], result["ties"], result["losses"], result["n"]) == (2, 2, 1, 5)
    assert 0.0 <= result["ci_low"] <= 0.6 <= result["ci_high"] <= 1.0


def test_the_ci_brackets_the_rate_and_narrows_with_more_prompts():
    few = win_rate([1.0, 0.0] * 10)
    many = win_rate([1.0, 0.0] * 500)
    for r in (few, many):
        assert r["ci_low"] < r["win_rate"] == 0.5 < r["ci_high"]
    assert many["ci_high"] - many["ci_low"] < (few["ci_high"] - few["ci_low"]) / 5  # ~ 1/sqrt(50) as wide


def test_a_judge_that_always_prefers_a_gives_one():
    result = win_rate(pairwise_outcomes([1.0] * 40, [0.0] * 40))
    assert (result["win_rate"], result["ci_low"], result["ci_high"]) == (1.0, 1.0, 1.0)


def test_swapping_a_and_b_gives_one_minus_the_rate():
    generator = torch.Generator().manual_seed(0)
    score_a = torch.randint(0, 4, (200,), generator=generator).tolist()  # many ties
    score_b = torch.randint(0, 4, (200,), generator=generator).tolist()
    forward = win_rate(pairwise_outcomes(score_a, score_b))
    backward = win_rate(pairwise_outcomes(score_b, score_a))
    assert backward["win_rate"] == pytest.approx(1 - forward["win_rate"])
    assert (backward["wins"], backward["ties"]) == (forward["losses"], forward["ties"])


def test_bad_outcomes_and_mismatched_sides_are_refused():
    with pytest.raises(ValueError, match="one score per prompt"):
        pairwise_outcomes([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="got 0.7"):
        win_rate([1.0, 0.7])
    with pytest.raises(ValueError, match="one of each per prompt"):
        length_controlled([1.0], [3, 4], [3])


# --- length control ------------------------------------------------------------------------


def test_with_no_length_difference_the_length_controlled_rate_is_the_raw_rate():
    outcomes = [1.0, 0.0, 0.5, 1.0, 1.0, 0.0, 1.0]
    lc = length_controlled(outcomes, [9] * 7, [9] * 7)
    assert lc["lc_win_rate"] == pytest.approx(sum(outcomes) / 7, abs=1e-9)
    assert lc["length_slope"] == 0.0


def test_a_judge_that_only_rewards_length_is_worth_a_coin_flip_once_length_is_controlled():
    # A is longer on 100 prompts and wins 80 of them; shorter on 25 and wins 5: the judge's
    # odds are 4:1 for the longer answer either way, so at equal length it is 50/50
    outcomes = [1.0] * 80 + [0.0] * 20 + [1.0] * 5 + [0.0] * 20
    len_a = [45] * 100 + [35] * 25
    len_b = [40] * 125
    raw = win_rate(outcomes)["win_rate"]
    lc = length_controlled(outcomes, len_a, len_b)
    assert raw == pytest.approx(85 / 125)  # 0.68: flattered by length
    assert lc["lc_win_rate"] == pytest.approx(0.5, abs=0.01)
    assert lc["length_slope"] > 1.0  # length moves this judge
    assert lc["ci_low"] < lc["lc_win_rate"] < lc["ci_high"]


def test_the_fit_solves_its_score_equations():
    # the penalised maximum-likelihood θ makes the gradient zero: Σ(y − p) = 0, Σ(y − p)x = λθ1
    generator = torch.Generator().manual_seed(1)
    x = torch.rand(60, generator=generator, dtype=torch.float64) * 2 - 1
    y = (torch.rand(60, generator=generator, dtype=torch.float64) < torch.sigmoid(0.4 + 1.5 * x)).double()
    y[:5] = 0.5  # soft labels (ties)
    theta = fit_length_logistic(y, x, torch.ones(1, 60, dtype=torch.float64))[0]
    p = torch.sigmoid(theta[0] + theta[1] * x)
    assert float((y - p).sum()) == pytest.approx(0.0, abs=1e-8)
    assert float(((y - p) * x).sum()) == pytest.approx(LENGTH_RIDGE * float(theta[1]), abs=1e-8)


def test_a_bootstrap_row_of_counts_fits_as_the_items_repeated():
    # the vectorised bootstrap weights each item by how often it was drawn; the loop version
    # fits on the drawn items themselves
    generator = torch.Generator().manual_seed(2)
    x = torch.rand(30, generator=generator, dtype=torch.float64) - 0.5
    y = (torch.rand(30, generator=generator, dtype=torch.float64) < 0.6).double()
    draws = torch.randint(0, 30, (3, 30), generator=generator)
    counts = torch.stack([torch.bincount(d, minlength=30).double() for d in draws])  # (3, 30)
    vectorised = fit_length_logistic(y, x, counts)
    for row, d in zip(vectorised, draws):
        looped = fit_length_logistic(y[d], x[d], torch.ones(1, 30, dtype=torch.float64))[0]
        assert torch.allclose(row, looped, atol=1e-9)


# --- trust: the judge against the verifier -------------------------------------------------


def test_agreement_with_the_verifier_by_hand():
    # the verifier picks A on prompts 0 and 1, B on prompt 2, neither on prompt 3;
    # the judge agrees on 0, disagrees on 1, ties on 2: (1 + 0 + 0.5) / 3
    result = verifier_agreement([1.0, 0.0, 0.5, 1.0], [1, 1, 0, 0], [0, 0, 1, 0])
    assert result["agreement"] == pytest.approx(0.5)
    assert (result["decisive"], result["verifier_ties"]) == (3, 1)
    assert math.isnan(verifier_agreement([1.0], [1], [1])["agreement"])


# --- the command, end to end -----------------------------------------------------------------


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_gpt(seed: int) -> GPTMini:
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=CharTokenizer().vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                                 max_seq_len=96))


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    root = tmp_path_factory.mktemp("policies")
    for seed in (0, 1):
        tiny_gpt(seed).save_pretrained(root / f"p{seed}", CharTokenizer())
    return root / "p0", root / "p1"


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    rm = RewardModel(tiny_gpt(2))
    torch.nn.init.normal_(rm.head.weight)  # a non-zero head, so answers score differently
    return save_reward_model(rm, tmp_path_factory.mktemp("rm") / "reward_model", CharTokenizer(), {})


FAST = ["--size", "12", "--max_new_tokens", "10"]


def winrate(tmp_path, *args) -> dict:
    out = tmp_path / "out"
    assert main(["winrate", *FAST, *args, "--out_dir", str(out)]) == 0
    (run,) = [p for p in out.iterdir() if p.is_dir()]
    assert (run / "winrate.md").read_text().startswith("# Win-rate of A against B")
    result = json.loads((run / "winrate.json").read_text())
    assert len((run / "samples.jsonl").read_text().splitlines()) == result["win_rate"]["n"]
    return result


def test_winrate_runs_end_to_end_and_swapping_sides_mirrors_it(policies, reward_model, tmp_path):
    a, b = policies
    forward = winrate(tmp_path / "ab", "--a", str(a), "--b", str(b), "--judge.rm", str(reward_model))
    backward = winrate(tmp_path / "ba", "--a", str(b), "--b", str(a), "--judge.rm", str(reward_model))
    assert forward["judge"].startswith("reward model") and forward["decoding"] == "greedy"
    assert forward["win_rate"]["n"] == 12
    # greedy answers are a property of the weights, so the swapped run judges the same answers
    assert backward["win_rate"]["win_rate"] == pytest.approx(1 - forward["win_rate"]["win_rate"])
    assert (backward["length"]["mean_a"], backward["length"]["mean_b"]) == \
        (forward["length"]["mean_b"], forward["length"]["mean_a"])
    assert "lc_win_rate" in forward["length_controlled"]
    assert forward["verifier"]["judge_agreement"]["decisive"] + \
        forward["verifier"]["judge_agreement"]["verifier_ties"] == 12


def test_a_policy_against_itself_ties_everywhere_greedy_or_sampled(policies, tmp_path):
    a, _ = policies
    for temperature in ("0", "1"):  # sampled: both sides draw from the same stream (common random numbers)
        result = winrate(tmp_path / temperature, "--a", str(a), "--b", str(a), "--judge.verifier", "true",
                         "--temperature", temperature)
        assert result["win_rate"]["win_rate"] == 0.5 and result["identical_answers"] == 12
        assert result["length"]["diff"]["mean_diff"] == 0.0


def test_sampled_answers_swap_to_one_minus_the_rate(policies, reward_model, tmp_path):
    a, b = policies
    forward = winrate(tmp_path / "ab", "--a", str(a), "--b", str(b), "--judge.rm", str(reward_model),
                      "--temperature", "1")
    backward = winrate(tmp_path / "ba", "--a", str(b), "--b", str(a), "--judge.rm", str(reward_model),
                       "--temperature", "1")
    assert forward["decoding"] == "sampled at T = 1"
    assert backward["win_rate"]["win_rate"] == pytest.approx(1 - forward["win_rate"]["win_rate"])


def test_an_ensemble_of_reward_models_judges_by_its_combined_score(policies, reward_model, tmp_path):
    a, b = policies
    result = winrate(tmp_path, "--a", str(a), "--b", str(b), "--judge.rm", f"{reward_model},{reward_model}",
                     "--judge.ensemble", "min", "--size", "4")
    assert result["judge"].endswith("(min of 2)")
    one = winrate(tmp_path / "one", "--a", str(a), "--b", str(b), "--judge.rm", str(reward_model), "--size", "4")
    assert result["win_rate"] == one["win_rate"]  # two copies of one model: the min is that model's score


def test_a_local_llm_judge_rates_each_answer(policies, tmp_path):
    judge = tmp_path / "judge"
    torch.manual_seed(4)  # a judge model whose context holds the judge prompt (question, answer, instruction)
    GPTMini(GPTMiniConfig(vocab_size=CharTokenizer().vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                          max_seq_len=320)).save_pretrained(judge, CharTokenizer())
    a, b = policies
    result = winrate(tmp_path, "--a", str(a), "--b", str(b), "--judge.llm", str(judge), "--size", "4")
    assert result["judge"].startswith(f"judge({judge}")
    assert result["win_rate"]["n"] == 4


@pytest.mark.parametrize("args, message", [
    (["--b", "{a}", "--judge.verifier", "true"], "give --a DIR"),
    (["--a", "{a}", "--b", "{missing}", "--judge.verifier", "true"], "b='"),
    (["--a", "{a}", "--b", "{b}"], "give exactly one judge"),
    (["--a", "{a}", "--b", "{b}", "--judge.rm", "{rm}", "--judge.verifier", "true"], "give exactly one judge"),
    (["--a", "{a}", "--b", "{b}", "--judge.rm", "{a}"], "is not a reward model directory"),
    (["--a", "{a}", "--b", "{b}", "--judge.llm", "{missing}"], "judge.llm="),
])
def test_bad_input_gets_a_one_line_error(args, message, policies, reward_model, tmp_path, capsys):
    a, b = policies
    values = {"a": a, "b": b, "rm": reward_model, "missing": tmp_path / "nowhere"}
    code = main(["winrate", *[arg.format(**values) for arg in args], "--out_dir", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before anything ran


class WiderTokenizer(CharTokenizer):
    def __len__(self) -> int:
        return super().__len__() + 1


def test_policies_with_other_tokenizers_or_tasks_are_refused(policies, tmp_path):
    a, b = policies
    side = lambda path, tok: Side(str(path), path, "the checkpoint given", None, tok)  # noqa: E731
    with pytest.raises(ValueError, match="different tokenizers"):
        check_comparable(side(a, CharTokenizer()), side(b, WiderTokenizer()))
    level2 = tmp_path / "level2"
    tiny_gpt(3).save_pretrained(level2, CharTokenizer())
    (level2 / "posttrain_task.json").write_text(json.dumps({
        "format": 1, "env": to_dict(EnvConfig(arithmetic=ArithmeticConfig(level=2))), "spec_version": "", "max_new_tokens": 48,
        "system_prompt": "", "posttrain_version": "test"}))
    (tmp_path / "level3").mkdir()
    for f in level2.iterdir():
        (tmp_path / "level3" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "level3" / "posttrain_task.json").write_text(json.dumps({
        "format": 1, "env": to_dict(EnvConfig(arithmetic=ArithmeticConfig(level=3))), "spec_version": "", "max_new_tokens": 48,
        "system_prompt": "", "posttrain_version": "test"}))
    with pytest.raises(ValueError, match="env.arithmetic.level=2.*env.arithmetic.level=3"):
        check_comparable(side(level2, CharTokenizer()), side(tmp_path / "level3", CharTokenizer()))
