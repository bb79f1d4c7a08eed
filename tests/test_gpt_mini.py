"""GPTMini against an independent implementation (transformers' Llama) and against itself
under the invariances the sampler and trainer rely on (KV cache, left padding, masks)."""

import json

import pytest
import torch

from posttrain.models.gpt_mini import GPTMini, attention_allowed, default_position_ids, load_state_dict_checked
from posttrain.models.gpt_mini_config import CheckpointMismatchError, GPTMiniConfig
from posttrain.models.kv_cache import KVCache
from posttrain.models.tokenizer import CharTokenizer

transformers = pytest.importorskip("transformers")

# Tiny but not degenerate: 2 layers, 2 heads of 16 channels. rope_theta and norm_eps are
# off their defaults, so a config field that transformers silently ignored (e.g. writing
# `rope_theta` where 5.x expects `rope_parameters`) would break the parity tests.
TINY = GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=2, hidden_dim=64,
                     max_seq_len=48, rope_theta=500.0, norm_eps=1e-6)
ATOL = 1e-5


def make_model(config: GPTMiniConfig = TINY, seed: int = 0) -> GPTMini:
    torch.manual_seed(seed)
    model = GPTMini(config).eval()
    # Default init keeps every weight near 0.02; random norm gains make the test stricter
    # (a norm applied in the wrong place, or not at all, then changes the logits).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model


def left_pad(prompts: list[list[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, T - len(p):] = torch.tensor(p)
        mask[b, T - len(p):] = 1
    return ids, mask


def hf_from(model: GPTMini, tmp_path, tokenizer=None):
    model.save_pretrained(tmp_path, tokenizer=tokenizer)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    return hf


# ---- parity with transformers' Llama ---------------------------------------------------


@pytest.mark.parametrize("tie", [False, True])
def test_logits_match_transformers_llama(tmp_path, tie):
    config = GPTMiniConfig(**{**TINY.__dict__, "tie_embeddings": tie})
    model = make_model(config)
    hf = hf_from(model, tmp_path)
    rope = getattr(hf.config, "rope_parameters", None) or {"rope_theta": hf.config.rope_theta}
    assert rope["rope_theta"] == 500.0  # 5.x keeps it in rope_parameters, 4.x top-level
    ids = torch.randint(4, 100, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits  # (B, T, V)
    assert ours.abs().max() > 0.1  # not a trivially all-zero comparison
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=0)


def test_left_padded_logits_match_transformers_llama(tmp_path):
    model = make_model()
    hf = hf_from(model, tmp_path)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, 100, (n,), generator=g).tolist() for n in (12, 7, 3)]
    ids, mask = left_pad(prompts)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, T)
    with torch.no_grad():
        ours = model(ids, attention_mask=mask)  # derives the same position_ids itself
        theirs = hf(ids, attention_mask=mask, position_ids=position_ids).logits
    real = mask.bool()
    torch.testing.assert_close(ours[real], theirs[real], atol=ATOL, rtol=0)


def greedy_with_cache(model: GPTMini, ids, mask, max_new_tokens: int, eos_id: int, pad_id: int):
    """The sampler's decode loop at temperature 0: prefill once, then one token per step."""
    B, T = ids.shape
    cache = KVCache.empty(model.config, B, T + max_new_tokens)
    done = torch.zeros(B, dtype=torch.bool)
    out, step_ids = [], ids
    for _ in range(max_new_tokens):
        logits = model(step_ids, attention_mask=mask, kv_cache=cache)[:, -1]  # (B, V)
        nxt = torch.where(done, pad_id, logits.argmax(-1))  # (B,)
        out.append(nxt)
        done |= nxt == eos_id
        step_ids = nxt[:, None]  # (B, 1)
        mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], dim=1)
    return torch.stack(out, dim=1)  # (B, max_new_tokens)


def test_greedy_generation_matches_transformers_generate(tmp_path):
    tok = CharTokenizer()
    model = make_model(seed=3)
    hf = hf_from(model, tmp_path, tokenizer=tok)
    prompts = [tok.encode(s) for s in ["3+4+1=", "12+9=21,", "Final:"]]
    ids, mask = left_pad(prompts, tok.pad_id)
    n_new = 16
    with torch.no_grad():
        free = greedy_with_cache(model, ids, mask, n_new, eos_id=-1, pad_id=tok.pad_id)
        # A random model never emits <eos>; call a token the last row emits mid-way the
        # stop token, so both loops must also agree on when a row stops and how it is padded.
        stop = int(free[-1, n_new // 2])
        ours = greedy_with_cache(model, ids, mask, n_new, eos_id=stop, pad_id=tok.pad_id)
        theirs = hf.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n_new,
                             pad_token_id=tok.pad_id, eos_token_id=stop)
    theirs = theirs[:, ids.shape[1]:]
    # generate returns early once every row has stopped; pad to our fixed length.
    theirs = torch.nn.functional.pad(theirs, (0, n_new - theirs.shape[1]), value=tok.pad_id)
    assert ours.tolist() == theirs.tolist()
    assert (ours[-1, -1] == tok.pad_id) and len(set(ours[:, 0].tolist())) > 1  # not trivial


def test_from_pretrained_reads_a_checkpoint_written_by_transformers(tmp_path):
    hf_config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, max_position_embeddings=48, rms_norm_eps=1e-6,
        rope_theta=500.0)  # 5.x moves this into config.rope_parameters
    torch.manual_seed(4)
    hf = transformers.LlamaForCausalLM(hf_config).eval()
    hf.save_pretrained(tmp_path)
    model = GPTMini.from_pretrained(tmp_path, expected_config=TINY).eval()
    ids = torch.randint(4, 100, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, atol=ATOL, rtol=0)


# ---- invariances of our own implementation ---------------------------------------------


def test_kv_cache_decoding_matches_full_forward():
    model = make_model()
    ids = torch.randint(4, 100, (2, 14))
    with torch.no_grad():
        full = model(ids)  # (B, T, V), fast is_causal path
        cache = KVCache.empty(TINY, batch_size=2, max_len=14)
        chunks = [model(ids[:, :5], kv_cache=cache)]  # prefill several tokens at once
        for t in range(5, 14):
            chunks.append(model(ids[:, t:t + 1], kv_cache=cache))
    assert cache.length == 14
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, atol=ATOL, rtol=0)


def test_kv_cache_with_left_padding_matches_full_masked_forward():
    model = make_model()
    ids, mask = left_pad([torch.randint(4, 100, (n,)).tolist() for n in (9, 4)])
    with torch.no_grad():
        full = model(ids, attention_mask=mask)
        cache = KVCache.empty(TINY, batch_size=2, max_len=9)
        chunks = [model(ids[:, :6], attention_mask=mask[:, :6], kv_cache=cache)]
        for t in range(6, 9):
            chunks.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], kv_cache=cache))
    real = mask.bool()
    torch.testing.assert_close(torch.cat(chunks, dim=1)[real], full[real], atol=ATOL, rtol=0)


@pytest.mark.parametrize("mask_dtype", [torch.long, torch.float32, torch.bool])
def test_left_padding_does_not_change_a_prompts_logits(mask_dtype):
    model = make_model()
    prompt = torch.randint(4, 100, (1, 8))
    padded = torch.cat([torch.full((1, 3), 0), prompt], dim=1)  # 3 pad tokens on the left
    mask = torch.tensor([[0, 0, 0] + [1] * 8]).to(mask_dtype)
    with torch.no_grad():
        alone = model(prompt)  # (1, 8, V)
        with_pad = model(padded, attention_mask=mask)[:, 3:]  # (1, 8, V)
        # Changing what sits under the mask must not matter either.
        other_pad = model(padded.index_fill(1, torch.tensor([0, 1, 2]), 77), attention_mask=mask)[:, 3:]
    torch.testing.assert_close(with_pad, alone, atol=ATOL, rtol=0)
    torch.testing.assert_close(other_pad, alone, atol=ATOL, rtol=0)


def test_default_position_ids_count_real_tokens_by_hand():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])
    assert default_position_ids(mask, T_past=0).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 0, 0, 0, 0]]
    # One decode step after 4 cached positions: only the new column is returned.
    assert default_position_ids(mask, T_past=4).tolist() == [[2], [4], [0]]


def test_attention_allowed_by_hand_and_never_an_empty_row():
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 0, 0]])
    allowed = attention_allowed(mask, T=4, T_past=0)[:, 0].int()  # (B, T, S)
    assert allowed[0].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert allowed[1].tolist() == torch.eye(4, dtype=torch.int).tolist()  # only itself
    # Decoding 1 token after 3 cached ones: the query is key 3; pad key 0 stays hidden.
    step = attention_allowed(torch.tensor([[0, 1, 1, 1]]), T=1, T_past=3)[0, 0].int()
    assert step.tolist() == [[0, 1, 1, 1]]


def test_fully_padded_query_rows_are_finite_and_do_not_leak():
    model = make_model()
    ids = torch.randint(4, 100, (2, 6))
    mask = torch.tensor([[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1]])  # row 0 is all padding
    with torch.no_grad():
        logits = model(ids, attention_mask=mask)
        alone = model(ids[1:, 2:])
    assert torch.isfinite(logits).all()
    torch.testing.assert_close(logits[1, 2:], alone[0], atol=ATOL, rtol=0)


def test_rope_depends_on_relative_positions_only():
    model = make_model()
    ids = torch.randint(4, 100, (1, 5))
    with torch.no_grad():
        default = model(ids)
        counted = model(ids, position_ids=torch.arange(5)[None])
        shifted = model(ids, position_ids=torch.arange(5)[None] + 7)
        gapped = model(ids, position_ids=torch.tensor([[0, 1, 2, 3, 20]]))
    torch.testing.assert_close(default, counted, atol=0, rtol=0)
    # Rotating every query and key by the same extra angle leaves q.k unchanged
    # (RoFormer eq. 16), so a uniform shift changes only the rounding (~1e-8) ...
    rounding = (shifted - default).abs().max()
    assert rounding < 1e-6
    # ... while a change in relative distance changes the last token's logits (~1e-3 at
    # this init scale, where attention is still nearly uniform).
    assert (gapped[0, -1] - default[0, -1]).abs().max() > max(100 * rounding, 1e-5)
    torch.testing.assert_close(gapped[0, :4], default[0, :4], atol=ATOL, rtol=0)


def test_too_long_sequence_is_a_clear_error():
    model = make_model()
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, TINY.max_seq_len + 1, dtype=torch.long))
    cache = KVCache.empty(TINY, 1, max_len=4)
    with pytest.raises(ValueError, match="T_past=0 \\+ T=5"):
        model(torch.zeros(1, 5, dtype=torch.long), kv_cache=cache)


# ---- checkpoints -----------------------------------------------------------------------


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    model = make_model(seed=5)
    tok = CharTokenizer()
    model.save_pretrained(tmp_path, tokenizer=tok)
    loaded = GPTMini.from_pretrained(tmp_path, expected_config=TINY).eval()
    assert loaded.config == TINY
    assert CharTokenizer.load(tmp_path).vocab_size == tok.vocab_size
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["bos_token_id"], saved["eos_token_id"], saved["pad_token_id"]) == (1, 2, 0)
    ids = torch.randint(4, 100, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporary files


def test_mismatched_expected_config_names_each_field(tmp_path):
    make_model().save_pretrained(tmp_path)
    expected = GPTMiniConfig(**{**TINY.__dict__, "dim": 64, "n_layer": 3})
    with pytest.raises(CheckpointMismatchError) as err:
        GPTMini.from_pretrained(tmp_path, expected_config=expected)
    msg = str(err.value)
    assert "dim: checkpoint=32, expected=64" in msg
    assert "n_layer: checkpoint=2, expected=3" in msg
    assert "hidden_dim" not in msg  # only the fields that differ


def test_missing_or_corrupt_checkpoint_names_the_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(FileNotFoundError, match="nope.*does not exist"):
        GPTMini.from_pretrained(missing)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json"):
        GPTMini.from_pretrained(tmp_path)
    make_model().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(ValueError, match="model.safetensors"):
        GPTMini.from_pretrained(tmp_path)


def test_state_dict_size_mismatch_is_readable():
    small = make_model()
    big = GPTMini(GPTMiniConfig(**{**TINY.__dict__, "hidden_dim": 96}))
    with pytest.raises(CheckpointMismatchError, match=r"mlp.up_proj.weight: checkpoint=\(96, 32\), expected=\(64, 32\)"):
        load_state_dict_checked(small, big.state_dict(), source="big")


def test_config_validation_names_field_and_value():
    with pytest.raises(ValueError, match="dim=30 is not divisible by n_head=4"):
        GPTMiniConfig(vocab_size=10, dim=30, n_head=4)
    with pytest.raises(ValueError, match="head_dim = dim / n_head = 3 is odd"):
        GPTMiniConfig(vocab_size=10, dim=12, n_head=4)
    with pytest.raises(ValueError, match="vocab_size=0"):
        GPTMiniConfig(vocab_size=0)


def test_default_config_size_matches_the_design_note():
    # ARCHITECTURE.md's prototype: a ~0.8M-parameter character-level decoder.
    n = GPTMini(GPTMiniConfig(vocab_size=CharTokenizer().vocab_size)).num_params()
    assert 0.75e6 < n < 0.9e6
