"""DPO's two extras on numbers worked by hand: score-gap pair weighting (the weights, their
mean-1 scaling over a step's pairs, equal gaps giving the unweighted loss, micro-batches
sharing the step's weights, unscored pairs refused, the file's score columns) and the KL term
(its value, zero at the reference, the direction of its gradient)."""

import math

import pytest
import torch
import torch.nn.functional as F

from posttrain.algorithms.preference import PreferenceLogps, make_preference_loss
from posttrain.algorithms.preference.core import gap_weights
from posttrain.config import ConfigError, PreferenceConfig, RLConfig
from posttrain.data.preference import load_preference_data, save_preference_jsonl
from posttrain.data.preference_rows import pair_gaps, preference_episodes
from posttrain.data.sentiment_pairs import sentiment_pairs
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.checks import check_rl
from posttrain.pipelines.preference_train import cache_reference_logps, frozen_copy, preference_batch, train_preference
from posttrain.roles.trainer import Trainer
from posttrain.types import PreferencePair


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def t(*xs):
    return torch.tensor(xs, dtype=torch.float32)


def logps(chosen, rejected, ref_chosen, ref_rejected, weights=None):
    ones = torch.ones(len(chosen))
    return PreferenceLogps(t(*chosen), t(*rejected), ones, ones, t(*ref_chosen), t(*ref_rejected), weights)


# ------------------------------------------------------------------ gap weights by hand


def test_gap_weights_by_hand():
    # linear: gaps 1 and 3 -> raw 1, 3, mean 2 -> weights 0.5, 1.5
    assert gap_weights(t(1.0, 3.0), "linear").tolist() == pytest.approx([0.5, 1.5])
    # sqrt: gaps 1 and 4 -> raw 1, 2, mean 1.5 -> 2/3, 4/3
    assert gap_weights(t(1.0, 4.0), "sqrt").tolist() == pytest.approx([2 / 3, 4 / 3])
    assert gap_weights(t(0.2, 5.0), "none").tolist() == [1.0, 1.0]
    for weighting in ("linear", "sqrt"):
        w = gap_weights(t(0.3, 0.1, 2.0, 0.0), weighting)
        assert w.mean().item() == pytest.approx(1.0)  # the learning rate keeps its meaning
        assert gap_weights(t(0.7, 0.7, 0.7), weighting).tolist() == pytest.approx([1.0] * 3)  # equal gaps
        assert gap_weights(t(0.0, 0.0), weighting).tolist() == [1.0, 1.0]  # nothing to tell them apart


def test_gap_weights_refuse_a_negative_gap_and_an_unknown_name():
    with pytest.raises(ValueError, match=r"score gap .* is -0.5"):
        gap_weights(t(1.0, -0.5), "linear")
    with pytest.raises(ValueError, match="'cubic' is unknown"):
        gap_weights(t(1.0), "cubic")
    with pytest.raises(ValueError, match="gap_weighting"):
        make_preference_loss("dpo", gap_weighting="cubic")


def test_weighted_dpo_by_hand():
    # pair 0: Δ = (−5 + 6) − (−7 + 6) = 2, β·Δ = 0.2;  pair 1: Δ = 0, β·Δ = 0
    # per-pair losses −log σ(0.2) = 0.598139 and log 2 = 0.693147; weights 0.5 and 1.5
    dpo = make_preference_loss("dpo", beta=0.1, gap_weighting="linear")
    loss, _ = dpo.loss(logps((-5, -4), (-7, -4), (-6, -4), (-6, -4), weights=t(0.5, 1.5)))
    assert loss.item() == pytest.approx((0.5 * 0.598139 + 1.5 * math.log(2)) / 2, abs=1e-6)
    unweighted, _ = dpo.loss(logps((-5, -4), (-7, -4), (-6, -4), (-6, -4)))
    assert unweighted.item() == pytest.approx((0.598139 + math.log(2)) / 2, abs=1e-6)


def tiny_policy(seed=0):
    torch.manual_seed(seed)
    return GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=1, n_head=2, hidden_dim=64, max_seq_len=96))


def scored(pairs, gaps):
    return [PreferencePair(p.prompt, p.chosen, p.rejected, score_chosen=g, score_rejected=0.0)
            for p, g in zip(pairs, gaps)]


def rows_with_reference(pairs, tok, policy):
    rows = preference_episodes(pairs, tok)
    cache_reference_logps(frozen_copy(policy), rows, tok.pad_id)
    return rows


def test_equal_gaps_give_the_unweighted_loss_through_the_batch():
    tok, policy = CharTokenizer(), tiny_policy()
    pairs = scored(sentiment_pairs(4, seed=1), [0.8] * 4)
    rows = rows_with_reference(pairs, tok, policy)
    policy.train()
    plain = make_preference_loss("dpo", beta=0.5)
    weighted = make_preference_loss("dpo", beta=0.5, gap_weighting="linear")
    batch = preference_batch(rows, range(4), tok.pad_id, weighted.gap_weighting)
    assert batch.pair_weights.tolist() == pytest.approx([1.0] * 8)
    trainer = Trainer(policy, lr=1e-3, total_steps=1)
    outputs = trainer.forward(batch)
    a, _ = weighted.compute_loss(outputs, batch)
    b, _ = plain.compute_loss(outputs, preference_batch(rows, range(4), tok.pad_id))
    assert a.item() == pytest.approx(b.item(), abs=1e-6)


def test_pair_weights_follow_the_gaps_and_micro_batches_share_the_steps_weights():
    # gaps 1, 3, 0, 4 -> linear weights 0.5, 1.5, 0, 2 (mean 1 over the four pairs of the step);
    # micro-batches of 2 rows (one pair) must sum to the whole step's gradient, which needs
    # the weights normalised once over the step, not once per micro-batch
    tok = CharTokenizer()
    pairs = scored(sentiment_pairs(4, seed=2), [1.0, 3.0, 0.0, 4.0])
    batch = preference_batch(preference_episodes(pairs, tok), range(4), tok.pad_id, "linear")
    assert batch.pair_weights.tolist() == pytest.approx([0.5, 0.5, 1.5, 1.5, 0.0, 0.0, 2.0, 2.0])
    grads = []
    for micro in (0, 2):
        policy = tiny_policy()
        rows = rows_with_reference(pairs, tok, policy)
        trainer = Trainer(policy, lr=1e-3, total_steps=1, micro_batch_size=micro, grad_clip=0.0)
        loss = make_preference_loss("dpo", beta=0.5, gap_weighting="linear")
        trainer.update(preference_batch(rows, range(4), tok.pad_id, loss.gap_weighting), loss)
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters()]))  # kept until the next step
    assert torch.allclose(grads[0], grads[1], atol=1e-6)
    unweighted = tiny_policy()  # and the weights matter: weight 1 per pair is another gradient
    rows = rows_with_reference(pairs, tok, unweighted)
    Trainer(unweighted, lr=1e-3, total_steps=1, grad_clip=0.0).update(
        preference_batch(rows, range(4), tok.pad_id), make_preference_loss("dpo", beta=0.5))
    assert not torch.allclose(grads[0], torch.cat([p.grad.flatten() for p in unweighted.parameters()]), atol=1e-4)


def test_unscored_and_mixed_pairs_are_refused_when_weighting():
    tok, policy = CharTokenizer(), tiny_policy()
    plain = sentiment_pairs(3, seed=3)
    unscored = [PreferencePair(p.prompt, p.chosen, p.rejected) for p in plain]
    mixed = scored(plain[:2], [1.0, 2.0]) + unscored[2:]
    with pytest.raises(ValueError, match="record 2 is a pair without scores"):
        pair_gaps(preference_episodes(mixed, tok))
    with pytest.raises(ValueError, match="record 0 is a pair without scores.*gap_weighting none"):
        train_preference(policy, unscored, "dpo", steps=1, loss_params={"gap_weighting": "sqrt"})
    train_preference(policy, unscored, "dpo", steps=1)  # unweighted: scores are not needed


def test_score_columns_round_trip_and_bad_scores_are_refused(tmp_path):
    path = tmp_path / "uf.jsonl"
    path.write_text('{"prompt": "Q\\n", "chosen": "a", "rejected": "b", "score_chosen": 8.5, "score_rejected": 3}\n'
                    '{"prompt": "Q\\n", "chosen": "c", "rejected": "d"}\n')
    first, second = load_preference_data(path)
    assert (first.score_chosen, first.score_rejected, first.meta) == (8.5, 3.0, {})
    assert (second.score_chosen, second.score_rejected) == (None, None)
    save_preference_jsonl([first, second], tmp_path / "again.jsonl")
    assert load_preference_data(tmp_path / "again.jsonl") == [first, second]
    assert pair_gaps(preference_episodes([first], CharTokenizer())) == [5.5]
    for row, message in (('"score_chosen": 1', "'score_chosen' is set but not its partner"),
                         ('"score_chosen": 1, "score_rejected": 2', "below score_rejected=2"),
                         ('"score_chosen": "high", "score_rejected": 2', "must be a finite number")):
        path.write_text('{"prompt": "Q\\n", "chosen": "a", "rejected": "b", ' + row + "}\n")
        with pytest.raises(ValueError, match=message):
            load_preference_data(path)


# ------------------------------------------------------------------ the KL term


def test_kl_term_by_hand():
    # pair: chosen log-ratio −5 − (−6) = 1, rejected −7 − (−7) = 0; Δ = 1, β·Δ = 0.1
    # KL term ½ · mean(1², 0²) = 0.25; loss = −log σ(0.1) + 2 · 0.25
    dpo = make_preference_loss("dpo", beta=0.1, kl_coef=2.0)
    loss, m = dpo.loss(logps((-5,), (-7,), (-6,), (-7,)))
    assert m["kl_seq"] == pytest.approx(0.25)
    assert loss.item() == pytest.approx(-F.logsigmoid(t(0.1)).item() + 0.5, abs=1e-6)


def test_kl_term_is_zero_at_the_reference():
    at_ref = logps((-5, -3), (-7, -9), (-5, -3), (-7, -9))
    loss, m = make_preference_loss("dpo", beta=0.1, kl_coef=10.0).loss(at_ref)
    assert m["kl_seq"] == 0.0 and loss.item() == pytest.approx(math.log(2), abs=1e-6)


@pytest.mark.parametrize("drift", [1.5, -2.0])
def test_kl_term_gradient_pulls_each_response_toward_the_reference(drift):
    # the KL term alone (loss with kl_coef − loss without): d/d log π(y) = λ · ½ · (log π − log π_ref) · 2/(2B)
    chosen, rejected = t(-6 + drift), t(-7 - drift)
    chosen.requires_grad_(True), rejected.requires_grad_(True)
    kl_only = [make_preference_loss("dpo", beta=0.1, kl_coef=c) for c in (3.0, 0.0)]
    values = [loss.loss(PreferenceLogps(chosen, rejected, t(1.0), t(1.0), t(-6.0), t(-7.0)))[0] for loss in kl_only]
    (values[0] - values[1]).backward()
    assert chosen.grad.item() == pytest.approx(3.0 * 0.5 * drift, abs=1e-5)
    assert rejected.grad.item() == pytest.approx(3.0 * 0.5 * -drift, abs=1e-5)
    # gradient descent moves each log-prob against its gradient: toward the reference's
    assert torch.sign(-chosen.grad).item() == -math.copysign(1, drift)
    assert torch.sign(-rejected.grad).item() == math.copysign(1, drift)


def test_gap_weighting_on_an_unscored_pairs_file_is_refused_before_the_run(tmp_path):
    path = tmp_path / "pairs.jsonl"
    save_preference_jsonl(sentiment_pairs(2, seed=0) + [PreferencePair("Q\n", "a", "b")], path)
    rl = RLConfig(algo="dpo", algo_params={"gap_weighting": "linear"}, preference=PreferenceConfig(pairs=str(path)))
    with pytest.raises(ConfigError, match=r"dpo.gap_weighting.*1 of its 3 records \(the first: record 2\)"):
        check_rl(rl)
    save_preference_jsonl(sentiment_pairs(3, seed=0), path)  # the lexicon's scores: every pair scored
    check_rl(rl)
