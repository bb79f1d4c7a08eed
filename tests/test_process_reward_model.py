"""ORM and PRM (rewards/process_reward_model.py) and their measurements (eval/calibration.py):
readout positions by hand, aggregations by hand, invariances (padding, batching, prefixes),
learning on a toy task whose labels need the step positions, and a transformers body."""

from __future__ import annotations

import math
import random

import pytest
import torch

from posttrain.eval.calibration import (
    accuracy,
    auroc,
    expected_calibration_error,
    grouped_bootstrap_ci,
    reliability_table,
)
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.rewards.process_reward_model import (
    AGGREGATIONS,
    StepBatch,
    StepBCELoss,
    StepRecord,
    StepRewardScorer,
    collate_positions,
    encode_steps,
    get_step_format,
    load_step_scorer,
    logits_at,
    masked_bce,
    save_step_reward_model,
    step_batches,
    train_step_reward_model,
)
from posttrain.rewards.reward_model import RewardModel, collate_texts, encode_for_reward
from posttrain.rewards.reward_model_training import reward_model_trainer, shuffled_batches
from posttrain.verifiers.steps import join_steps

TOK = CharTokenizer()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_reward_model(seed=0, max_seq_len=64) -> RewardModel:
    torch.manual_seed(seed)
    return RewardModel(GPTMini(GPTMiniConfig(vocab_size=TOK.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64,
                                             max_seq_len=max_seq_len)))


def test_aggregations_by_hand():
    scores = [0.9, 0.2, 0.8]
    assert AGGREGATIONS["min"](scores) == 0.2
    assert AGGREGATIONS["product"](scores) == pytest.approx(0.144)
    assert AGGREGATIONS["last"](scores) == 0.8
    assert [AGGREGATIONS[name]([0.5]) for name in ("min", "product", "last")] == [0.5, 0.5, 0.5]
    for aggregate in AGGREGATIONS.values():
        with pytest.raises(ValueError, match="no step scores"):
            aggregate([])


def test_step_positions_by_hand():
    fmt = get_step_format("arithmetic")
    ids, positions = encode_steps(TOK, "Q: 1+2\n", ["1+2=3", "Final: 3"], fmt, 64)
    # [bos] "Q: 1+2\n" (7) "1+2=3" (5) "\n" -> position 1+7+5 = 13; "Final: 3" (8) <eos> -> 22
    assert positions == [13, 22]
    assert ids[0] == TOK.bos_id and ids[-1] == TOK.eos_id and TOK.decode(ids[1:-1]) == "Q: 1+2\n1+2=3\nFinal: 3"
    # a partial chain: its last step is followed by ',' (the chain goes on), not <eos>
    ids, positions = encode_steps(TOK, "Q: 1+2+3\n", ["1+2=3"], fmt, 64)
    assert TOK.decode(ids[1:]) == "Q: 1+2+3\n1+2=3," and positions == [len(ids) - 1]
    # the newline format: a newline after every step, the last too
    ids, positions = encode_steps(TOK, "P\n", ["a", "bc"], get_step_format("newline"), 64)
    assert TOK.decode(ids[1:]) == "P\na\nbc\n" and positions == [4, 7]  # [bos] P \n a (\n) b c (\n)
    with pytest.raises(ValueError, match="max_seq_len=8"):
        encode_steps(TOK, "Q: 1+2\n", ["1+2=3", "Final: 3"], fmt, 8)


def test_the_whole_text_is_the_policys_completion():
    steps = ["7+5=12", "12+9=21", "Final: 21"]
    assert get_step_format("arithmetic").join(steps) == join_steps(steps) == "7+5=12,12+9=21\nFinal: 21"


def test_scores_ignore_padding_batching_and_later_steps():
    scorer = StepRewardScorer(tiny_reward_model(), TOK, "prm", batch_size=2)
    with torch.no_grad():  # a non-zero head, so the scores differ between positions
        scorer.model.head.weight.normal_(0, 1.0)
    prompts = ["Q: 7+5+9+3\n", "Q: 1+2\n", "Q: 4+4+4\n"]
    steps = [["7+5=12", "12+9=21", "21+3=24", "Final: 24"], ["1+2=3", "Final: 3"], ["4+4=8"]]
    together = scorer.score_steps(prompts, steps)  # two batches of 2 and 1, padded
    alone = [scorer.score_steps([p], [s])[0] for p, s in zip(prompts, steps)]
    assert [len(s) for s in together] == [4, 2, 1]
    for a, b in zip(together, alone):
        assert a == pytest.approx(b, abs=1e-6)
    assert len({round(v, 6) for v in together[0]}) == 4  # distinct positions, distinct scores
    # causal: a step's score does not depend on later steps (all but the last chain step,
    # which the Final line follows with a newline instead of ',')
    assert scorer.score_steps([prompts[0]], [steps[0][:2]])[0] == pytest.approx(together[0][:2], abs=1e-6)


def test_orm_reads_the_eos_like_the_reward_model():
    model = tiny_reward_model(1)
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
    scorer = StepRewardScorer(model, TOK, "orm")
    prompts, completions = ["Q: 1+2\n", "Q: 3+3\n"], ["1+2=3\nFinal: 3", "3+3=7\nFinal: 7"]
    tokens, lengths = collate_texts([encode_for_reward(TOK, p, c, 64)[0] for p, c in zip(prompts, completions)],
                                    TOK.pad_id)
    expected = torch.sigmoid(model(tokens, lengths)).tolist()
    assert scorer.score_outcomes(prompts, completions) == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="score_outcomes"):
        scorer.score_steps(prompts, [["1+2=3"], ["3+3=7"]])


def test_prm_outcome_score_is_the_aggregate_of_its_step_scores():
    model = tiny_reward_model(2)
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
    for name, aggregate in AGGREGATIONS.items():
        scorer = StepRewardScorer(model, TOK, "prm", aggregation=name)
        steps = scorer.score_steps(["Q: 1+2+3\n"], [["1+2=3", "3+3=6", "Final: 6"]])[0]
        assert scorer.score_outcomes(["Q: 1+2+3\n"], ["1+2=3,3+3=6\nFinal: 6"]) == pytest.approx([aggregate(steps)])
    assert len(scorer.score_outcomes(["Q: 1\n"], [""])) == 1  # no steps: scored as one empty step


def toy_records(n, seed):
    """Steps 'good'/'bad', one per line; a step's label is True iff it and every earlier
    step are 'good' (the first-error rule): right only if the head reads each step's own
    position and the body looks back across steps."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        steps = [rng.choice(["good", "good", "bad"]) for _ in range(rng.randint(1, 4))]
        labels = [float(all(s == "good" for s in steps[: k + 1])) for k in range(len(steps))]
        records.append(StepRecord("P\n", steps, labels, labels[-1]))
    return records


@pytest.mark.parametrize("kind", ["prm", "orm"])
def test_learns_first_error_labels_held_out(kind, tmp_path):
    train, heldout = toy_records(300, 0), toy_records(100, 1)
    model = tiny_reward_model(3)
    history = train_step_reward_model(model, TOK, train, kind, "newline", steps=150, lr=3e-3, batch_size=32)
    assert history[0]["loss"] == pytest.approx(math.log(2), abs=1e-6)  # a zero head: p = 0.5 everywhere
    scorer = StepRewardScorer(model, TOK, kind, "newline")
    if kind == "prm":
        probs = [p for row in scorer.score_steps([r.prompt for r in heldout], [r.steps for r in heldout]) for p in row]
        labels = [y for r in heldout for y in r.labels]
    else:
        probs = scorer.score_outcomes([r.prompt for r in heldout], ["\n".join(r.steps) + "\n" for r in heldout])
        labels = [r.outcome for r in heldout]
    assert accuracy(probs, labels) > 0.97, accuracy(probs, labels)
    # saved and loaded, it scores the same
    save_step_reward_model(model, tmp_path / "rm", TOK, kind, "newline")
    loaded = load_step_scorer(tmp_path / "rm")
    assert loaded.kind == kind and loaded.format.name == "newline"
    again = loaded.score_outcomes([r.prompt for r in heldout[:5]], ["\n".join(r.steps) for r in heldout[:5]])
    assert again == pytest.approx(scorer.score_outcomes([r.prompt for r in heldout[:5]],
                                                        ["\n".join(r.steps) for r in heldout[:5]]), abs=1e-6)


def test_a_transformers_body_trains_and_scores(tmp_path):
    from posttrain.models.hf import HFPolicy

    torch.manual_seed(0)
    GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=4, hidden_dim=64, max_seq_len=64)).save_pretrained(
        tmp_path / "llama", CharTokenizer())  # a tiny Llama directory, read back only by transformers
    body, tokenizer = HFPolicy.load(tmp_path / "llama")
    model = RewardModel.from_policy(body)
    train = toy_records(200, 0)
    history = train_step_reward_model(model, tokenizer, train, "prm", "newline", steps=80, lr=3e-3, batch_size=32)
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    scorer = StepRewardScorer(model, tokenizer, "prm", "newline")
    scores = scorer.score_steps(["P\n", "P\n"], [["good", "bad", "good"], ["good"]])
    assert [len(s) for s in scores] == [3, 1] and scores[0][1] < 0.5 < scores[0][0]


# --- training through the one Trainer: today's numbers, micro-batches ---------------------


def plain_adamw_loop(model, tokenizer, records, kind, step_format, steps, lr, batch_size, seed):
    """train_step_reward_model as it was before it trained through the Trainer, its own
    AdamW loop line for line: the reference today's defaults have to reproduce."""
    usable = [r for r in records if r.steps]
    fmt = get_step_format(step_format)
    max_len = model.config.max_seq_len
    if kind == "prm":
        encoded = [encode_steps(tokenizer, r.prompt, r.steps, fmt, max_len) for r in usable]
        targets = [list(map(float, r.labels)) for r in usable]
    else:
        encoded = []
        for r in usable:
            ids, _ = encode_for_reward(tokenizer, r.prompt, fmt.join(r.steps), max_len)
            encoded.append((ids, [len(ids) - 1]))
        targets = [[float(r.outcome)] for r in usable]
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    batches = shuffled_batches(len(usable), batch_size, seed)
    losses = []
    model.train()
    for _ in range(steps):
        idx = next(batches)
        tokens, _ = collate_texts([encoded[i][0] for i in idx], tokenizer.pad_id)
        positions, mask = collate_positions([encoded[i][1] for i in idx])
        labels = torch.zeros(mask.shape)
        for b, i in enumerate(idx):
            labels[b, : len(targets[i])] = torch.tensor(targets[i])
        logits = logits_at(model, tokens, positions)
        labels, mask = labels.to(logits.device), mask.to(logits.device)
        loss = masked_bce(logits, labels, mask.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


@pytest.mark.parametrize("kind", ["prm", "orm"])
def test_the_trainer_reproduces_the_plain_adamw_loop_bit_for_bit(kind):
    records = toy_records(60, 0)
    reference = tiny_reward_model(3)
    losses = plain_adamw_loop(reference, TOK, records, kind, "newline", steps=10, lr=3e-3, batch_size=16, seed=4)
    model = tiny_reward_model(3)
    history = train_step_reward_model(model, TOK, records, kind, "newline", steps=10, lr=3e-3, batch_size=16, seed=4)
    assert [h["loss"] for h in history] == losses and losses[-1] < losses[0]
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(a, b), name


class ShareOfRows(StepBCELoss):
    """The loss weighted by its share of the rows, not of the labelled positions: wrong for
    a mean over positions when rows hold different numbers of steps."""

    def share(self, batch, rows):
        return len(rows) / batch.batch_size


def bce_gradient(batch: StepBatch, micro_batch_size: int, loss=StepBCELoss()) -> torch.Tensor:
    model = tiny_reward_model(3)
    torch.nn.init.normal_(model.head.weight, std=0.3)  # a live head: the body gets a gradient too
    reward_model_trainer(model, 1e-3, 1, micro_batch_size).step(batch, loss)
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_micro_batches_give_the_whole_batch_gradient_weighted_by_labelled_steps():
    # rows of 1 to 4 steps: a share of the rows is not a share of the steps
    batch = next(step_batches(toy_records(20, 0), TOK, "prm", get_step_format("newline"), 64, batch_size=9, seed=0))
    assert len({len(p) for p in batch.positions}) > 1
    whole = bce_gradient(batch, 0)
    scale = whole.abs().max()
    assert scale > 1e-3
    for size in (1, 4):  # to float32 rounding: other shapes sum in another order
        torch.testing.assert_close(bce_gradient(batch, size), whole, atol=1e-4 * scale, rtol=0)
    # the test can fail: weighted by rows, single-row micro-batches give another gradient
    assert (bce_gradient(batch, 1, ShareOfRows()) - whole).abs().max() > 0.01 * scale


# --- the measurements --------------------------------------------------------------------


def test_calibration_measures_by_hand():
    probs, labels = [0.05, 0.15, 0.95, 0.85, 0.65], [0, 0, 1, 1, 0]
    # bins: 0.0-0.1 {0.05: 0}, 0.1-0.2 {0.15: 0}, 0.6-0.7 {0.65: 0}, 0.8-0.9 {0.85: 1}, 0.9-1.0 {0.95: 1}
    # |Σy − Σp| per bin: 0.05, 0.15, 0.65, 0.15, 0.05 -> sum 1.05, / 5
    assert expected_calibration_error(probs, labels) == pytest.approx(1.05 / 5)
    table = reliability_table(probs, labels)
    assert len(table) == 10 and sum(row["n"] for row in table) == 5
    assert table[6] == {"bin": "0.6-0.7", "n": 1, "mean_probability": 0.65, "fraction_positive": 0.0}
    assert expected_calibration_error([1.0, 0.0], [1, 0]) == 0.0  # p = 1 falls in the top bin
    assert accuracy(probs, labels) == pytest.approx(4 / 5)
    # AUROC: pairs (pos, neg): 0.95 and 0.85 each beat all 3 negatives -> 6/6
    assert auroc(probs, labels) == 1.0
    assert auroc([0.5, 0.5, 0.2], [1, 0, 0]) == pytest.approx((0.5 + 1) / 2)  # a tie counts half
    assert math.isnan(auroc([0.1, 0.2], [1, 1]))
    with pytest.raises(ValueError, match="pass σ"):
        expected_calibration_error([1.5], [1])


def test_grouped_bootstrap_resamples_whole_solutions():
    groups = [([0.9, 0.8], [1, 1]), ([0.2], [0]), ([0.7, 0.4, 0.1], [1, 0, 0])]
    ci = grouped_bootstrap_ci(groups, accuracy, n_resamples=200)
    assert ci["mean"] == 1.0 and ci["ci_low"] == ci["ci_high"] == 1.0 and ci["n"] == 3
    ci = grouped_bootstrap_ci(groups, lambda p, y: float(len(p)), n_resamples=200, seed=1)
    assert ci["mean"] == 6 and 3 <= ci["ci_low"] <= ci["ci_high"] <= 9  # sizes of 3 resampled groups
