"""The rollout seam: a new engine is one class and one registry entry, and a GRPO step runs
through it; the controller takes its roles and hooks, never more than eight parameters; a step
passes through the files ARCHITECTURE.md maps, and no other."""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import posttrain
from posttrain.config import ConfigError
from posttrain.envs import make_env
from posttrain.models import save_checkpoint_model
from posttrain.pipelines.build import build_controller
from posttrain.pipelines.checks import check_config
from posttrain.roles.controller import Controller
from posttrain.roles.engines import ENGINES, make_engine
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.types import Episode
from tests.test_devices import tiny_config, tiny_policy

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class NaiveEngine:
    """A whole engine in one class: no KV cache, the full context through the model for every
    token, the draw by torch.multinomial. It owns nothing but what the Engine protocol asks."""

    max_rows = 64

    def __init__(self, model, tokenizer, params, shares_weights: bool = False):
        self.model, self.tokenizer, self.params, self.shares_weights = model, tokenizer, params, shares_weights
        self.weight_version = 0
        self.calls = 0

    @property
    def max_seq_len(self) -> int:
        return self.model.config.max_seq_len

    @torch.no_grad()
    def generate(self, examples, samples_per_prompt=1, generator=None, params=None):
        params, self.calls = params or self.params, self.calls + 1
        episodes = []
        for group, example in enumerate(examples):
            prompt = example_prompt_ids(self.tokenizer, example)
            for _ in range(samples_per_prompt):
                tokens, logps = [], []
                while len(tokens) < params.max_new_tokens:
                    logits = self.model(torch.tensor([prompt + tokens]))[0, -1]  # (V,)
                    logp = F.log_softmax(logits.float() / params.temperature, dim=-1)
                    token = int(torch.multinomial(logp.exp(), 1, generator=generator))
                    tokens.append(token)
                    logps.append(logp[token].item())
                    if token == self.tokenizer.eos_id:
                        break
                finished = tokens[-1] == self.tokenizer.eos_id
                text = self.tokenizer.decode(tokens[:-1] if finished else tokens)
                episodes.append(Episode(example=example, group_id=group, prompt_ids=prompt, response_ids=tokens,
                                        response_logp=logps, completion=text, weight_version=self.weight_version,
                                        finished=finished))
        return episodes

    def continue_rows(self, contexts, budgets, generator=None, params=None, stop_strings=()):
        raise NotImplementedError("the naive engine samples single-turn tasks only")

    def load_weights(self, state):
        self.model.load_state_dict(state)

    def metrics(self):
        return {}


def test_a_new_engine_is_one_class_and_one_registry_entry_and_a_grpo_step_runs_through_it(tmp_path, monkeypatch):
    monkeypatch.setitem(ENGINES, "naive", NaiveEngine)  # the one registry entry
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, sampling=dataclasses.replace(cfg.rl.sampling, engine="naive"))
    check_config(cfg)  # a registered engine is a valid setting
    policy, tokenizer = tiny_policy()
    save_checkpoint_model(policy, tokenizer, tmp_path / "start")
    controller = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, tmp_path / "start")
    # an untrained policy never scores: reward odd lengths, so the update moves the weights
    controller.reward = lambda example, completion: {"reward": float(len(completion) % 2), "details": {}}
    engine = controller.rollout.engine
    assert isinstance(engine, NaiveEngine) and engine.model is policy  # colocated: it samples the trainer's module
    before = [p.detach().clone() for p in policy.parameters()]
    metrics, episodes = controller.step(0)
    assert engine.calls == 1 and len(episodes) == cfg.rl.prompts_per_step * cfg.rl.samples_per_prompt
    # the engine's log-probs are the trainer's own: the first update starts at ratio 1 exactly
    assert metrics["clipfrac"] == 0.0 and abs(metrics["approx_kl"]) < 1e-6
    assert math.isfinite(metrics["pg_loss"]) and metrics["grad_norm"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    assert metrics["weight_version"] == 1 and engine.weight_version == 1  # the sync reached it


def test_an_unknown_engine_is_refused_before_anything_starts_with_the_engines_listed():
    cfg = tiny_config()
    cfg.rl = dataclasses.replace(cfg.rl, sampling=dataclasses.replace(cfg.rl.sampling, engine="vllm-typo"))
    with pytest.raises(ConfigError, match=r"rl\.sampling\.engine.*'vllm-typo'.*torch"):
        check_config(cfg)
    policy, tokenizer = tiny_policy()
    with pytest.raises(ValueError, match="not an engine; the engines are: torch"):
        make_engine(policy, tokenizer, cfg.rl.sampling)


def test_an_engine_with_its_own_copy_is_frozen_and_synced_by_load_weights():
    policy, tokenizer = tiny_policy()
    copy = tiny_policy(seed=1)[0]
    engine = make_engine(copy, tokenizer, tiny_config().rl.sampling)
    assert not engine.shares_weights and not any(p.requires_grad for p in copy.parameters())
    engine.load_weights(policy.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(copy.state_dict().values(), policy.state_dict().values()))


def test_the_controller_takes_its_roles_and_at_most_eight_parameters():
    parameters = [p for p in inspect.signature(Controller.__init__).parameters if p != "self"]
    assert len(parameters) <= 8, parameters
    assert parameters[:4] == ["rollout", "reward", "algorithm", "trainer"]


def step_map_in_architecture() -> list[str]:
    """The files of ARCHITECTURE.md's "One GRPO step, file by file" table, in its order."""
    text = (Path(__file__).parents[1] / "ARCHITECTURE.md").read_text()
    section = text.split("### One GRPO step, file by file", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([\w/]+\.py)` \|", section, flags=re.M)


def test_a_grpo_step_passes_through_the_files_architecture_md_lists_and_no_other(tmp_path):
    cfg = tiny_config()
    policy, tokenizer = tiny_policy()
    save_checkpoint_model(policy, tokenizer, tmp_path / "start")
    controller = build_controller(cfg, make_env("arithmetic"), tokenizer, policy, tmp_path / "start")
    controller.step(0)  # the second step is the steady state: nothing built lazily on the first
    package = str(Path(posttrain.__file__).parent) + "/"
    seen: set[str] = set()

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            seen.add(frame.f_code.co_filename.removeprefix(package))

    sys.setprofile(record)
    try:
        controller.step(1)
    finally:
        sys.setprofile(None)
    listed = step_map_in_architecture()
    assert len(listed) == len(set(listed)) == 25
    assert seen == set(listed), (f"in the step, not in ARCHITECTURE.md: {sorted(seen - set(listed))}; "
                                 f"listed, not in the step: {sorted(set(listed) - seen)}")
    # the step's own machinery first: the roles and the algorithm, thirteen files
    machinery = [f for f in listed if f.startswith(("roles/", "algorithms/"))]
    assert listed[:13] == machinery
