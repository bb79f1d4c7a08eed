"""Tests every registered algorithm the same way: it has a docs page whose code pointers
resolve, it builds with its defaults, it runs compute_advantages + compute_loss on a
random batch to a finite loss with a gradient, and one SGD step on a tiny categorical
policy raises the log-prob of a token with positive advantage."""

import dataclasses
import importlib
import re
from pathlib import Path

import pytest
import torch

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.algorithms.contract import Algorithm
from posttrain.algorithms.core import LOSS_AGG_MODES
from posttrain.teach.widgets import BUDGET
from posttrain.types import PolicyOutputs, RolloutBatch

ROOT = Path(__file__).resolve().parents[1]
POINTER = re.compile(r"`(posttrain/[\w/]+\.py)::([\w.]+)`")


def random_batch(seed=0, B=6, T=9, K=3):
    """B rows in groups of K; prompts of 2-3 tokens, responses of 2-5, right padding;
    ref_logp, values, process_rewards and teacher_logp filled. Rewards in {0, 1} with every group mixed."""
    gen = torch.Generator().manual_seed(seed)
    response_mask = torch.zeros(B, T)
    attention_mask = torch.zeros(B, T)
    for b in range(B):
        P = 2 + b % 2
        R = 2 + (b * 7) % 4
        attention_mask[b, : P + R] = 1
        response_mask[b, P : P + R] = 1
    on = response_mask > 0
    old_logp = torch.where(on, -torch.rand(B, T, generator=gen) * 2, 0.0)
    ref_logp = torch.where(on, old_logp + 0.2 * torch.randn(B, T, generator=gen), 0.0)
    values = torch.where(on, torch.rand(B, T, generator=gen), 0.0)
    rewards = torch.tensor([1.0, 0.0] * (B // 2))[:B]
    return RolloutBatch(
        tokens=torch.randint(0, 10, (B, T), generator=gen),
        attention_mask=attention_mask,
        response_mask=response_mask,
        old_logp=old_logp,
        rewards=rewards,
        group_ids=torch.arange(B) // K,
        ref_logp=ref_logp,
        values=values,
        process_rewards=torch.where(on, 0.05 * torch.randn(B, T, generator=gen), 0.0),  # an implicit PRM's (PRIME)
        teacher_logp=torch.where(on, old_logp - 0.3 * torch.rand(B, T, generator=gen), 0.0),  # a teacher's (OPD)
    )


def _resolve(path: str, qualname: str):
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    obj = module
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_has_a_docs_page_whose_pointers_resolve(name):
    page = ROOT / "docs" / "algorithms" / f"{name}.md"
    assert page.exists(), f"missing docs page {page}"
    pointers = POINTER.findall(page.read_text())
    assert pointers, f"{page} has no `posttrain/...py::function` pointers"
    for path, qualname in pointers:
        assert (ROOT / path).exists(), path
        assert callable(_resolve(path, qualname)), f"{path}::{qualname}"
    # and the algorithm's own class is among them
    cls = ALGORITHMS[name]
    assert any(_resolve(p, q) is cls for p, q in pointers), f"{page} never points at {cls.__name__}"


def test_pointer_check_can_fail():
    with pytest.raises(AttributeError):
        _resolve("posttrain/algorithms/ppo.py", "no_such_function")


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_with_defaults_to_a_finite_loss_with_a_gradient(name):
    algo = make_algorithm(name, budget=BUDGET)
    assert algo.name == name
    assert isinstance(algo.uses_reference, bool) and isinstance(algo.uses_critic, bool)
    batch = random_batch()
    out = algo.compute_advantages(batch)
    assert out["advantages"].shape == batch.tokens.shape
    assert (out["advantages"][batch.response_mask == 0] == 0).all()
    batch = dataclasses.replace(batch, **out)
    gen = torch.Generator().manual_seed(1)
    logp = (batch.old_logp + 0.1 * torch.randn(batch.old_logp.shape, generator=gen)).requires_grad_(True)
    values = (batch.values + 0.1).requires_grad_(True)
    entropy = torch.rand(batch.old_logp.shape, generator=gen)
    loss, metrics = algo.compute_loss(PolicyOutputs(logp=logp, entropy=entropy, values=values), batch)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all() and logp.grad.abs().sum() > 0
    assert (logp.grad[batch.response_mask == 0] == 0).all()
    if algo.uses_critic:
        assert values.grad.abs().sum() > 0
    for key in ("pg_loss", "approx_kl", "entropy", "adv_mean", "adv_std"):
        assert isinstance(metrics[key], float), (name, key)
    assert all(isinstance(v, float) for v in metrics.values()), metrics


def sgd_step_on_categorical(algo, rewards, group_ids, tokens_sampled):
    """A policy that is just a logits vector over V = 5 tokens (no context). Each row is
    [prompt token, one sampled response token]. Returns log π before and after one SGD
    step on the algorithm's loss."""
    torch.manual_seed(0)
    logits = torch.nn.Parameter(torch.randn(5))
    B = len(rewards)
    tokens = torch.stack([torch.zeros(B, dtype=torch.long), torch.tensor(tokens_sampled)], dim=1)  # (B, 2)
    with torch.no_grad():
        old = torch.log_softmax(logits, -1)[tokens[:, 1]]  # (B,)
    old_logp = torch.stack([torch.zeros(B), old], dim=1)  # (B, 2)
    batch = RolloutBatch(
        tokens=tokens,
        attention_mask=torch.ones(B, 2),
        response_mask=torch.tensor([[0.0, 1.0]] * B),
        old_logp=old_logp,
        rewards=torch.tensor(rewards),
        group_ids=torch.tensor(group_ids),
        ref_logp=old_logp.clone(),
        values=torch.zeros(B, 2),
        process_rewards=torch.zeros(B, 2),
        teacher_logp=old_logp.clone(),  # a teacher that agrees with the policy: no signal of its own
    )
    batch = dataclasses.replace(batch, **algo.compute_advantages(batch))
    log_probs = torch.log_softmax(logits, -1)  # (V,)
    logp = torch.stack([torch.zeros(B), log_probs[tokens[:, 1]]], dim=1)  # (B, 2)
    outputs = PolicyOutputs(logp=logp, entropy=torch.zeros(B, 2), values=torch.zeros(B, 2, requires_grad=True))
    loss, _ = algo.compute_loss(outputs, batch)
    loss.backward()
    with torch.no_grad():
        before = torch.log_softmax(logits, -1).clone()
        logits -= 0.1 * logits.grad  # one SGD step
        after = torch.log_softmax(logits, -1)
    return before, after


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_one_sgd_step_raises_the_rewarded_token_and_lowers_the_other(name):
    # one group of two: token 3 got reward 1 (advantage > 0), token 1 got 0 (advantage < 0)
    # REINFORCE's default has no baseline; OPD's signal is the teacher's, the reward only when weighted in
    params = {"reinforce": {"baseline": "group_mean"}, "opd": {"reward_weight": 1.0}}.get(name, {})
    before, after = sgd_step_on_categorical(make_algorithm(name, budget=BUDGET, **params), [1.0, 0.0], [0, 0], [3, 1])
    assert after[3] > before[3] and after[1] < before[1]
    before, after = sgd_step_on_categorical(make_algorithm(name, budget=BUDGET, **params), [0.0, 1.0], [0, 0], [3, 1])
    assert after[3] < before[3] and after[1] > before[1]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_state_dict_if_any_is_plain_floats_and_round_trips(name):
    algo = make_algorithm(name, budget=BUDGET)
    algo.compute_advantages(random_batch())
    state = algo.state_dict()
    assert all(type(v) is float for v in state.values())
    fresh = make_algorithm(name, budget=BUDGET)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_unknown_fields_are_rejected_with_the_valid_ones_listed(name):
    with pytest.raises(ValueError, match="valid fields"):
        make_algorithm(name, budget=BUDGET, no_such_field=1)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_declares_the_hooks_the_controller_calls(name):
    algo = make_algorithm(name, budget=BUDGET)
    assert isinstance(algo, Algorithm)
    batch = random_batch()
    assert algo.filter_batch(batch).batch_size <= batch.batch_size
    assert isinstance(algo.state_dict(), dict) and isinstance(algo.kl_coef, float)
    assert algo.loss_agg in LOSS_AGG_MODES


def test_the_controller_never_probes_an_algorithm():
    """Every hook is declared (algorithms/contract.py::Algorithm), so the step loop calls
    them all instead of asking with getattr / hasattr which ones exist."""
    source = (ROOT / "posttrain" / "roles" / "controller.py").read_text()
    assert "getattr(" not in source and "hasattr(" not in source
