"""posttrain/systems: shapes, KV cache and memory, each formula against numbers worked by
hand, published parameter counts, and (parity) the models transformers and peft build."""

import math

import pytest

from posttrain.systems.kv_cache import (kv_bytes_per_sequence, kv_bytes_per_token, kv_cache_bytes, max_cached_tokens,
                                        paged_vs_contiguous, prefix_sharing, sampler_kv_bytes)
from posttrain.systems.memory import (FP32_ADAMW, MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS, activation_bytes,
                                      activation_elements_per_token, lora_parameter_count, lora_training_bytes,
                                      training_state_bytes)
from posttrain.systems.rl_memory import fits, rl_memory
from posttrain.systems.shapes import (PRESETS, ModelShape, load_shape, matmul_parameter_count, parameter_count,
                                      shape_from_config)

# the totals each model's card publishes
PUBLISHED = {"smollm2-135m": 134_515_008, "qwen2.5-0.5b": 494_032_768, "qwen2.5-1.5b": 1_543_714_304,
             "gemma-2b": 2_506_172_416, "llama-2-7b": 6_738_415_616, "mistral-7b": 7_241_732_096,
             "qwen2.5-7b": 7_615_616_512, "llama-3-8b": 8_030_261_248, "qwen2.5-32b": 32_763_876_352,
             "llama-3-70b": 70_553_706_496}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_preset_parameter_counts_are_the_published_ones(name):
    assert parameter_count(PRESETS[name]) == PUBLISHED[name]


def test_attention_kinds():
    assert [PRESETS[n].attention for n in ("llama-2-7b", "llama-3-8b", "gemma-2b")] == ["MHA", "GQA", "MQA"]


def test_gpt_mini_preset_is_its_config_and_counts_its_parameters():
    from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
    from posttrain.models.llama_format import llama_config

    config = GPTMiniConfig(vocab_size=100)
    assert shape_from_config(llama_config(config), "gpt_mini") == PRESETS["gpt_mini"]
    assert parameter_count(PRESETS["gpt_mini"]) == GPTMini(config).num_params() == 829_568


TINY = {  # model_type: a tiny config of each family transformers builds in milliseconds
    "llama": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 50, "max_position_embeddings": 32},
    "qwen2": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 1, "vocab_size": 50, "max_position_embeddings": 32, "tie_word_embeddings": True},
    "gemma": {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 50, "max_position_embeddings": 32},
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_counts_equal_the_model_transformers_builds(model_type):
    transformers = pytest.importorskip("transformers")
    from posttrain.systems.hardware import matmul_params

    config = transformers.AutoConfig.for_model(model_type, **TINY[model_type])
    model = transformers.AutoModelForCausalLM.from_config(config)
    shape = shape_from_config(config.to_dict(), model_type)
    assert parameter_count(shape) == sum(p.numel() for p in model.parameters())
    assert matmul_parameter_count(shape) == matmul_params(model)


def test_shape_from_config_names_what_is_missing_and_reads_gpt2(tmp_path):
    with pytest.raises(ValueError, match="intermediate_size"):
        shape_from_config({**TINY["llama"], "intermediate_size": None})
    with pytest.raises(ValueError, match="num_hidden_layers"):
        shape_from_config({"hidden_size": 8})
    gpt2 = shape_from_config({"n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024})
    # GPT-2 small has 124,439,808; the shape leaves out what no formula here reads: the learned
    # positions (1024 × 768) and the biases other than q/k/v (o, fc, proj and the norms': 12 × 6144 + 768)
    assert parameter_count(gpt2) == 124_439_808 - 1024 * 768 - 12 * (768 + 3072 + 768 + 2 * 768) - 768
    (tmp_path / "config.json").write_text('{"model_type": "llama", ' + str(TINY["llama"])[1:].replace("'", '"'))
    assert load_shape(str(tmp_path)).n_kv_heads == 2
    with pytest.raises(ValueError, match="neither a preset"):
        load_shape("no-such-model")
    with pytest.raises(ValueError, match="multiple of"):
        ModelShape("bad", 1, 8, 3, 2, 4, 8, 10, False, 8)


# ---- KV cache --------------------------------------------------------------------------


def test_kv_bytes_per_token_by_hand():
    assert kv_bytes_per_token(PRESETS["llama-3-8b"], 2) == 2 * 32 * 8 * 128 * 2 == 128 * 1024  # GQA 8 of 32
    assert kv_bytes_per_token(PRESETS["llama-2-7b"], 2) == 512 * 1024  # MHA: 4× Llama-3's
    assert kv_bytes_per_token(PRESETS["gemma-2b"], 2) == 2 * 18 * 256 * 2 == 18_432  # MQA
    assert kv_bytes_per_token(PRESETS["smollm2-135m"], 4) == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_sequence(PRESETS["llama-3-8b"], 4096, 2) == 512 * 2**20
    # make run's sampler: 256 rows × 62 columns of gpt_mini in float32, "a fresh 64 MB a call" (BENCHMARKS.md)
    assert kv_cache_bytes(PRESETS["gpt_mini"], 256, 62, 4) == 256 * 62 * 4096 == 65_011_712
    assert sampler_kv_bytes(PRESETS["gpt_mini"], 32, 8, 14, 48, 4) == 65_011_712
    assert max_cached_tokens(PRESETS["llama-3-8b"], 1 * 2**30, 2) == 8192


def test_paged_against_contiguous_by_hand():
    # lengths 10, 17, 33 (60 tokens), reserved 64 each (192), blocks of 16: 16 + 32 + 48 = 96
    a = paged_vs_contiguous(PRESETS["gpt_mini"], [10, 17, 33], 64, 16, 4)
    assert (a.used_bytes, a.contiguous_bytes, a.paged_bytes) == (60 * 4096, 192 * 4096, 96 * 4096)
    assert a.contiguous_waste == pytest.approx(1 - 60 / 192) and a.paged_waste == pytest.approx(1 - 60 / 96)
    assert paged_vs_contiguous(PRESETS["gpt_mini"], [10, 17, 33], 64, 1, 4).paged_waste == 0  # 1-token blocks
    with pytest.raises(ValueError, match="reservation"):
        paged_vs_contiguous(PRESETS["gpt_mini"], [70], 64, 16, 4)


def test_prefix_sharing_by_hand():
    per_token = kv_bytes_per_token(PRESETS["gpt_mini"], 4)
    one = prefix_sharing(PRESETS["gpt_mini"], 1, 8, 100, 50, 4)  # 8 × 150 = 1200 tokens → 100 + 8 × 50 = 500
    assert (one.separate_bytes, one.shared_bytes) == (1200 * per_token, 500 * per_token)
    assert one.saved_fraction == pytest.approx(1 - 500 / 1200)
    # a 20-token system prompt shared by 2 prompts: 2 × 8 × 170 = 2720 → 20 + 2 × (100 + 400) = 1020
    assert prefix_sharing(PRESETS["gpt_mini"], 2, 8, 100, 50, 4, system_tokens=20).shared_bytes == 1020 * per_token
    # blocks of 16: the prompt's last block holds 100 % 16 = 4 tokens, copied by each sample
    assert prefix_sharing(PRESETS["gpt_mini"], 1, 8, 100, 50, 4, block_tokens=16).shared_bytes == 532 * per_token
    assert prefix_sharing(PRESETS["gpt_mini"], 3, 1, 100, 50, 4).saved_fraction == 0  # K = 1 shares nothing


# ---- training memory -------------------------------------------------------------------


def test_bytes_per_parameter_table():
    assert [p.bytes_per_parameter for p in (FP32_ADAMW, MIXED_ADAMW, MIXED_ADAMW_FP32_GRADS)] == [16, 16, 18]


def test_zero_stages_by_hand():
    totals = [training_state_bytes(1e9, MIXED_ADAMW, stage, 8) for stage in range(4)]
    assert [t.total for t in totals] == [16e9, 2e9 + 2e9 + 1.5e9, 2e9 + 0.25e9 + 1.5e9, 2e9]
    assert training_state_bytes(1e9, MIXED_ADAMW, 3, 1).total == 16e9  # one GPU: nothing to shard over
    with pytest.raises(ValueError, match="stages"):
        training_state_bytes(1e9, MIXED_ADAMW, 4, 8)


def test_lora_counts_by_hand_and_equal_peft():
    # SmolLM2, r = 16: q, o 16·(576+576); k, v 16·(576+192); gate, up, down 16·(576+1536); × 30 layers
    per_layer = 2 * 16 * 1152 + 2 * 16 * 768 + 3 * 16 * 2112
    assert lora_parameter_count(PRESETS["smollm2-135m"], 16) == 30 * per_layer == 4_884_480
    state = lora_training_bytes(134_515_008, 4_884_480, FP32_ADAMW)
    assert state.total == 134_515_008 * 4 + 4_884_480 * 16
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    config = transformers.AutoConfig.for_model("llama", **TINY["llama"])
    model = transformers.AutoModelForCausalLM.from_config(config)
    from posttrain.systems.memory import LORA_TARGETS

    adapted = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=list(LORA_TARGETS)))
    trainable = sum(p.numel() for p in adapted.parameters() if p.requires_grad)
    assert lora_parameter_count(shape_from_config(config.to_dict()), 4) == trainable


def test_activation_count_by_hand():
    # SmolLM2: 4·576 + 3·576 + 2·192 + 4·1536
    assert activation_elements_per_token(PRESETS["smollm2-135m"]) == 10_560
    full = activation_bytes(PRESETS["smollm2-135m"], 2, 100, 4)
    assert full == 200 * 30 * 10_560 * 4
    checkpointed = activation_bytes(PRESETS["smollm2-135m"], 2, 100, 4, checkpointing=True)
    assert checkpointed == 200 * (30 * 576 + 10_560) * 4  # each layer's input, plus one layer recomputed
    assert activation_bytes(PRESETS["smollm2-135m"], 2, 100, 4, attention_matrix=True) == 200 * 30 * (10_560 + 9 * 100) * 4


# ---- the four copies -------------------------------------------------------------------


def test_four_copies_by_algorithm_by_hand():
    grpo = rl_memory("grpo", 1e9, MIXED_ADAMW)  # policy 16 + reference 2 + rollout engine 2
    ppo = rl_memory("ppo", 1e9, MIXED_ADAMW)  # + critic 16 + reward model 2
    dpo = rl_memory("dpo", 1e9, MIXED_ADAMW)  # policy + reference, no engine
    assert [c.role for c in grpo.copies] == ["policy", "reference", "rollout engine"]
    assert [c.role for c in ppo.copies] == ["policy", "reference", "reward model", "critic", "rollout engine"]
    assert (grpo.total_bytes, ppo.total_bytes, dpo.total_bytes) == (20e9, 38e9, 18e9)
    sharded = rl_memory("ppo", 1e9, MIXED_ADAMW, zero_stage=3, gpus=8)  # everything but the engine / 8
    assert sharded.total_bytes == pytest.approx((16 + 2 + 2 + 16) / 8 * 1e9 + 2e9)
    lora = rl_memory("grpo", 1e9, MIXED_ADAMW, lora_state=lora_training_bytes(1e9, 1e7, MIXED_ADAMW))
    assert [c.role for c in lora.copies] == ["policy (LoRA)", "rollout engine"]  # the base is the reference
    assert rl_memory("grpo", 1e9, MIXED_ADAMW, reward_model_parameters=5e8).total_bytes == 21e9
    with pytest.raises(ValueError, match="expected one of"):
        rl_memory("sac", 1e9, MIXED_ADAMW)


def test_fits_keeps_a_margin():
    job = rl_memory("grpo", 1e9, MIXED_ADAMW)  # 20 GB
    assert fits(job, 24e9).fits and not fits(job, 22e9).fits  # 22 × 0.9 = 19.8 < 20
    assert fits(job, 24e9).headroom_bytes == pytest.approx(24e9 * 0.9 - 20e9)
    assert math.isclose(fits(job, 20e9, usable_fraction=1.0).headroom_bytes, 0.0)
