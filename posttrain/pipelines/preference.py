"""Stage 2 (alternative): preference optimisation (DPO and its family), offline on a pairs
file or on pairs built from the starting policy's samples, or online in rounds of fresh
pairs from the current policy.

    preference_stage        the stage: one preference step at a time, through the step loop,
                            checkpoints and alerts the RL stage uses (pipelines/rl.py)
    PreferenceEvaluation    what it measures every rl.eval_every steps: dev pass@1, the
                            policy's own samples (KL to π_ref, length, reward, entropy, the
                            share opening alike), and the loss on held-out pairs

The rounds — which pairs a step trains on, and against which reference — are
pipelines/preference_rounds.py; one step's batch and update are pipelines/preference_train.py.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from posttrain.algorithms.core import masked_mean
from posttrain.algorithms.preference import make_preference_loss
from posttrain.config import TrainConfig
from posttrain.models.hf import lora_policy
from posttrain.models.policy import SavablePolicy
from posttrain.data.preference import load_preference_jsonl, save_preference_jsonl
from posttrain.eval.evaluate import evaluate_pass_at_1
from posttrain.pipelines.alerts import AlertPolicy
from posttrain.pipelines.build import pair_ranker, sampling_params, trainer_settings
from posttrain.pipelines.preference_diagnostics import PreferenceDiagnostics
from posttrain.pipelines.preference_rounds import PreferenceRounds, stage_file, verifier_pairs
from posttrain.pipelines.preference_train import evaluate_preference, preference_batch
from posttrain.roles.controller import rollout_metrics
from posttrain.roles.environment import score_episodes
from posttrain.roles.reference import Reference, make_reference
from posttrain.roles.engines import make_engine
from posttrain.roles.trainer import Trainer
from posttrain.runs.preference_monitors import template_share
from posttrain.runs.rundir import RunDir
from posttrain.runs.stage import run_stage
from posttrain.seeds import generator_for
from posttrain.types import Environment, RolloutBatch, Tokenizer


def preference_stage(cfg: TrainConfig, run: RunDir, env: Environment, tokenizer: Tokenizer, policy: SavablePolicy,
                     reference_weights: Path, stage: str = "pref") -> None:
    """Train on preference pairs with one loss of the DPO family, through the same Trainer,
    step loop and checkpoints as the RL stage.

    Offline (rl.preference.online_rounds = 1): one set of pairs, from the file rl.preference.pairs or built by the
    verifier from the starting policy's samples, and rl.steps steps on it.
    Online / iterative (rl.preference.online_rounds = N > 1): the same budget — rl.preference.pair_prompts sampled
    prompts and rl.steps gradient steps in all — split into N rounds; each round samples
    the *current* policy, lets the verifier (or, with rl.rm.path, a reward model) build
    pairs, and trains on those. Pairs then come from the distribution being trained
    (on-policy) instead of only the start's. The reference stays the starting policy, and
    one trainer (optimizer and learning-rate schedule) runs through all rounds, so the only
    difference from offline is where the data comes from; with rl.preference.refresh_reference, each
    round's reference is instead the policy as that round starts (iterative DPO).

    With model.lora_r > 0 only LoRA adapters train, and the reference is the policy with
    its adapters off (no second copy of the weights), as in the RL stage.

    Dev-set measurements every rl.eval_every steps (PreferenceEvaluation), the monitors
    watching (and acting, per rl.alerts.action: pipelines/alerts.py), as in the RL stage. The
    stage checkpoints every checkpoint_every steps and at the end of every round, and saves
    every round's pairs before training on them, so a run killed anywhere in the stage
    resumes where it stopped and logs what an uninterrupted run logs.

    `stage` names its checkpoints and metrics rows; a stage of a --stages run, named after
    its loss ("dpo"), also prefixes its pair files ("dpo_pairs.jsonl", "dpo_rounds.json")."""
    if cfg.model.lora_r and not getattr(policy.config, "lora_r", 0):
        # train adapters only
        lora_policy(policy, cfg.model.lora_r).add_lora(cfg.model.lora_r, cfg.model.lora_alpha, base=reference_weights)
    # what ranks the training pairs: the verifier, a reward model (rl.rm.path), or the policy
    # judging its own samples (rl.preference.self_reward); the held-out pairs stay the verifier's, so their
    # accuracy is measured against the truth
    rank_by = pair_ranker(cfg.rl, env.score, policy, tokenizer)
    # π_ref: the starting policy (LoRA: the policy with its adapters off)
    reference = make_reference(policy, reference_weights, cfg.rl.update.share_prompt)
    loss = make_preference_loss(cfg.rl.algo, **cfg.rl.algo_params)
    trainer = Trainer(policy, **trainer_settings(cfg.rl))
    rounds = PreferenceRounds(cfg, run, stage, env, tokenizer, policy, reference, loss, rank_by)
    evaluation = PreferenceEvaluation(cfg, run, stage, env, tokenizer, policy, reference)
    # temperature sensitivity and out of distribution, when asked: the start's now, before any step
    diagnostics = PreferenceDiagnostics(cfg, run, stage, env, tokenizer, policy)
    alerts = AlertPolicy(cfg.rl, run, stage, policy, tokenizer)

    def pref_step(step: int) -> dict[str, float]:
        started = time.perf_counter()
        this_round = rounds.at(step)  # a round's first step (or a resumed run's) builds its pairs
        indices = this_round.batch_indices(step, cfg.rl.prompts_per_step)
        metrics = trainer.update(preference_batch(this_round.rows, indices, tokenizer.pad_id, loss.gap_weighting), loss)
        metrics["time/train"] = time.perf_counter() - started
        if step == this_round.start:
            metrics.update(this_round.record())
        if (step + 1) % cfg.rl.eval_every == 0 or step == cfg.rl.steps - 1:
            eval_start = time.perf_counter()
            metrics.update(evaluation.measure(step), **{"time/eval": time.perf_counter() - eval_start})
        alerts.after_step(step, metrics)  # the monitors (chosen likelihood collapsing, ...), and rl.alerts.action
        return metrics

    run_stage(run, stage, alerts.last_step(cfg.rl.steps), pref_step, policy, tokenizer, trainer,
              cfg.checkpoint_every, stop_after=alerts.should_stop, checkpoint_also=rounds.ends_at,
              show=lambda m: f"loss {m['loss']:.3f}  acc {m['accuracy']:.2f}")
    diagnostics.after_training()


class PreferenceEvaluation:
    """The preference stage's dev-set measurements, on data it never trains on. The held-out
    pairs are the starting policy's samples on dev prompts, ranked by the verifier and built
    before any step (saved, so a resumed run reads the same ones back); the loss's
    implicit-reward accuracy on them says whether the preference generalises."""

    def __init__(self, cfg: TrainConfig, run: RunDir, stage: str, env: Environment, tokenizer: Tokenizer,
                 policy: SavablePolicy, reference: Reference) -> None:
        self.cfg, self.env, self.tokenizer, self.policy, self.reference = cfg, env, tokenizer, policy, reference
        dev_file = run.path / stage_file(stage, "pairs_dev.jsonl")
        if cfg.rl.steps and not dev_file.exists():  # built before any step: `policy` is the start
            dev_pairs, _ = verifier_pairs(cfg, env, tokenizer, policy, 0, cfg.rl.dev_size, split="dev")
            save_preference_jsonl(dev_pairs, dev_file)
        self.pairs = load_preference_jsonl(dev_file) if dev_file.exists() and dev_file.stat().st_size else []
        self.dev = env.fixed_set("dev", cfg.rl.dev_size, seed=0)
        self.params = dataclasses.replace(sampling_params(cfg), temperature=1.0)

    def measure(self, step: int) -> dict[str, float]:
        """dev pass@1; KL(π ‖ π_ref), length, reward, entropy and template_share on the policy's own samples;
        the loss's metrics on the held-out pairs (dev_pref_*)."""
        cfg, policy, tokenizer, reference, params = self.cfg, self.policy, self.tokenizer, self.reference, self.params
        engine = make_engine(policy, tokenizer, params, shares_weights=True)
        metrics = {"dev_pass@1": evaluate_pass_at_1(engine, self.env, self.dev)["pass@1"]}
        # KL(π ‖ π_ref), length and reward on the policy's own samples (T = 1), as the RL stage logs them
        episodes = score_episodes(self.env.score,
                                  engine.generate(self.dev[:64], 1, generator_for(cfg.seed, "pref-kl", step)))
        batch = RolloutBatch.collate(episodes, tokenizer.pad_id)
        batch.ref_logp = reference.logp(batch)
        metrics.update({k: v for k, v in rollout_metrics(batch, batch.episodes).items() if k != "zero_variance_groups"})
        # the third health check: per-token entropy of the policy on its own samples, estimated as
        # the mean −log π of the sampled tokens (at T = 1 its expectation is the entropy); DPO off
        # its pairs' distribution can collapse it (every answer the same) or blow it up (babble)
        metrics["entropy"] = masked_mean(-batch.old_logp, batch.response_mask).item()
        # template mimicry (runs/preference_monitors.py): the share of these samples that open alike
        metrics["template_share"] = template_share([e.completion for e in episodes])
        if self.pairs:
            held_out = evaluate_preference(policy, self.pairs, cfg.rl.algo, cfg.rl.algo_params, tokenizer,
                                           reference.model)
            metrics.update({f"dev_pref_{k}": v for k, v in held_out.items()})
        policy.train()
        return metrics
