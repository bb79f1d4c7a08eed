"""--device and --dtype on a machine with no GPU: how auto resolves, what an absent device
says, that every tensor the roles create follows the policy's device (checked with torch's
default device set to `meta`), and bfloat16 end to end on the CPU.

Why `meta`: a CUDA bug of this kind is a tensor created with no device, which lands on
torch's default device (the CPU) while the policy is on the GPU. Here the policy is on the
CPU, so we make the *default* device one that cannot compute: `torch.set_default_device("meta")`
sends every factory call without a device (torch.zeros, torch.tensor, torch.arange, ...) to
`meta`, and the first operation mixing it with the policy's CPU tensors raises ("Tensor on
device meta is not on the expected device cpu"), as would reading it (`.item()`). A step that
completes with finite numbers therefore created every tensor on the policy's device, or from
a tensor already there. `test_meta_catches_a_tensor_on_the_default_device` shows the check
failing when the rollout takes torch's default device instead of the policy's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from contextlib import contextmanager

import pytest
import torch

from posttrain.algorithms import ALGORITHMS, make_algorithm
from posttrain.config import ConfigError, DistConfig, TrainConfig
from posttrain.envs import make_env
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig, save_checkpoint_model
from posttrain.models import device as devices
from posttrain.models.device import autocast, place, resolve_device
from posttrain.pipelines.build import build_controller
from posttrain.pipelines.checks import check_config, check_placement
from posttrain.roles.engines import RolloutEngine
from posttrain.roles.trainer import Trainer
from posttrain.types import Episode, Example, PolicyOutputs, RolloutBatch

CUDA = torch.cuda.is_available()


def tiny_config(**changes) -> TrainConfig:
    cfg = TrainConfig()
    cfg.model = dataclasses.replace(cfg.model, dim=32, n_layer=2, n_head=2, hidden_dim=64)
    cfg.sft = dataclasses.replace(cfg.sft, num_examples=16, steps=4, batch_size=8, warmup_steps=1)
    sampling = dataclasses.replace(cfg.rl.sampling, max_new_tokens=16)
    cfg.rl = dataclasses.replace(cfg.rl, steps=2, prompts_per_step=2, samples_per_prompt=4, eval_every=2, dev_size=4,
                                 optim=dataclasses.replace(cfg.rl.optim, warmup_steps=1), sampling=sampling)
    cfg.heldout_size, cfg.checkpoint_every, cfg.threads = 8, 2, 1
    return dataclasses.replace(cfg, **changes)


def tiny_policy(seed: int = 0) -> tuple[GPTMini, CharTokenizer]:
    torch.manual_seed(seed)
    tokenizer = CharTokenizer()
    config = GPTMiniConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layer=2, n_head=2, hidden_dim=64, max_seq_len=64)
    return GPTMini(config), tokenizer


@contextmanager
def default_device(device: str):
    before = torch.get_default_device()
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(before)


# ---- resolving and refusing devices ------------------------------------------------------


def test_auto_prefers_cuda_then_mps_then_cpu(monkeypatch):
    for cuda, mps, expected in [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(devices, "mps_available", lambda mps=mps: mps)
        assert resolve_device("auto") == torch.device(expected)
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA device")
def test_an_absent_cuda_device_says_so_and_what_to_pass():
    with pytest.raises(ConfigError) as error:
        check_config(tiny_config(device="cuda"))
    message = str(error.value)
    assert "device='cuda'" in message and "no CUDA device is visible" in message and "--device cpu" in message


@pytest.mark.skipif(CUDA, reason="this machine has a CUDA device")
def test_eval_refuses_an_absent_device_too(tmp_path):
    from posttrain.config.scoring import EvalConfig

    with pytest.raises(ConfigError, match="no CUDA device is visible.*--device cpu"):
        check_config(EvalConfig(checkpoint=str(tmp_path), device="cuda"))
    with pytest.raises(ConfigError, match="dtype='half' is not allowed"):
        check_config(EvalConfig(checkpoint=str(tmp_path), dtype="half"))


def test_an_absent_mps_device_and_unknown_names_are_refused(monkeypatch):
    monkeypatch.setattr(devices, "mps_available", lambda: False)
    with pytest.raises(ConfigError, match="no Apple MPS device.*--device cpu"):
        check_config(tiny_config(device="mps"))
    with pytest.raises(ConfigError, match=r"device='gpu' is not allowed: expected one of \['auto', 'cpu', 'cuda'"):
        check_config(tiny_config(device="gpu"))
    with pytest.raises(ConfigError, match="dtype='float16' is not allowed: expected one of"):
        check_config(tiny_config(dtype="float16"))


def test_ray_workers_and_data_parallel_ranks_refuse_what_they_cannot_follow(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"dist.workers=2 is not allowed: expected 0 with device='cuda'.*--workers 0"):
        check_placement("cuda", "float32", DistConfig(workers=2, topology="sync"))
    with pytest.raises(ConfigError, match=r"dist.trainer_ranks=2 .*dtype='bfloat16'"):
        check_placement("cpu", "bfloat16", DistConfig(trainer_ranks=2))
    check_placement("cpu", "float32", DistConfig(workers=2, topology="sync", trainer_ranks=2))  # today's CPU runs


# ---- every tensor on the policy's device -----------------------------------------------


def controller_for(tmp_path, algo: str):
    """A tiny controller (rollout, reference, trainer, critic for ppo, implicit PRM for prime) around a CPU gpt_mini."""
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, algo=algo)
    policy, tokenizer = tiny_policy()
    save_checkpoint_model(policy, tokenizer, tmp_path / "start")
    controller = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, tmp_path / "start")
    # an untrained policy never scores, and all-zero rewards give no gradient: reward odd lengths instead
    controller.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    return controller, policy


@pytest.mark.parametrize("algo", ["grpo", "ppo", "prime"])  # prime: its implicit PRM steps too
def test_a_whole_rl_step_creates_no_tensor_on_the_default_device(tmp_path, algo):
    controller, policy = controller_for(tmp_path, algo)  # built with the CPU default: weights are real
    before = [p.detach().clone() for p in policy.parameters()]
    with default_device("meta"):
        metrics, episodes = controller.step(0)  # sample, score, reference, advantages, update, sync
    assert len(episodes) == 8
    assert 0 < metrics["reward_mean"] < 1  # mixed rewards: a real policy gradient
    for key in ("pg_loss", "grad_norm", "kl_ref", "entropy", "ratio_mean"):
        assert math.isfinite(metrics[key]), (key, metrics[key])
    assert metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters())), "the update moved no weight"
    assert all(p.device.type == "cpu" for p in policy.parameters())


def test_a_transformers_lora_step_creates_no_tensor_on_the_default_device(tmp_path):
    """The same for a transformers model with LoRA adapters (reference = adapters off)."""
    from posttrain.models.hf import HFPolicy

    gpt, tokenizer = tiny_policy()
    gpt.save_pretrained(tmp_path / "tiny", tokenizer)
    policy, hf_tokenizer = HFPolicy.load(tmp_path / "tiny")
    policy.add_lora(4)
    cfg = tiny_config()
    cfg.model = dataclasses.replace(cfg.model, name=str(tmp_path / "tiny"), lora_r=4)
    cfg.rl = dataclasses.replace(cfg.rl, update=dataclasses.replace(cfg.rl.update, micro_batch_size=4))
    controller = build_controller(cfg, make_env("arithmetic"), hf_tokenizer, policy, tmp_path / "tiny")
    controller.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    with default_device("meta"):
        metrics, _ = controller.step(0)
    assert 0 < metrics["reward_mean"] < 1 and metrics["grad_norm"] > 0 and math.isfinite(metrics["kl_ref"])


@pytest.mark.parametrize("pooling", ["last", "mean", "loglik"])
def test_a_reward_model_trains_and_scores_on_its_own_device(pooling):
    from posttrain.rewards.reward_model import RewardModel, reward_of
    from posttrain.rewards.reward_model_training import train_reward_model
    from posttrain.types import PreferencePair

    body, tokenizer = tiny_policy()
    model = RewardModel(body, pooling)
    pairs = [PreferencePair(prompt=f"{i}+1=", chosen=f"{i + 1}", rejected=f"{i + 2}", meta={"gap": 1.0})
             for i in range(4)]
    with default_device("meta"):
        model, history = train_reward_model(pairs, model, tokenizer, steps=2, batch_size=4, margin_key="gap")
        rewards = reward_of(model, tokenizer, ["1+1="], ["2"])
    assert math.isfinite(history[-1]["loss"]) and rewards.shape == (1,) and math.isfinite(rewards.item())


def test_meta_catches_a_tensor_on_the_default_device(tmp_path, monkeypatch):
    """The check above can fail: a rollout that places its inputs on torch's default device
    instead of the policy's (the CUDA bug) breaks the step."""
    controller, _ = controller_for(tmp_path, "grpo")
    monkeypatch.setattr("posttrain.roles.engines.torch_engine.model_device", lambda model: torch.get_default_device())
    with default_device("meta"), pytest.raises((RuntimeError, NotImplementedError)):
        controller.step(0)


def synthetic_batch() -> RolloutBatch:
    """Two groups of two rows, mixed rewards, values for a critic: every algorithm's input."""
    example = Example(id="x", prompt="1+1", expected_answer="2")
    episodes = [Episode(example=example, group_id=i // 2, prompt_ids=[1, 5, 6], response_ids=[7, 8, 2][: 2 + i % 2],
                        response_logp=[-1.0, -0.5, -0.2][: 2 + i % 2], reward=float(i % 2)) for i in range(4)]
    batch = RolloutBatch.collate(episodes, pad_id=0)
    batch.ref_logp = batch.old_logp - 0.1 * batch.response_mask
    batch.values = 0.3 * batch.response_mask
    batch.process_rewards = 0.01 * batch.response_mask
    batch.teacher_logp = batch.old_logp - 0.2 * batch.response_mask  # a teacher's (OPD)
    return batch


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_computes_on_its_inputs_device(name):
    batch = synthetic_batch()
    outputs = PolicyOutputs(logp=batch.old_logp + 0.05 * batch.response_mask, entropy=batch.response_mask.clone(),
                            values=0.2 * batch.response_mask)
    algorithm = make_algorithm(name, budget=16)
    with default_device("meta"):
        batch = dataclasses.replace(batch, **algorithm.compute_advantages(batch))
        loss, metrics = algorithm.compute_loss(outputs, batch)
        assert loss.device.type == "cpu" and math.isfinite(loss.item())


# ---- bfloat16 --------------------------------------------------------------------------


def test_bf16_runs_the_forward_in_bf16_and_hands_back_float32_log_probs():
    policy, tokenizer = tiny_policy()
    engine = RolloutEngine(policy, tokenizer, TrainConfig().rl.sampling, shares_weights=True)
    example = Example(id="a", prompt="3+4=", expected_answer="7")
    episodes = engine.generate([example], 4, torch.Generator().manual_seed(0))
    batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
    fp32 = Trainer(policy, lr=1e-3, total_steps=1).forward(batch)
    place(policy, "cpu", "bfloat16")
    assert policy.new_cache(2, 8).keys[0].dtype == torch.bfloat16  # the cache holds what the forward writes
    assert all(p.dtype == torch.float32 for p in policy.parameters())  # master weights stay float32
    with autocast(policy):  # the matmuls run in bf16 (the residual stream itself stays float32)
        assert policy(batch.tokens[:, :4]).dtype == torch.bfloat16
    bf16 = Trainer(policy, lr=1e-3, total_steps=1).forward(batch)
    assert bf16.logp.dtype == torch.float32 and bf16.entropy.dtype == torch.float32
    gap = (bf16.logp - fp32.logp).abs().max().item()
    assert 0 < gap < 0.1, gap  # bf16 matmuls really ran (not a no-op), and stayed close to float32
    assert torch.equal(bf16.logp == 0, batch.response_mask == 0)  # still exactly 0 off the response


def test_bf16_sampling_draws_the_same_uniforms_and_float32_old_logp():
    """The sampler's u comes from the seeded CPU generator whatever the precision: with a
    tiny model whose bf16 logits rarely change the argmax of the CDF, most tokens agree."""
    policy, tokenizer = tiny_policy()
    examples = [Example(id=str(i), prompt=f"{i}+1=", expected_answer=str(i + 1)) for i in range(4)]
    params = TrainConfig().rl.sampling
    engine = RolloutEngine(policy, tokenizer, params, shares_weights=True)
    fp32 = engine.generate(examples, 2, torch.Generator().manual_seed(1))
    place(policy, "cpu", "bfloat16")
    bf16 = engine.generate(examples, 2, torch.Generator().manual_seed(1))
    first = [(a.response_ids[0], b.response_ids[0]) for a, b in zip(fp32, bf16)]
    assert sum(x == y for x, y in first) >= 6, first
    assert all(isinstance(v, float) for e in bf16 for v in e.response_logp)


def test_bf16_on_the_cpu_end_to_end(tmp_path):
    """SFT → eval → GRPO → eval with --dtype bfloat16: it finishes, with finite numbers, and
    config.json and meta.json say where and how it ran."""
    from posttrain.pipelines.run import run_pipeline, start_run

    cfg = tiny_config(out_dir=str(tmp_path), dtype="bfloat16", name="bf16")
    check_config(cfg)
    run = start_run(cfg, "test")
    summary = run_pipeline(cfg, run)
    assert summary["final_stage"] == "rl" and 0 <= summary["rl"]["mean"] <= 1
    rows = [json.loads(line) for line in (run.path / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert len(rl) == 2 and all(math.isfinite(r["entropy"]) and math.isfinite(r["kl_ref"]) for r in rl)
    sft = [r for r in rows if r["stage"] == "sft"]
    assert len(sft) == 4 and sft[-1]["loss"] < sft[0]["loss"]  # bf16 SFT still learns
    assert json.loads((run.path / "config.json").read_text())["dtype"] == "bfloat16"
    meta = json.loads((run.path / "meta.json").read_text())
    assert meta["device"] == {"requested": "cpu", "resolved": "cpu", "name": "", "dtype": "bfloat16"}

    from posttrain.eval.loop_a import evaluate_checkpoint
    from posttrain.config.scoring import EvalConfig

    checkpoint = sorted((run.path / "checkpoints" / "rl").glob("step_*"))[-1]
    eval_cfg = EvalConfig(checkpoint=str(checkpoint), size=8, out_dir=str(tmp_path / "eval"), dtype="bfloat16")
    check_config(eval_cfg)
    assert evaluate_checkpoint(eval_cfg)["n"] == 8
    eval_meta = json.loads(next((tmp_path / "eval").glob("*/meta.json")).read_text())
    assert eval_meta["device"]["dtype"] == "bfloat16" and eval_meta["device"]["resolved"] == "cpu"
