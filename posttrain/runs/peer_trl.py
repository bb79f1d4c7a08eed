"""A run's settings as TRL's: the keywords of `trl.GRPOConfig` (grpo, dr_grpo, dapo, gspo),
`trl.RLOOConfig` (rloo) or `trl.DPOConfig` (dpo), and a Python snippet that trains with them.
Written against TRL 1.16.0; tests/test_export_config.py builds each config class from the
keywords where TRL is installed (`make peers-test`).

How posttrain's names become TRL's (facts of TRL's documented options):
    loss_agg  seq-mean-token-mean -> loss_type "grpo"; token-mean -> "dapo";
              seq-mean-token-sum-norm with max_len = max_new_tokens -> "dr_grpo"
    adv_norm  group -> scale_rewards "group"; group-mean-batch-std -> "batch"; none -> "none"
    gspo      importance_sampling_level "sequence"
    the KL    beta = kl_coef, TRL's estimator is k3; use_bias_correction_kl = kl_importance_weight
"""

from __future__ import annotations

from typing import Any

from posttrain.config import TrainConfig
from posttrain.runs.peer_settings import PeerConfig, RunSettings, annotated, policy_source, rows_per_minibatch

TRL_VERSION = "1.16.0"
GRPO_FAMILY = ("grpo", "dr_grpo", "dapo", "gspo")
LOSS_TYPES = {"seq-mean-token-mean": "grpo", "token-mean": "dapo", "seq-mean-token-sum-norm": "dr_grpo"}
SCALE_REWARDS = {"group": "group", "group-mean-batch-std": "batch", "none": "none"}
CONFIG_CLASSES = {**{name: "GRPOConfig" for name in GRPO_FAMILY}, "rloo": "RLOOConfig", "dpo": "DPOConfig"}


def optimizer_keywords(settings: RunSettings, steps_key: str) -> dict[str, Any]:
    """AdamW and its schedule: posttrain warms up linearly, then decays by a cosine to
    final_lr_fraction of the rate (transformers' cosine_with_min_lr), or holds it at 1."""
    fraction = settings["rl.optim.final_lr_fraction"]
    schedule: dict[str, Any] = ({"lr_scheduler_type": "constant_with_warmup"} if fraction == 1 else
                                {"lr_scheduler_type": "cosine_with_min_lr",
                                 "lr_scheduler_kwargs": {"min_lr_rate": fraction}})
    return {"learning_rate": settings["rl.optim.lr"], "warmup_steps": settings["rl.optim.warmup_steps"],
            **schedule, "adam_beta2": settings["rl.optim.adam_beta2"],
            "weight_decay": settings["rl.optim.weight_decay"], "max_grad_norm": settings["rl.optim.grad_clip"],
            "max_steps": settings[steps_key], "seed": settings["seed"],
            "bf16": settings["dtype"] == "bfloat16"}


def batch_keywords(settings: RunSettings) -> dict[str, Any]:
    """A step's rollout of prompts × samples, split into minibatches of optimizer steps and
    micro-batches of gradient accumulation: TRL generates once every steps_per_generation
    optimizer steps of per_device_train_batch_size × gradient_accumulation_steps completions."""
    rows = rows_per_minibatch(settings)
    micro = settings["rl.update.micro_batch_size"] or rows
    if rows % micro:
        raise settings.refuse("rl.update.micro_batch_size", f"TRL accumulates equal micro-batches of a "
                              f"minibatch of {rows} completions", f"choose a divisor of {rows}")
    accumulation = rows // micro
    return {"num_generations": settings["rl.samples_per_prompt"], "per_device_train_batch_size": micro,
            "gradient_accumulation_steps": accumulation,
            "steps_per_generation": settings["rl.update.minibatches"] * accumulation,
            "num_iterations": settings["rl.update.epochs"]}


def grpo_keywords(settings: RunSettings) -> dict[str, Any]:
    """GRPOConfig's keywords for the GRPO family."""
    agg = settings.loss_agg(LOSS_TYPES, "TRL's loss types aggregate as",
                            "TRL's dr_grpo divides by max_completion_length")
    norm = settings.field("adv_norm")
    if norm not in SCALE_REWARDS:
        raise settings.refuse(f"{settings.algo}.adv_norm", f"TRL's scale_rewards has {', '.join(SCALE_REWARDS)}",
                              f"set --{settings.algo}.adv_norm to one of those")
    keywords = {"loss_type": LOSS_TYPES[agg], "scale_rewards": SCALE_REWARDS[norm],
                "epsilon": settings.field("clip_eps_low"), "epsilon_high": settings.field("clip_eps_high"),
                "importance_sampling_level": "sequence" if settings.algo == "gspo" else "token",
                **kl_keywords(settings), "mask_truncated_completions": settings.field("overlong_filter"),
                "top_entropy_quantile": settings["rl.entropy.top_quantile"]}
    return keywords | entropy_keywords(settings)


def kl_keywords(settings: RunSettings) -> dict[str, Any]:
    """beta and its bias correction; TRL estimates the KL with k3 only, so another estimator
    is refused while the term is on (with beta 0 the estimator does nothing)."""
    beta = settings.field("kl_coef")
    if beta and settings.field("kl_estimator") != "k3":
        raise settings.refuse(f"{settings.algo}.kl_estimator", "TRL's KL term is the k3 estimator",
                              f"set --{settings.algo}.kl_estimator k3")
    settings.agrees(f"{settings.algo}.kl_estimator")  # k3, or no KL term at all
    keywords: dict[str, Any] = {"beta": beta}
    if settings.has_field("kl_importance_weight"):
        keywords["use_bias_correction_kl"] = settings.field("kl_importance_weight")
    return keywords


def entropy_keywords(settings: RunSettings) -> dict[str, Any]:
    """TRL's entropy bonus is a per-token mean whatever the loss type; posttrain's follows
    loss_agg by default, so a bonus under another aggregation stays listed as unmapped."""
    coef = settings.field("entropy_coef")
    if not coef:
        settings.agrees(f"{settings.algo}.entropy_agg")
    return {"entropy_coef": coef}


def rloo_keywords(settings: RunSettings) -> dict[str, Any]:
    """RLOOConfig: the leave-one-out baseline is the trainer itself. posttrain's rloo has no
    KL term and no entropy bonus in TRL's RLOO, so beta is 0 and a bonus is refused; TRL's
    ratio clip (epsilon) is inert at one iteration per batch, and its aggregation of the
    sequence's log-probabilities is left listed (loss_agg) for the reader to compare."""
    if settings.field("baseline") != "leave_one_out":
        raise settings.refuse("rloo.baseline", "TRL's RLOO is the leave-one-out baseline", "drop the setting")
    if settings.field("entropy_coef"):
        raise settings.refuse("rloo.entropy_coef", "TRL's RLOOConfig has no entropy bonus", "set it to 0")
    settings.agrees("rloo.ema_decay", "rloo.entropy_agg")  # the EMA is the running-mean baseline's; no bonus
    if settings.field("loss_agg") != "seq-mean-token-sum-norm":
        settings.agrees("rloo.max_len")  # the divisor of that one aggregation only
    return {"beta": 0.0, "normalize_advantages": False}


def dpo_keywords(settings: RunSettings) -> dict[str, Any]:
    """DPOConfig: the sigmoid loss with β and label smoothing; DPO + NLL (Pang et al.'s α) is
    TRL's combination of the sigmoid and sft losses, weighted 1 and α."""
    for name, off in (("length_normalize", False), ("gap_weighting", "none"), ("kl_coef", 0.0)):
        if settings.field(name) != off:
            raise settings.refuse(f"dpo.{name}", "TRL's DPOConfig has no counterpart", f"set --dpo.{name} {off}")
    nll = settings.field("nll_coef")
    losses: dict[str, Any] = ({"loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, nll]} if nll else
                              {"loss_type": ["sigmoid"]})
    return {**losses, "beta": settings.field("beta"), "label_smoothing": settings.field("label_smoothing")}


def to_trl(cfg: TrainConfig, settings: RunSettings) -> PeerConfig:
    algo = settings.algo
    if algo not in CONFIG_CLASSES:
        raise settings.refuse("rl.algo", f"TRL {TRL_VERSION} trains {', '.join(CONFIG_CLASSES)} here",
                              "choose one of those, or export to openrlhf or verl")
    keywords = optimizer_keywords(settings, "rl.steps")
    if algo == "dpo":
        keywords |= {"per_device_train_batch_size": settings["rl.prompts_per_step"]} | dpo_keywords(settings)
    else:
        keywords |= batch_keywords(settings) | {"max_completion_length": settings["rl.sampling.max_new_tokens"],
                                                "temperature": settings["rl.sampling.temperature"],
                                                "top_p": settings["rl.sampling.top_p"]}
        keywords |= grpo_keywords(settings) if algo in GRPO_FAMILY else rloo_keywords(settings)
    settings.switched_off("dynamic_sampling")
    model, notes = policy_source(cfg)
    settings.agrees("init", "model.name")
    notes.append("a train_dataset of prompts and reward_funcs (posttrain's env and verifier are not carried)"
                 if algo != "dpo" else "a train_dataset of prompt/chosen/rejected pairs")
    unmapped = settings.unmapped()
    return PeerConfig("trl", f"TRL {TRL_VERSION}", CONFIG_CLASSES[algo], keywords, unmapped, notes,
                      annotated(f"TRL {CONFIG_CLASSES[algo]} for rl.algo={algo} (written for TRL {TRL_VERSION})",
                                unmapped, notes, snippet(CONFIG_CLASSES[algo], keywords, model, algo)))


def snippet(config_class: str, keywords: dict[str, Any], model: str, algo: str) -> str:
    trainer = config_class.replace("Config", "Trainer")
    body = "".join(f"    {key}={value!r},\n" for key, value in keywords.items())
    data = "train_dataset=PAIRS" if algo == "dpo" else "reward_funcs=REWARD_FUNCS, train_dataset=PROMPTS"
    return (f"from trl import {config_class}, {trainer}\n\nconfig = {config_class}(\n    output_dir=OUTPUT_DIR,\n"
            f"{body})\ntrainer = {trainer}(model={model!r}, args=config, {data})\ntrainer.train()\n")
