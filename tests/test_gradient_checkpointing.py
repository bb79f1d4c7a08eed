"""model.gradient_checkpointing: the same gradients, fewer tensors kept for backward, and the
setting reaches the policy a run builds or loads."""

import copy

import pytest
import torch

from posttrain.algorithms.preference import make_preference_loss
from posttrain.config import ModelConfig
from posttrain.data.preference_rows import preference_episodes
from posttrain.data.sentiment_pairs import sentiment_pairs
from posttrain.models import load_checkpoint_model, make_policy
from posttrain.models.gpt_mini import GPTMini, GPTMiniConfig
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines import preference_train as train_module
from posttrain.pipelines.preference_train import preference_batch
from posttrain.roles.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def tiny_gpt_mini() -> GPTMini:
    torch.manual_seed(0)
    return GPTMini(GPTMiniConfig(vocab_size=CharTokenizer().vocab_size, dim=32, n_layer=3, n_head=2,
                                 hidden_dim=64, max_seq_len=96))


def dpo_step_gradients(policy: GPTMini, checkpointed: bool) -> torch.Tensor:
    """Every parameter's gradient after one DPO step through the Trainer, flattened."""
    tok = CharTokenizer()
    rows = preference_episodes(sentiment_pairs(4, seed=6), tok)
    train_module.cache_reference_logps(copy.deepcopy(policy).eval(), rows, tok.pad_id)
    model = copy.deepcopy(policy)
    if checkpointed:
        model.gradient_checkpointing_enable()
    Trainer(model, lr=1e-3, total_steps=1, grad_clip=0).update(preference_batch(rows, range(len(rows)), tok.pad_id),
                                                               make_preference_loss("dpo"))
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_one_dpo_step_has_the_same_gradients_with_and_without_checkpointing():
    policy = tiny_gpt_mini()
    plain, checkpointed = dpo_step_gradients(policy, False), dpo_step_gradients(policy, True)
    assert plain.abs().max() > 1e-4  # a real gradient, not two zeros
    torch.testing.assert_close(checkpointed, plain, atol=1e-6, rtol=0)


def saved_for_backward(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """How many tensors the forward pass to logits keeps for backward."""
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(ids).sum()
    return count


def test_checkpointing_keeps_fewer_tensors_and_only_in_a_training_pass():
    model, ids = tiny_gpt_mini().train(), torch.randint(0, 50, (2, 20))  # (B, T)
    plain = saved_for_backward(model, ids)
    model.gradient_checkpointing_enable()
    checkpointed = saved_for_backward(model, ids)
    # each of the 3 blocks keeps its inputs instead of ~20 tensors (norms, projections, attention, SwiGLU)
    assert checkpointed < plain / 2, (checkpointed, plain)
    assert saved_for_backward(model.eval(), ids) == plain  # evaluation mode runs the blocks as before
    with torch.no_grad():
        torch.testing.assert_close(model.train()(ids), model.eval()(ids))  # same logits either way


def test_the_setting_reaches_a_built_and_a_loaded_policy(tmp_path):
    cfg = ModelConfig(dim=32, n_layer=2, n_head=2, hidden_dim=64, gradient_checkpointing=True)
    built, tokenizer = make_policy(cfg)
    assert built.gradient_checkpointing
    built.save_pretrained(tmp_path, tokenizer)
    assert load_checkpoint_model(tmp_path, cfg).gradient_checkpointing
    off = ModelConfig(dim=32, n_layer=2, n_head=2, hidden_dim=64)
    assert not load_checkpoint_model(tmp_path, off).gradient_checkpointing
    assert not make_policy(off)[0].gradient_checkpointing


def test_a_transformers_policy_checkpoints_with_the_same_gradients_and_refuses_a_cache():
    transformers = pytest.importorskip("transformers")
    from posttrain.models.hf import HFPolicy

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    policy, ids = HFPolicy(transformers.LlamaForCausalLM(config)).train(), torch.randint(0, 50, (2, 12))  # (B, T)

    def gradients() -> torch.Tensor:
        policy.zero_grad(set_to_none=True)
        torch.log_softmax(policy(ids), -1)[..., 0].sum().backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])

    plain = gradients()
    policy.gradient_checkpointing_enable()
    assert policy.gradient_checkpointing and policy.hf.is_activation_checkpointing
    torch.testing.assert_close(gradients(), plain, atol=1e-6, rtol=0)
    assert saved_for_backward(policy, ids) < saved_for_backward(policy.eval(), ids) / 2
    with pytest.raises(ValueError, match="rl.update.share_prompt false"):
        policy.train().hidden_states(ids, kv_cache=policy.new_cache(2))


def test_a_transformers_run_with_a_shared_prompt_is_refused_before_it_starts(tmp_path):
    pytest.importorskip("transformers")
    from posttrain.config import ConfigError, TrainConfig
    from posttrain.pipelines.checks import check_config

    tiny_gpt_mini().save_pretrained(tmp_path, CharTokenizer())  # a Llama directory transformers loads
    cfg = TrainConfig()
    cfg.model = ModelConfig(name=str(tmp_path), gradient_checkpointing=True)
    with pytest.raises(ConfigError, match="model.gradient_checkpointing.*rl.update.share_prompt"):
        check_config(cfg)
    cfg.rl.update.share_prompt = False
    check_config(cfg)  # the way out the message names
