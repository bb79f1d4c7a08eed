"""posttrain/systems against measurement on this machine, each with its tolerance.

    KV cache       the bytes the sampler's cache holds = the formula, exactly (gpt_mini, a GQA
                   Llama; SmolLM2 marked slow)
    activations    the bytes autograd saves in a forward pass ≈ the per-token count (±20%)
    memory         the peak RSS of a SmolLM2 GRPO step ≈ the colocated envelope (±15%, slow)
    throughput     time/step ≈ the five logged terms composed by topology: colocated and
                   sync on 2 Ray workers, step by step (±15%); async, the Gantt of its terms
                   over the run (±20%); slow but for colocated
    stragglers     the sampler's time on log-normal lengths ≈ a·max(L) + b·ΣL fitted on other
                   batches (±35% of CPU time, slow), and closer than the mean-length estimate

Timings are CPU seconds of a one-thread process where they can be (time.process_time): the
other jobs on this shared 2-core machine stretch wall time far more than CPU time.
"""

import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from posttrain.config import SamplingParams, TrainConfig
from posttrain.config.files import from_dict
from posttrain.envs.arithmetic import ArithmeticEnv
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.systems import gantt, stragglers
from posttrain.systems.kv_cache import sampler_kv_bytes
from posttrain.systems.memory import activation_bytes
from posttrain.systems.rl_memory import colocated_step_peak
from posttrain.systems.shapes import PRESETS, parameter_count, shape_from_config
from posttrain.systems.throughput import role_times_from_metrics, step_seconds
from posttrain.teach.measure import sampler_cache_bytes, saved_activation_bytes

TOKENIZER = CharTokenizer()


def longest_prompt(tokenizer, examples) -> int:
    return max(len(example_prompt_ids(tokenizer, e)) for e in examples)


def test_gpt_mini_sampler_cache_is_the_formula():
    examples = ArithmeticEnv().fixed_set("dev", 4)
    model = GPTMini(GPTMiniConfig(vocab_size=len(TOKENIZER.itos)))
    got = sampler_cache_bytes(model, TOKENIZER, examples, 8, 20)
    assert got == sampler_kv_bytes(PRESETS["gpt_mini"], 4, 8, longest_prompt(TOKENIZER, examples), 20, 4)


def tiny_llama(**overrides):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                         "num_attention_heads": 4, "num_key_value_heads": 2,
                                         "vocab_size": len(TOKENIZER.itos), "max_position_embeddings": 128, **overrides})
    from posttrain.models.hf import HFPolicy

    return HFPolicy(transformers.LlamaForCausalLM(config)), shape_from_config(config.to_dict())


def test_transformers_gqa_sampler_cache_is_the_formula():
    model, shape = tiny_llama()  # 4 query heads share 2 KV heads: half an MHA cache
    examples = ArithmeticEnv().fixed_set("dev", 3)
    got = sampler_cache_bytes(model, TOKENIZER, examples, 4, 16)
    assert got == sampler_kv_bytes(shape, 3, 4, longest_prompt(TOKENIZER, examples), 16, 4)


@pytest.mark.slow
def test_smollm2_sampler_cache_is_the_formula():
    from posttrain.models.hf import HFPolicy

    model, tokenizer = HFPolicy.load("smollm2-135m")
    examples = ArithmeticEnv().fixed_set("dev", 2)
    got = sampler_cache_bytes(model, tokenizer, examples, 4, 8)
    assert got == sampler_kv_bytes(PRESETS["smollm2-135m"], 2, 4, longest_prompt(tokenizer, examples), 8, 4)


@pytest.mark.parametrize("kind", ["gpt_mini", "llama"])
def test_saved_activations_match_the_count(kind):
    if kind == "gpt_mini":
        model, shape = GPTMini(GPTMiniConfig(vocab_size=len(TOKENIZER.itos))), PRESETS["gpt_mini"]
    else:
        model, shape = tiny_llama()
    model.train()
    for rows, seq_len in [(4, 64), (8, 16)]:
        input_ids = torch.randint(0, len(TOKENIZER.itos), (rows, seq_len), generator=torch.Generator().manual_seed(0))
        measured = saved_activation_bytes(model, input_ids)
        assert measured == pytest.approx(activation_bytes(shape, rows, seq_len, 4), rel=0.2)


# ---- the memory envelope against a real step ---------------------------------------------

PEAK_RSS = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)")


def peak_rss_bytes(argv: list[str]) -> int:
    """The peak resident set of a fresh Python process running argv (a wrapper process
    waits for it alone, so no earlier child of the test run counts)."""
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, sys.executable, *argv], check=True, capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[1])
    return int(out.stdout.strip())


@pytest.mark.slow
def test_smollm2_grpo_step_peak_rss_is_the_envelope(tmp_path):
    runtime = peak_rss_bytes(["-c", "import posttrain.pipelines.run, posttrain.models.hf, "
                                    "transformers.models.llama.modeling_llama"])
    G, K, R = 2, 4, 32
    flags = ["--model", "smollm2-135m", "--sft.steps", "0", "--rl.steps", "2", "--rl.prompts_per_step", str(G),
             "--rl.samples_per_prompt", str(K), "--rl.sampling.max_new_tokens", str(R), "--threads", "1",
             "--heldout_size", "4", "--rl.dev_size", "4", "--rl.reward.length_penalty", "0.01", "--out_dir", str(tmp_path)]
    peak = peak_rss_bytes(["-m", "posttrain", "train", *flags])
    from posttrain.models import load_tokenizer
    from posttrain.models.model_dirs import resolve_model_dir
    from posttrain.roles.engines.contract import encode_prompt

    run = next(tmp_path.iterdir())
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    tokenizer = load_tokenizer(resolve_model_dir("smollm2-135m"))
    P = max(len(encode_prompt(tokenizer, s["prompt"])) for s in samples)
    shape = PRESETS["smollm2-135m"]
    envelope = colocated_step_peak(shape, parameter_count(shape), runtime_bytes=runtime, reference=True,
                                   sampler_rows=G * K, sampler_positions=P + R, train_tokens=G * P + G * K * R,
                                   logits_chunk_tokens=G * K * R)
    assert peak == pytest.approx(envelope.peak_bytes, rel=0.15), (peak, envelope)


# ---- the throughput equation against runs ------------------------------------------------


def small_run(out: Path, **dist) -> list[dict]:
    """make run's gpt_mini on a smaller batch: 8 prompts × 4 samples, 4 RL steps, one thread."""
    from posttrain.pipelines.run import run_pipeline, start_run

    cfg = from_dict(TrainConfig, {
        "sft": {"num_examples": 16, "steps": 4, "batch_size": 8, "warmup_steps": 1},
        "rl": {"prompts_per_step": 8, "samples_per_prompt": 4, "steps": 4, "eval_every": 2, "dev_size": 8,
               "reward": {"length_penalty": 0.01}, "optim": {"warmup_steps": 1}},
        "heldout_size": 8, "threads": 1, "out_dir": str(out), "dist": dist})
    run = start_run(cfg, "train")
    run_pipeline(cfg, run)
    return [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()
            if json.loads(line)["stage"] == "rl"]


def test_colocated_step_is_the_sum_of_its_terms(tmp_path):
    for row in small_run(tmp_path):
        predicted = step_seconds(role_times_from_metrics(row), "colocated") + row.get("time/dev_eval", 0.0)
        assert predicted == pytest.approx(row["time/step"], rel=0.15), row


@pytest.mark.slow
def test_ray_sync_step_is_the_sum_of_its_terms(cluster, tmp_path):
    for row in small_run(tmp_path, workers=2):
        predicted = step_seconds(role_times_from_metrics(row), "sync") + row.get("time/dev_eval", 0.0)
        assert predicted == pytest.approx(row["time/step"], rel=0.15), row


@pytest.mark.slow
def test_ray_async_run_is_the_gantt_of_its_terms(cluster, tmp_path):
    # The workers sample batch s+1 while the trainer works on batch s, so a step's wall time
    # pairs one batch's sampling with another's training: the Gantt simulator lines them up
    # (its async schedule is ours: batch s+1 is requested when step s starts, after version s
    # is out). In steady state this is step_seconds' max(rollout, trainer side).
    rows = small_run(tmp_path, workers=2, topology="async", max_staleness=1)
    rollout = [row["time/rollout_compute"] for row in rows]
    trainer = [role_times_from_metrics(row).trainer_side + row.get("time/dev_eval", 0.0) for row in rows]
    measured = sum(row["time/step"] for row in rows)
    assert gantt.simulate("async", rollout, trainer, 0.0, max_staleness=1).makespan == pytest.approx(measured, rel=0.2)
    assert sum(rollout) + sum(trainer) > 1.2 * measured  # the overlap is real: the roles took longer than the run


# ---- the straggler formula against the sampler -------------------------------------------


@pytest.mark.slow
def test_sampler_time_follows_the_longest_row():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    engine = RolloutEngine(GPTMini(GPTMiniConfig(vocab_size=len(TOKENIZER.itos))), TOKENIZER,
                           SamplingParams(max_new_tokens=100))
    context, N = [[TOKENIZER.bos_id] + TOKENIZER.encode("Q: 1+2+3\n")], 128

    def cpu_seconds(budgets: list[int]) -> tuple[float, list[int]]:  # best of 3, and the lengths drawn then
        best = (math.inf, [])
        for seed in range(3):
            start = time.process_time()
            rows = engine.continue_rows(context * len(budgets), budgets, torch.Generator().manual_seed(seed))
            best = min(best, (time.process_time() - start, [len(r.token_ids) for r in rows]))
        return best

    def lognormal(mean: float, cv: float, seed: int) -> list[int]:
        rng, (mu, sigma) = random.Random(seed), stragglers.lognormal_params(mean, cv)
        return [max(1, min(100, round(rng.lognormvariate(mu, sigma)))) for _ in range(N)]

    prefill, _ = cpu_seconds([1] * N)
    calibration = [cpu_seconds(b) for b in ([100] * N, [15] * N, lognormal(10, 0.5, 1), [100] * 8 + [5] * (N - 8))]
    X = torch.tensor([[max(L), sum(L)] for _, L in calibration], dtype=torch.float64)
    y = torch.tensor([[t - prefill] for t, _ in calibration], dtype=torch.float64)
    a, b = torch.linalg.lstsq(X, y).solution.squeeze(1).tolist()  # seconds per step, per row-token
    measured, lengths = cpu_seconds(lognormal(20, 1.0, 2))
    predicted = prefill + stragglers.decode_seconds(lengths, a, b)
    mean_only = prefill + stragglers.decode_seconds([sum(lengths) / N] * N, a, b)  # as if no row ran long
    assert predicted == pytest.approx(measured, rel=0.35)
    assert abs(predicted - measured) < abs(mean_only - measured)
