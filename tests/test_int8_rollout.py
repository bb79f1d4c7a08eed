"""int8 rollouts (rl.sampling.weights int8): the sampler decodes with an int8 copy of the
policy, the trainer stays float32, and the update corrects the mismatch with truncated
importance weights (roles/mismatch.py, rl.mismatch's default token_truncate)."""

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from posttrain.algorithms.grpo import GRPO
from posttrain.config import ConfigError, DistConfig, MismatchConfig, ModelConfig, RLConfig, SamplingParams, TrainConfig
from posttrain.roles.rollout import ColocatedRollout, RolloutRequest
from posttrain.models.int8 import Int8Sampler
from posttrain.pipelines.build import make_rollout
from posttrain.pipelines.checks import check_int8_sampling
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.mismatch import MismatchCorrection, SamplerIsTrainer
from posttrain.roles.trainer import Trainer
from posttrain.roles.weight_sync import InProcessWeightSync
from posttrain.runs.monitors import check_all
from posttrain.types import Example, RolloutBatch
from tests.test_rollout import TOK, examples, tiny_model

INT8 = SamplingParams(max_new_tokens=16, weights="int8")


def sampled_batch(model, cap: float, seed: int = 0):
    """A colocated int8 rollout over `model` with its first batch sampled, rewarded
    (alternately 1 and 0 within each group) and given GRPO's advantages."""
    request = lambda step, round: RolloutRequest(examples(), 4, seed)  # noqa: E731
    rollout = ColocatedRollout(model, TOK, INT8, request, correction=MismatchCorrection(cap=cap))
    episodes = rollout.sample(0)
    for i, e in enumerate(episodes):
        e.reward = float(i % 2)
    batch = RolloutBatch.collate(episodes, TOK.pad_id)
    return rollout, dataclasses.replace(batch, **GRPO().compute_advantages(batch))


def teacher_forced_logp(model, batch: RolloutBatch) -> torch.Tensor:
    """log π(token | prefix) of every response token from the full logits, (B, T): written
    here from scratch, independent of the trainer's chunked computation."""
    logits = model(batch.tokens)  # (B, T, V): right-padded rows, causal attention
    logp = F.log_softmax(logits[:, :-1].float() / batch.temperature, dim=-1)  # position t predicts t + 1
    taken = logp.gather(-1, batch.tokens[:, 1:, None]).squeeze(-1)  # (B, T - 1)
    return F.pad(taken, (1, 0)) * batch.response_mask  # (B, T)


def test_int8_logp_close_to_float32_but_not_equal():
    model = tiny_model()
    engine = RolloutEngine(model, TOK, INT8, shares_weights=True)
    batch = RolloutBatch.collate(engine.generate(examples(), 8, torch.Generator().manual_seed(0)), TOK.pad_id)
    with torch.no_grad():
        float_logp = teacher_forced_logp(model, batch)
    gap = (batch.old_logp - float_logp)[batch.response_mask.bool()].abs()
    assert gap.numel() > 200
    # measured on this model: mean 1.2e-3, max 5e-3 nats per token (row-wise int8 weights)
    assert 1e-5 < gap.mean() < 5e-3  # > 1e-5: the sampler really decoded with other weights
    assert gap.max() < 2e-2
    assert next(model.parameters()).dtype == torch.float32  # the trainer's policy itself untouched


def test_int8_copy_shares_float_tensors_and_follows_every_update():
    model = tiny_model()
    sampler = Int8Sampler(model)
    assert sampler.module.model.embed_tokens.weight is model.model.embed_tokens.weight
    assert len(sampler.linears) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and lm_head
    engine = RolloutEngine(model, TOK, INT8, shares_weights=True)
    ids = torch.tensor([[TOK.bos_id] + TOK.encode("Q: 1+2\n")])
    logits = lambda module: module(ids)  # noqa: E731
    with torch.no_grad():
        before = logits(engine.decoding_model(INT8))
        for p in model.parameters():
            if p.dim() == 2 and p is not model.model.embed_tokens.weight:  # the Linear weights
                p.add_(0.05 * torch.randn_like(p))  # what an optimizer step does, in place
        assert torch.equal(logits(engine.decoding_model(INT8)), before)  # same version: the old quantisation
        engine.weight_version += 1  # what every weight sync does
        after = logits(engine.decoding_model(INT8))
        assert torch.equal(after, logits(Int8Sampler(model).module))  # quantised again from the new weights
    assert (after - before).abs().max() > 1e-2
    assert engine.requantize_seconds > 0


def test_an_engine_with_its_own_copy_quantises_what_weight_sync_pushed():
    trainer_model = tiny_model()
    engine = RolloutEngine(copy.deepcopy(trainer_model), TOK, INT8)
    sync = InProcessWeightSync(trainer_model, engine)
    ids = torch.tensor([[TOK.bos_id] + TOK.encode("Q: 7\n")])
    with torch.no_grad():
        before = engine.decoding_model(INT8)(ids)
        for p in trainer_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
        sync.push()
        after = engine.decoding_model(INT8)(ids)
        torch.testing.assert_close(after, Int8Sampler(trainer_model).module(ids), atol=0, rtol=0)
        assert (after - before).abs().max() > 1e-2


def test_is_weights_are_truncated_ratio_of_float_to_int8():
    model = tiny_model()
    cap = 1.002  # below the largest ratios this tiny model gives, so some weights are clipped
    rollout, batch = sampled_batch(model, cap)
    trainer = Trainer(model, lr=1e-3, total_steps=1)
    corrected, metrics = rollout.off_policy_correction(batch, trainer)
    mask = batch.response_mask
    with torch.no_grad():
        old_float = teacher_forced_logp(model, batch)
    torch.testing.assert_close(corrected.old_logp, old_float, atol=1e-5, rtol=0)
    weights = torch.exp(old_float - batch.old_logp).clamp(max=cap) * mask
    torch.testing.assert_close(corrected.advantages, batch.advantages * weights, atol=1e-5, rtol=0)
    raw = torch.exp(old_float - batch.old_logp)[mask.bool()]
    clipped = (raw > cap).float().mean().item()
    assert 0 < clipped < 1
    assert metrics["mismatch/truncated_fraction"] == pytest.approx(clipped, abs=1e-6)
    assert metrics["mismatch/logp_diff_mean"] == pytest.approx((old_float - batch.old_logp)[mask.bool()].abs().mean()
                                                               .item(), rel=1e-4)
    assert metrics["mismatch/ratio_max"] == pytest.approx(raw.max().item(), rel=1e-4)
    assert metrics["mismatch/ratio_min"] <= 1 <= metrics["mismatch/ratio_max"]
    assert metrics["int8/requantize_seconds"] >= 0  # the engine's own


def test_pi_old_is_recomputed_for_the_trained_rows_only():
    model = tiny_model()
    rollout, batch = sampled_batch(model, cap=2.0)
    inert = batch.group_ids == 0  # (B,) group 0 scores alike, so it has no gradient; the others alternate
    batch.rewards = torch.where(inert, 1.0, batch.rewards)
    batch = dataclasses.replace(batch, **GRPO().compute_advantages(batch))
    batch.rows_with_gradient = GRPO().rows_with_gradient(batch)
    assert torch.equal(batch.rows_with_gradient, ~inert) and 0 < inert.sum() < batch.batch_size
    trainer = Trainer(model, lr=1e-3, total_steps=1)
    forwarded = []
    forward = trainer.forward
    trainer.forward = lambda b: forwarded.append(b.batch_size) or forward(b)
    corrected, metrics = rollout.off_policy_correction(batch, trainer)
    assert forwarded == [int((~inert).sum())]  # one pass, over the trained rows alone
    with torch.no_grad():
        old_float = teacher_forced_logp(model, batch)
    torch.testing.assert_close(corrected.old_logp[~inert], old_float[~inert], atol=1e-5, rtol=0)
    assert torch.equal(corrected.old_logp[inert], batch.old_logp[inert])  # left out: nothing reads its π_old
    assert not corrected.advantages[inert].any()
    gap = (old_float - batch.old_logp)[~inert][batch.response_mask[~inert].bool()]
    assert metrics["mismatch/logp_diff_mean"] == pytest.approx(gap.abs().mean().item(), rel=1e-4)
    assert metrics["mismatch/kl"] == pytest.approx(-gap.mean().item(), rel=1e-3, abs=1e-7)


def test_update_equals_gradient_by_hand():
    """The GRPO gradient of the corrected batch = -(1/B) Σ_i 1/|o_i| Σ_t w_it A_i ∇log π(o_it),
    with w = min(π_float / π_int8, cap): at θ = θ_old every ratio is 1, so nothing is clipped."""
    model = tiny_model()
    cap = 1.002
    rollout, batch = sampled_batch(model, cap)
    trainer = Trainer(model, lr=1e-3, total_steps=1)
    corrected, _ = rollout.off_policy_correction(batch, trainer)
    loss, _ = GRPO().compute_loss(trainer.forward(corrected), corrected)
    loss.backward()
    pipeline_grads = [p.grad.clone() for p in model.parameters()]

    by_hand = copy.deepcopy(model)
    by_hand.zero_grad(set_to_none=True)
    logp = teacher_forced_logp(by_hand, batch)  # (B, T), with gradient
    mask = batch.response_mask
    w = torch.exp(logp.detach() - batch.old_logp).clamp(max=cap) * mask  # (B, T)
    adv = batch.advantages  # (B, T): the group's advantage on each response token
    per_row = (w * adv * logp).sum(dim=1) / mask.sum(dim=1)  # (B,)
    (-per_row.mean()).backward()
    for p, g in zip(by_hand.parameters(), pipeline_grads):
        torch.testing.assert_close(p.grad, g, atol=1e-6, rtol=1e-5)

    # the weights matter: without them (w = 1) the gradient is measurably different
    by_hand.zero_grad(set_to_none=True)
    logp = teacher_forced_logp(by_hand, batch)
    (-((adv * logp).sum(dim=1) / mask.sum(dim=1)).mean()).backward()
    gap = max((p.grad - g).abs().max().item() for p, g in zip(by_hand.parameters(), pipeline_grads))
    assert gap > 1e-5, gap  # measured 8.6e-5: 85 times the tolerance above


def test_float32_default_samples_as_before():
    """Drawn by the sampler before int8 existed (same seed, tiny model): the default path
    must not move by a single token, nor old_logp beyond the rounding of another CPU's BLAS
    (recorded on an AVX-512 Xeon; an AVX2 EPYC gives the sum 5e-7 away)."""
    assert SamplingParams().weights == "float32"
    engine = RolloutEngine(tiny_model(), TOK, SamplingParams(max_new_tokens=12))
    episodes = engine.generate(examples(), 2, torch.Generator().manual_seed(3))
    assert [e.response_ids for e in episodes] == [
        [3, 20, 44, 95, 43, 83, 18, 38, 30, 39, 12, 1], [28, 43, 33, 12, 8, 4, 45, 58, 6, 73, 33, 99],
        [77, 40, 96, 66, 44, 0, 47, 33, 68, 34, 0, 84], [16, 77, 8, 55, 56, 9, 91, 37, 42, 33, 8, 23],
        [75, 18, 11, 4, 56, 12, 54, 64, 74, 35, 25, 15], [60, 59, 53, 26, 71, 85, 38, 58, 64, 43, 65, 17]]
    assert sum(sum(e.response_logp) for e in episodes) == pytest.approx(-332.0030937194824, abs=1e-5)
    assert engine._int8 is None  # no int8 copy was made


def test_build_declares_the_correction():
    request = lambda step, round: RolloutRequest([Example("Q: 1\n", "1", "a")], 2, 0)  # noqa: E731
    dist, mismatch = DistConfig(), MismatchConfig(cap=3.0)
    assert isinstance(make_rollout(dist, tiny_model(), TOK, SamplingParams(), request, mismatch=mismatch).correction,
                      SamplerIsTrainer)
    assert make_rollout(dist, tiny_model(), TOK, INT8, request, mismatch=mismatch).correction == \
        MismatchCorrection(cap=3.0)


def test_config_errors():
    with pytest.raises(ConfigError, match=r"rl.sampling.weights.*'int4'.*one of \['float32', 'int8'\]"):
        SamplingParams(weights="int4").validate("rl.sampling")
    with pytest.raises(ConfigError, match=r"rl.sampling.compile.*choose one"):
        SamplingParams(weights="int8", compile=True).validate("rl.sampling")
    int8 = RLConfig(sampling=INT8)
    with pytest.raises(ConfigError, match=r"rl.sampling.weights.*bfloat16.*--device cpu --dtype float32"):
        check_int8_sampling(TrainConfig(dtype="bfloat16", rl=int8))
    with pytest.raises(ConfigError, match=r"rl.sampling.weights.*lora_r=8.*LoRA"):
        check_int8_sampling(TrainConfig(model=ModelConfig(name="smollm2-135m", lora_r=8), rl=int8))
    check_int8_sampling(TrainConfig(device="cpu", rl=int8))  # the supported placement passes
    with pytest.raises(ValueError, match=r"CPU float32 policy.*bfloat16.*--dtype float32"):
        Int8Sampler(tiny_model().to(torch.bfloat16))


def test_monitor_flags_a_sampler_far_from_the_policy():
    rows = [{"step": 0, "mismatch/logp_diff_mean": 0.001}, {"step": 1, "mismatch/logp_diff_mean": 0.8},
            {"step": 2, "mismatch/logp_diff_mean": 0.7}]
    alerts = [a for a in check_all(rows) if a["monitor"] == "sampler_mismatch"]
    assert [(a["step"], a["value"]) for a in alerts] == [(1, 0.8)]  # once, where it starts
    assert "--rl.sampling.weights float32" in alerts[0]["message"]


def test_ray_workers_sample_int8_as_the_single_process_does(cluster, tmp_path):
    """Sync topology, 2 workers: each quantises the weights it is pushed, and the update
    corrects as in one process, so every metric and sample is the colocated int8 run's."""
    pytest.importorskip("ray")
    from tests.test_distributed import rows, samples, tiny, train  # here: that module skips itself without Ray

    runs = {}
    for name, dist in (("colocated", {"rollout_shards": 2}), ("sync", {"workers": 2})):
        cfg = tiny(tmp_path / name, **dist)
        cfg.rl.sampling.weights = "int8"
        runs[name] = train(cfg)
    single, workers = rows(runs["colocated"]), rows(runs["sync"])
    assert all(0 < r["mismatch/logp_diff_mean"] < 0.05 and "mismatch/truncated_fraction" in r for r in workers)
    for a, b in zip(single, workers, strict=True):
        keys = [k for k in a if not k.startswith("time/") and k != "int8/requantize_seconds"]
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}, a["step"]
    assert samples(runs["sync"]) == samples(runs["colocated"])
