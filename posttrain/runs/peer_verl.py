"""A run's settings as verl's: Hydra overrides (`key=value`) for `python -m
verl.trainer.main_ppo`. Written against verl 0.8.0.dev (commit b178a3c, January 2026);
tests/test_export_config.py checks every key against that version's composed trainer config
(verl/trainer/config/_generated_ppo_trainer.yaml) and the estimator, policy-loss, aggregation
and KL names its code registers, kept in tests/fixtures/peers/verl_ppo_trainer.json (written
by tests/fixtures/peers/write_peer_fixtures.py).

How posttrain's algorithms become verl's (verl's facts):
    grpo, dapo -> adv_estimator grpo (norm_adv_by_std_in_grpo: adv_norm group or none);
    dr_grpo -> grpo without the std, loss_agg_mode seq-mean-token-sum-norm; gspo -> grpo with
    policy_loss.loss_mode gspo; rloo -> rloo; reinforce_pp -> reinforce_plus_plus; ppo -> gae
    the KL estimators k1, k2, k3 -> kl, mse, low_var_kl; GRPO's family puts the KL in the loss
    (use_kl_loss), REINFORCE++ and PPO in the reward (use_kl_in_reward)
verl's loss_agg_mode names are posttrain's (both follow verl's core_algos), so they carry as they are.
"""

from __future__ import annotations

from typing import Any

from posttrain.config import TrainConfig
from posttrain.runs.peer_settings import PeerConfig, RunSettings, annotated, policy_source, rows_per_minibatch

VERL_VERSION = "0.8.0.dev (b178a3c)"
ENTRY = "verl.trainer.main_ppo"
ESTIMATORS = {"grpo": "grpo", "dapo": "grpo", "gspo": "grpo", "dr_grpo": "grpo", "rloo": "rloo",
              "reinforce_pp": "reinforce_plus_plus", "ppo": "gae"}
KL_NAMES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}
KL_IN_LOSS = ("grpo", "dapo", "gspo", "dr_grpo")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"


def actor_overrides(settings: RunSettings) -> dict[str, Any]:
    """The policy loss: clip range, aggregation, entropy bonus, epochs and minibatches."""
    algo = settings.algo
    agg = settings.loss_agg(LOSS_AGG_MODES, "verl aggregates as", "verl divides by the response length budget")
    overrides: dict[str, Any] = {f"{ACTOR}.loss_agg_mode": agg, f"{ACTOR}.ppo_epochs": settings["rl.update.epochs"],
                                 # verl counts a minibatch in prompts, each with its rollout.n completions
                                 f"{ACTOR}.ppo_mini_batch_size": rows_per_minibatch(settings)
                                 // settings["rl.samples_per_prompt"]}
    if settings.has_field("clip_eps_low"):
        overrides |= {f"{ACTOR}.clip_ratio_low": settings.field("clip_eps_low"),
                      f"{ACTOR}.clip_ratio_high": settings.field("clip_eps_high")}
    if algo == "gspo":
        overrides[f"{ACTOR}.policy_loss.loss_mode"] = "gspo"
    if settings["rl.update.micro_batch_size"]:
        overrides[f"{ACTOR}.ppo_micro_batch_size_per_gpu"] = settings["rl.update.micro_batch_size"]
    overrides[f"{ACTOR}.entropy_coeff"] = settings.field("entropy_coef")
    if not settings.field("entropy_coef"):
        settings.agrees(f"{algo}.entropy_agg")
    return overrides


def kl_overrides(settings: RunSettings) -> dict[str, Any]:
    algo = settings.algo
    if not settings.has_field("kl_coef"):  # rloo: no KL term
        return {f"{ACTOR}.use_kl_loss": False, "algorithm.use_kl_in_reward": False}
    coef, estimator = settings.field("kl_coef"), KL_NAMES.get(settings.kl_estimator())
    if estimator is None:
        raise settings.refuse(f"{algo}.kl_estimator", "verl estimates the KL as k1, k2 or k3",
                              f"set --{algo}.kl_estimator to one of those")
    settings.kl_term_off()
    if algo in KL_IN_LOSS:
        overrides: dict[str, Any] = {f"{ACTOR}.use_kl_loss": bool(coef), f"{ACTOR}.kl_loss_coef": coef,
                                     f"{ACTOR}.kl_loss_type": estimator, "algorithm.use_kl_in_reward": False}
        if settings["rl.kl.target"]:
            raise settings.refuse("rl.kl.target", "verl adapts only the KL coefficient in the reward",
                                  "set rl.kl.target 0")
    else:
        overrides = {"algorithm.use_kl_in_reward": bool(coef), "algorithm.kl_ctrl.kl_coef": coef,
                     "algorithm.kl_penalty": estimator, f"{ACTOR}.use_kl_loss": False}
        if settings["rl.kl.target"]:
            overrides |= {"algorithm.kl_ctrl.type": "adaptive", "algorithm.kl_ctrl.target_kl": settings["rl.kl.target"],
                          "algorithm.kl_ctrl.horizon": settings["rl.kl.horizon"]}
    if not settings["rl.kl.target"]:
        settings.agrees("rl.kl.horizon")
    return overrides


def algorithm_overrides(settings: RunSettings) -> dict[str, Any]:
    algo = settings.algo
    overrides: dict[str, Any] = {"algorithm.adv_estimator": ESTIMATORS[algo]}
    if settings.has_field("adv_norm"):
        norm = settings.field("adv_norm")
        if norm not in ("group", "none"):
            raise settings.refuse(f"{algo}.adv_norm", "verl's grpo estimator divides by the group std or not at "
                                  "all (norm_adv_by_std_in_grpo)", f"set --{algo}.adv_norm group or none")
        overrides["algorithm.norm_adv_by_std_in_grpo"] = norm == "group"
        settings.agrees(f"{algo}.adv_eps")
    if algo == "rloo":
        if settings.field("baseline") != "leave_one_out":
            raise settings.refuse("rloo.baseline", "verl's rloo is the leave-one-out baseline", "drop the setting")
        settings.agrees("rloo.ema_decay")  # the running-mean baseline's, not leave-one-out's
    if algo == "ppo":
        overrides |= {"algorithm.gamma": settings.field("gamma"), "algorithm.lam": settings.field("lam")}
        if settings.field("value_clip") is not None:
            overrides["critic.cliprange_value"] = settings.field("value_clip")
    return overrides


def optimizer_overrides(settings: RunSettings) -> dict[str, Any]:
    optim = f"{ACTOR}.optim"
    return {f"{optim}.lr": settings["rl.optim.lr"], f"{optim}.lr_warmup_steps": settings["rl.optim.warmup_steps"],
            f"{optim}.lr_scheduler_type": "cosine", f"{optim}.min_lr_ratio": settings["rl.optim.final_lr_fraction"],
            f"{optim}.betas": [0.9, settings["rl.optim.adam_beta2"]],
            f"{optim}.weight_decay": settings["rl.optim.weight_decay"],
            # the legacy FSDP actor clips by actor.grad_clip, the newer engine workers by optim.clip_grad: both
            f"{ACTOR}.grad_clip": settings["rl.optim.grad_clip"], f"{optim}.clip_grad": settings["rl.optim.grad_clip"]}


def to_verl(cfg: TrainConfig, settings: RunSettings) -> PeerConfig:
    algo = settings.algo
    if algo not in ESTIMATORS:
        raise settings.refuse("rl.algo", f"verl {VERL_VERSION}'s main_ppo trains {', '.join(ESTIMATORS)} here",
                              "choose one of those, or export to trl or openrlhf")
    model, notes = policy_source(cfg)
    settings.agrees("init", "model.name")
    overrides: dict[str, Any] = {"actor_rollout_ref.model.path": model, f"{ROLLOUT}.name": "vllm",
                                 "data.train_files": "$PROMPTS", "data.train_batch_size": settings["rl.prompts_per_step"],
                                 "data.max_response_length": settings["rl.sampling.max_new_tokens"],
                                 f"{ROLLOUT}.n": settings["rl.samples_per_prompt"],
                                 f"{ROLLOUT}.temperature": settings["rl.sampling.temperature"],
                                 f"{ROLLOUT}.top_p": settings["rl.sampling.top_p"],
                                 "trainer.total_training_steps": settings["rl.steps"],
                                 "data.seed": settings["seed"], f"{ACTOR}.data_loader_seed": settings["seed"]}
    if algo == "ppo":
        overrides["critic.model.path"] = model  # posttrain's value head sits on the policy's trunk
    overrides |= algorithm_overrides(settings) | actor_overrides(settings) | kl_overrides(settings)
    overrides |= optimizer_overrides(settings)
    if settings["model.lora_r"]:
        overrides |= {"actor_rollout_ref.model.lora_rank": settings["model.lora_r"],
                      "actor_rollout_ref.model.lora_alpha": settings["model.lora_alpha"] or 2 * settings["model.lora_r"]}
    else:
        settings.agrees("model.lora_alpha")
    settings.switched_off("overlong_filter", "dynamic_sampling")
    notes.append("$PROMPTS, a parquet file of prompts, and custom_reward_function.path (a compute_score "
                 "function): posttrain's env and verifier are not carried")
    unmapped = settings.unmapped()
    return PeerConfig("verl", f"verl {VERL_VERSION}", ENTRY, overrides, unmapped, notes,
                      annotated(f"verl for rl.algo={algo} (written for verl {VERL_VERSION})", unmapped, notes,
                                command(overrides)))


def hydra_value(value: Any) -> str:
    """A value as a Hydra override writes it: true/false, [a,b], numbers as Python writes them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, str) and value.startswith("$"):
        return f'"{value}"'
    return str(value)


def command(overrides: dict[str, Any]) -> str:
    lines = [f"python -m {ENTRY}"] + [f"{key}={hydra_value(value)}" for key, value in overrides.items()]
    return " \\\n  ".join(lines) + "\n"
