"""posttrain/systems: rooflines, stragglers, the Gantt simulator, weight sync, scheduling tricks
and the throughput equation, each against numbers worked by hand, loop against closed form,
and Monte Carlo against quadrature."""

import dataclasses
import math

import pytest

from posttrain.systems import gantt, scheduling, stragglers
from posttrain.systems.hardware import DEVICES, Device
from posttrain.systems.roofline import (crossover_rows, decode_seconds, decode_step, forward_flops_per_token,
                                        low_precision_decode_speedup, optimizer_step, prefill,
                                        training_flops_per_token)
from posttrain.systems.shapes import PRESETS, ModelShape, matmul_parameter_count
from posttrain.systems.throughput import (DEFAULT_LEVERS, Lever, RoleTimes, Workload, allocate_levers, bottleneck,
                                          rank_levers, role_times_from_metrics, rollout_seconds, roofline_role_times,
                                          step_seconds)

# 2 layers, width 8, 2 query heads sharing 1 KV head of 4, MLP 16, vocabulary 10
TOY = ModelShape("toy", n_layers=2, hidden=8, n_heads=2, n_kv_heads=1, head_dim=4, intermediate=16, vocab=10,
                 tied_embeddings=False, max_positions=64)
DEVICE = Device("toy", 1e9, flops_per_second=1e12, bytes_per_second=1e11, link_bytes_per_second=1e10)


def test_toy_counts_by_hand():
    # per layer: q 8·8, k and v 8·4 each, o 8·8 = 192; MLP 3·8·16 = 384; × 2 layers + head 10·8
    assert matmul_parameter_count(TOY) == 2 * (192 + 384) + 80 == 1232
    assert forward_flops_per_token(TOY, 0) == 2464
    assert forward_flops_per_token(TOY, 10) == 2464 + 4 * 2 * 2 * 4 * 10  # QKᵀ and AV, 64 FLOPs per key
    assert training_flops_per_token(TOY, 0) == 3 * 2464 and training_flops_per_token(TOY, 0, True) == 4 * 2464


def test_decode_step_by_hand():
    # 4 rows after 9 tokens: 4 × (2464 + 64·10) FLOPs; weights 1232 × 2 bytes + 4 rows × 10 tokens × 32 bytes of KV
    step = decode_step(TOY, DEVICE, rows=4, context_tokens=9, weight_bytes=2, kv_bytes=2)
    assert (step.flops, step.bytes) == (4 * 3104, 2464 + 4 * 10 * 32)
    assert step.compute_seconds == pytest.approx(12416 / 1e12) and step.memory_seconds == pytest.approx(3744 / 1e11)
    assert step.bound == "memory" and step.seconds == step.memory_seconds


def test_crossover_balances_the_two_ceilings():
    # context 0: per row 2528 FLOPs and 32 KV bytes; weights 2464 bytes: B = (2464/1e11) / (2528/1e12 − 32/1e11)
    rows = crossover_rows(TOY, DEVICE, 0, 2, 2)
    assert rows == pytest.approx(2.464e-8 / (2.528e-9 - 3.2e-10))
    step = decode_step(TOY, DEVICE, rows, 0, 2, 2)
    assert step.compute_seconds == pytest.approx(step.memory_seconds)
    assert crossover_rows(TOY, DEVICE, 9, 2, 2) == math.inf  # 10 tokens of cache read cost more than the FLOPs
    # the textbook form, when attention is negligible: FLOP/s × bytes per weight / (2 × bandwidth)
    h100 = DEVICES["h100-80gb"]
    assert crossover_rows(PRESETS["llama-3-8b"], h100, 0, 2, 2) == pytest.approx(989e12 * 2 / (2 * 3.35e12), rel=0.01)


def test_prefill_and_ragged_decode():
    # prefill of 3 prompts of 4 tokens: 3 × (2·1232·4 + 64·(1+2+3+4)) FLOPs
    assert prefill(TOY, DEVICE, 3, 4, 2, 2).flops == 3 * (2 * 1232 * 4 + 64 * 10)
    # rows leave as they finish: steps of 3, 2, 1 rows sum to the three single steps
    total = decode_seconds(TOY, DEVICE, [3, 2, 1], 5, 2, 2)
    assert total == pytest.approx(sum(decode_step(TOY, DEVICE, n, 5 + t, 2, 2).seconds for t, n in enumerate([3, 2, 1])))
    assert optimizer_step(DEVICE, 1000).memory_seconds == pytest.approx(28_000 / 1e11)


def test_low_precision_pays_only_while_the_weights_bind():
    # one row, no context: memory time 1232·w + 32 bytes against 2528 FLOPs at 1e12 (2.5 ns): memory-bound
    assert low_precision_decode_speedup(TOY, DEVICE, 1, 0, 2, 1, 2) == pytest.approx((2464 + 32) / (1232 + 32))
    assert low_precision_decode_speedup(TOY, DEVICE, 10_000, 0, 2, 1, 2) == pytest.approx(1.0)  # compute-bound


# ---- stragglers ------------------------------------------------------------------------


def test_lognormal_moments_and_the_trivial_cases():
    mu, sigma = stragglers.lognormal_params(500.0, 1.0)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(500.0)  # its mean
    assert math.sqrt(math.exp(sigma**2) - 1) == pytest.approx(1.0)  # its cv
    assert stragglers.straggler_tax(1, 1.0) == pytest.approx(1.0, rel=1e-4)  # one draw: its max is its mean
    assert stragglers.expected_max(256, 300.0, 0.0) == pytest.approx(300.0, rel=1e-4)  # no spread, no tax


@pytest.mark.parametrize("n,cv", [(8, 0.5), (256, 0.5), (256, 1.31)])
def test_expected_max_against_monte_carlo(n, cv):
    assert stragglers.expected_max(n, 1.0, cv) == pytest.approx(stragglers.simulated_max(n, 1.0, cv, 3000), rel=0.03)


def test_the_tax_of_a_reasoning_batch():
    # σ = 1 (cv 1.31), 256 rows: the batch waits ~11 mean lengths
    assert stragglers.straggler_tax(256, math.sqrt(math.e - 1)) == pytest.approx(11.16, abs=0.05)
    lengths = stragglers.expected_lengths(256, 1.0, 0.5)
    assert lengths == sorted(lengths) and sum(lengths) / 256 == pytest.approx(1.0, rel=0.02)


def test_decode_time_closed_form_equals_the_loop():
    lengths, a, b = [3, 1, 2, 7], 1.0, 0.1
    loop = sum(a + b * sum(L > t for L in lengths) for t in range(max(lengths)))  # step t: the rows still alive
    assert stragglers.decode_seconds(lengths, a, b) == pytest.approx(loop) == pytest.approx(7 + 1.3)
    assert stragglers.static_batch_seconds(lengths, a, b) == pytest.approx((1 + 0.4) * 7)


def test_patches_compose_in_order():
    steps = stragglers.straggler_patches(256, 500, 1.0, 0.02, 1e-4, cap=2000, keep_fraction=0.9)
    assert [s.patch.split(" ")[0] for s in steps] == ["none", "packing", "length", "dynamic"]
    assert all(later.seconds < earlier.seconds for earlier, later in zip(steps, steps[1:]))
    assert steps[2].decode_steps == 2000
    even = stragglers.straggler_patches(64, 500, 0.0, 0.02, 1e-4)  # equal lengths: packing changes nothing
    assert even[1].seconds == pytest.approx(even[0].seconds)


def test_overlong_penalty_by_hand():
    assert [stragglers.overlong_penalty(L, 100, 20) for L in (80, 90, 100, 130)] == [0.0, -0.5, -1.0, -1.0]


def test_logprob_mismatch_by_hand():
    # log w = 0 and ln 3: weights 1 and 3
    m = stragglers.logprob_mismatch([-1.0, -2.0], [-1.0, -2.0 + math.log(3)], cap=2.0)
    assert m.mean_abs_logp_diff == pytest.approx(math.log(3) / 2)
    assert m.kl_k3 == pytest.approx((3 - 1 - math.log(3)) / 2)
    assert (m.clipped_fraction, m.effective_sample_fraction) == (0.5, pytest.approx(16 / 20))


# ---- Gantt and weight sync -------------------------------------------------------------


def test_colocated_and_sync_schedules_by_hand():
    for topology in ("colocated", "sync"):
        g = gantt.simulate(topology, [2, 2], [1, 1], 0.5)
        assert [(b.lane, b.start, b.end) for b in g.bars] == [
            ("rollout", 0, 2), ("train", 2, 3), ("sync", 3, 3.5), ("rollout", 3.5, 5.5), ("train", 5.5, 6.5),
            ("sync", 6.5, 7)]
        assert g.staleness == [0, 0]


def test_async_schedule_by_hand():
    g = gantt.simulate("async", [2, 2, 2], [1, 1, 1], 0.5, max_staleness=1)
    rollouts = [(b.start, b.end, b.weight_version) for b in g.bars if b.lane == "rollout"]
    assert rollouts == [(0, 2, 0), (2, 4, 0), (4, 6, 1)]  # batch 2 starts at 4, after version 1 (3.5)
    assert g.staleness == [0, 1, 1] and g.makespan == 7.5
    assert g.steady_step_seconds() == 2.0 == step_seconds(RoleTimes(rollout=2, train=1, sync=0.5), "async")
    assert "rollout |" in gantt.render(g) and g.busy_fraction("rollout") == pytest.approx(6 / 7.5)


def test_the_freshness_wall():
    steady = gantt.freshness_wall([3.0] * 8, [2.0] * 8, 0.5, range(0, 4))
    assert steady[1][1] < steady[0][1]  # one step ahead pays
    assert steady[2][1] == pytest.approx(steady[1][1]) and steady[3][2] >= steady[1][2]  # more staleness, no speed
    jumpy = gantt.freshness_wall([1.0, 6.0] * 6, [3.0] * 12, 0.0, range(1, 3))
    assert jumpy[1][1] < jumpy[0][1]  # variable rollouts: a second step ahead still smooths them


def test_weight_sync_by_hand():
    s = gantt.weight_sync(1e9, train_gpus=8, link_bytes_per_second=1e11, memory_bytes_per_second=1e12,
                          engine_tensor_parallel=2)
    assert (s.all_gather, s.cast, s.broadcast, s.reshard) == pytest.approx((7 / 8 * 4e9 / 1e11, 6e9 / 1e12, 0.02, 0.002))
    assert gantt.weight_sync(1e9, train_gpus=1, link_bytes_per_second=1e11, memory_bytes_per_second=1e12,
                             master_bytes=4, engine_bytes=4, colocated=True).total == pytest.approx(2 * 4e9 / 1e12)


# ---- scheduling tricks -----------------------------------------------------------------


def test_tricks_by_hand():
    assert scheduling.speculative_tokens_per_pass(0.5, 2) == 1.75
    assert scheduling.speculative_decoding_factor(0.5, 2, 0.1) == pytest.approx(1.2 / 1.75)
    assert scheduling.prefix_caching_factor(100, 8) == 0.125
    assert scheduling.prefix_caching_factor(100, 8, shared_system_tokens=20, prompts=2) == pytest.approx(220 / 1920)
    assert scheduling.chunked_prefill_hidden(2.0, 10.0, 0.9) == pytest.approx(1.0)
    steps = scheduling.apply_tricks(scheduling.RolloutTime(2.0, 10.0), scheduling.Tricks(
        mean_length=100, max_length=400, prompt_tokens=100, samples_per_prompt=8, decode_compute_fraction=0.5,
        acceptance=0.5, draft_tokens=2, draft_cost=0.1))
    assert [round(s.time.total, 4) for s in steps] == [12.0, 4.5, 2.75, 2.5, round(2.5 * 1.2 / 1.75, 4)]
    assert steps[-1].speedup_over(steps[0]) == pytest.approx(12 / (2.5 * 1.2 / 1.75))


# ---- the throughput equation -----------------------------------------------------------


def test_step_seconds_and_the_binding_side():
    t = RoleTimes(rollout=6, verifier=0.5, reference=1, train=2.5, sync=0.5)
    assert step_seconds(t, "colocated") == step_seconds(t, "sync") == 10.5
    assert step_seconds(t, "async") == 6 and bottleneck(t, "async") == "rollout"
    gains = {g.lever.name: g.saved_seconds for g in rank_levers(t, "async", [Lever("no ref", {"reference": 0})])}
    assert gains == {"no ref": 0}  # the trainer side does not bind: removing its reference saves nothing
    assert rank_levers(t, "colocated", [Lever("no ref", {"reference": 0})])[0].saved_seconds == 1
    ranked = rank_levers(t, "colocated", DEFAULT_LEVERS)
    assert ranked[0].saved_seconds >= ranked[-1].saved_seconds
    with pytest.raises(ValueError, match="not known"):
        t.scaled({"decode": 0.5})


def test_role_times_from_a_metrics_row():
    row = {"time/rollout": 1.2, "time/rollout_compute": 1.0, "time/score": 0.1, "time/reference": 0.5,
           "time/train": 2.0, "time/process_reward": 0.3, "time/sync": 0.05, "time/step": 4.2}
    assert role_times_from_metrics(row) == RoleTimes(1.2, 0.1, 0.5, 2.3, 0.05)
    assert role_times_from_metrics(row, "time/rollout_compute").rollout == 1.0


def test_roofline_role_times_invariances():
    w = Workload(prompts=8, samples_per_prompt=8, prompt_tokens=64, mean_response_tokens=128, response_cv=0.5)
    one = roofline_role_times(PRESETS["llama-3-8b"], DEVICES["h100-80gb"], w, gpus=1)
    eight = roofline_role_times(PRESETS["llama-3-8b"], DEVICES["h100-80gb"], w, gpus=8)
    assert eight.train < one.train / 4 and eight.reference == pytest.approx(one.reference / 8, rel=0.05)
    assert roofline_role_times(PRESETS["llama-3-8b"], DEVICES["h100-80gb"], dataclasses.replace(w, reference=False)
                               ).reference == 0
    assert one.sync < eight.sync  # one GPU gathers nothing; eight all-gather their shards


# ---- lessons 22c and 28: the pipeline bubble and the lever allocator --------------------


def test_pipeline_bubble_by_hand():
    assert gantt.pipeline_bubble(4, 12) == pytest.approx(3 / 15)  # GPipe: (p − 1) / (m + p − 1)
    assert gantt.pipeline_bubble(4, 1) == pytest.approx(3 / 4)  # one micro-batch of stragglers: 3 of 4 stages idle
    assert gantt.pipeline_bubble(1, 5) == 0
    with pytest.raises(ValueError, match="at least 1"):
        gantt.pipeline_bubble(0, 4)


def test_allocate_levers_composes_greedily_by_hand():
    t = RoleTimes(rollout=6, reference=1, train=3)  # 10 s colocated
    levers = [Lever("fast decode", {"rollout": 0.5}), Lever("fast update", {"train": 0.5}),
              Lever("async", topology="async")]
    chosen = allocate_levers(t, "colocated", levers, budget=3)
    # async first (10 → max(6, 4) = 6), then decode (→ max(3, 4) = 4), then the update (→ max(3, 2.5) = 3)
    assert [(g.lever.name, g.before_seconds, g.after_seconds) for g in chosen] == [
        ("async", 10, 6), ("fast decode", 6, 4), ("fast update", 4, 3)]
    # alone, the update's lever would have saved 1.5 s of the colocated step; after async and
    # the decode lever, 1 s; before the decode lever, nothing (the rollout side binds)
    assert rank_levers(RoleTimes(rollout=6, reference=1, train=3), "async", levers[1:2])[0].saved_seconds == 0
    assert [g.lever.name for g in allocate_levers(t, "colocated", levers, budget=1)] == ["async"]
    assert allocate_levers(t, "colocated", [Lever("nothing", {"sync": 0.5})], budget=2) == []  # sync is 0 s already
    with pytest.raises(ValueError, match="budget"):
        allocate_levers(t, "colocated", levers, budget=-1)
def test_the_busiest_engine_holds_the_longest_row_whatever_the_engine_count():
    # 512 rows on 6 engines (6 does not divide 512): the engine dealt the longest row binds,
    # so more engines never make the rollout slower, and never faster than the longest row alone
    w = Workload(prompts=64, samples_per_prompt=8, prompt_tokens=256, mean_response_tokens=1024.0)
    seconds = {n: rollout_seconds(PRESETS["qwen2.5-7b"], DEVICES["h100-80gb"], w, n) for n in (1, 2, 4, 6, 8, 512)}
    assert all(seconds[a] >= seconds[b] for a, b in zip(seconds, list(seconds)[1:]))
    assert seconds[6] > 0.9 * seconds[8]  # the longest row decodes for as long on either
