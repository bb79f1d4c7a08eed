"""A run's settings as OpenRLHF's command line: `python -m openrlhf.cli.train_ppo_ray` and
its flags. Written against OpenRLHF 0.11.0 (the dotted flags, `--actor.adam.lr`);
tests/test_export_config.py parses every command this writes with a parser rebuilt from that
version's own flag list (tests/fixtures/peers/openrlhf_train_ppo_ray.json, written by
tests/fixtures/peers/write_peer_fixtures.py from its train_ppo_ray.py).

How posttrain's algorithms become OpenRLHF's advantage estimators (OpenRLHF's facts):
    grpo, dapo -> group_norm (adv_norm none: --algo.advantage.no_std_norm); dr_grpo -> dr_grpo;
    gspo -> group_norm with --actor.policy_loss_type gspo; rloo -> rloo;
    reinforce_pp -> reinforce (REINFORCE++: KL in the reward, batch whitening); ppo -> gae
OpenRLHF averages the policy loss over every token of the batch (token-mean), or per sequence
for GSPO, with no setting to change it: another aggregation is refused with the flag that
matches OpenRLHF's.
"""

from __future__ import annotations

import shlex
from typing import Any

from posttrain.config import TrainConfig
from posttrain.runs.peer_settings import PeerConfig, RunSettings, annotated, policy_source, rows_per_minibatch

OPENRLHF_VERSION = "0.11.0"
ENTRY = "openrlhf.cli.train_ppo_ray"
ESTIMATORS = {"grpo": "group_norm", "dapo": "group_norm", "gspo": "group_norm", "dr_grpo": "dr_grpo",
              "rloo": "rloo", "reinforce_pp": "reinforce", "ppo": "gae"}
KL_IN_LOSS = ("grpo", "dapo", "gspo", "dr_grpo")  # GRPO's KL term in the loss; the others put it in the reward


def loss_flags(settings: RunSettings) -> dict[str, Any]:
    """The clipped surrogate: its two ε, the aggregation OpenRLHF has, the entropy bonus."""
    algo = settings.algo
    fixed = "seq-mean-token-mean" if algo == "gspo" else "token-mean"
    if settings.field("loss_agg") != fixed:
        raise settings.refuse(f"{algo}.loss_agg", f"OpenRLHF aggregates {algo}'s loss as {fixed}",
                              f"set --{algo}.loss_agg {fixed} to train the same loss in both")
    settings.agrees(f"{algo}.max_len")  # the divisor of seq-mean-token-sum-norm, refused above
    flags: dict[str, Any] = {}
    if settings.has_field("clip_eps_low"):
        flags["--actor.eps_clip_low_high"] = [settings.field("clip_eps_low"), settings.field("clip_eps_high")]
    if algo == "gspo":
        flags["--actor.policy_loss_type"] = "gspo"
    coef = settings.field("entropy_coef")
    if coef:
        flags["--actor.entropy_coef"] = coef
    else:
        settings.agrees(f"{algo}.entropy_agg")
    return flags


def kl_flags(settings: RunSettings) -> dict[str, Any]:
    """GRPO's family puts β·KL in the loss (--algo.kl.use_loss), REINFORCE++ and PPO in the
    reward; rl.kl.target makes the coefficient adaptive in both."""
    algo = settings.algo
    if not settings.has_field("kl_coef"):  # rloo: no KL term
        return {"--algo.kl.init_coef": 0.0}
    flags: dict[str, Any] = {"--algo.kl.init_coef": settings.field("kl_coef"), "--algo.kl.estimator": settings.kl_estimator()}
    settings.kl_term_off()
    if algo in KL_IN_LOSS and settings.field("kl_coef"):
        flags["--algo.kl.use_loss"] = True
    if settings["rl.kl.target"]:
        flags |= {"--algo.kl.target": settings["rl.kl.target"], "--algo.kl.horizon": settings["rl.kl.horizon"]}
    else:
        settings.agrees("rl.kl.horizon")
    return flags


def advantage_flags(settings: RunSettings) -> dict[str, Any]:
    algo = settings.algo
    flags: dict[str, Any] = {"--algo.advantage.estimator": ESTIMATORS[algo]}
    if settings.has_field("adv_norm"):
        norm, allowed = settings.field("adv_norm"), ("none",) if algo == "dr_grpo" else ("group", "none")
        if norm not in allowed:
            raise settings.refuse(f"{algo}.adv_norm", f"OpenRLHF's {ESTIMATORS[algo]} normalises as "
                                  f"{' or '.join(allowed)}", f"set --{algo}.adv_norm {allowed[0]}")
        if norm == "none" and algo != "dr_grpo":
            flags["--algo.advantage.no_std_norm"] = True
        settings.agrees(f"{algo}.adv_eps")
    if algo == "ppo":
        flags |= {"--algo.advantage.gamma": settings.field("gamma"), "--algo.advantage.lambd": settings.field("lam")}
        if settings.field("value_clip") is not None:
            flags["--critic.value_clip"] = settings.field("value_clip")
        if not settings.field("whiten_advantages"):
            raise settings.refuse("ppo.whiten_advantages", "OpenRLHF whitens GAE advantages", "set it to true")
    if algo == "dapo":
        if settings.field("dynamic_sampling"):
            flags["--algo.dynamic_filtering_enable"] = True
        flags |= {"--reward.overlong_buffer_len": settings.field("overlong_cache")}
    return flags


def batch_flags(settings: RunSettings) -> dict[str, Any]:
    """A rollout of prompts × samples, trained in minibatches (--train.batch_size counts
    completions) and micro-batches; OpenRLHF runs until its prompts are used, so steps ×
    prompts_per_step of them make posttrain's number of steps in one episode."""
    flags = {"--rollout.batch_size": settings["rl.prompts_per_step"],
             "--rollout.n_samples_per_prompt": settings["rl.samples_per_prompt"],
             "--train.batch_size": rows_per_minibatch(settings), "--train.max_epochs": settings["rl.update.epochs"],
             "--data.max_samples": settings["rl.steps"] * settings["rl.prompts_per_step"],
             "--train.num_episodes": 1}
    if settings["rl.update.micro_batch_size"]:
        flags["--train.micro_batch_size"] = settings["rl.update.micro_batch_size"]
    return flags


def optimizer_flags(settings: RunSettings) -> dict[str, Any]:
    steps = max(settings["rl.steps"], 1)
    return {"--actor.adam.lr": settings["rl.optim.lr"], "--actor.adam.betas": [0.9, settings["rl.optim.adam_beta2"]],
            "--actor.adam.weight_decay": settings["rl.optim.weight_decay"],
            "--actor.max_norm": settings["rl.optim.grad_clip"], "--actor.lr_scheduler": "cosine_with_min_lr",
            "--actor.lr_warmup_ratio": settings["rl.optim.warmup_steps"] / steps,
            "--actor.min_lr_ratio": settings["rl.optim.final_lr_fraction"]}


def to_openrlhf(cfg: TrainConfig, settings: RunSettings) -> PeerConfig:
    algo = settings.algo
    if algo not in ESTIMATORS:
        raise settings.refuse("rl.algo", f"OpenRLHF {OPENRLHF_VERSION}'s train_ppo_ray trains "
                              f"{', '.join(ESTIMATORS)} here", "choose one of those, or export to trl or verl")
    model, notes = policy_source(cfg)
    settings.agrees("init", "model.name")
    flags: dict[str, Any] = {"--actor.model_name_or_path": model}
    if algo == "ppo":
        flags["--critic.model_name_or_path"] = model  # posttrain's value head sits on the policy's trunk
    flags |= advantage_flags(settings) | loss_flags(settings) | kl_flags(settings) | batch_flags(settings)
    flags |= optimizer_flags(settings)
    flags |= {"--rollout.max_new_tokens": settings["rl.sampling.max_new_tokens"],
              "--rollout.temperature": settings["rl.sampling.temperature"],
              "--rollout.top_p": settings["rl.sampling.top_p"], "--train.seed": settings["seed"]}
    if settings["model.lora_r"]:
        flags |= {"--ds.lora.rank": settings["model.lora_r"],
                  "--ds.lora.alpha": settings["model.lora_alpha"] or 2 * settings["model.lora_r"]}
    else:
        settings.agrees("model.lora_alpha")
    flags |= {"--data.prompt_dataset": "$PROMPTS", "--reward.remote_url": "$REWARD_URL"}
    notes.append("$PROMPTS, a prompt dataset, and $REWARD_URL, a reward server (or --train.agent_func_path): "
                 "posttrain's env and verifier are not carried")
    settings.switched_off("overlong_filter")
    unmapped = settings.unmapped()
    return PeerConfig("openrlhf", f"OpenRLHF {OPENRLHF_VERSION}", ENTRY, flags, unmapped, notes,
                      annotated(f"OpenRLHF for rl.algo={algo} (written for OpenRLHF {OPENRLHF_VERSION})", unmapped,
                                notes, command(flags)))


def command_words(flags: dict[str, Any]) -> list[str]:
    """The flags as argv words: a true switch alone, a list as its values, a number as Python writes it."""
    words: list[str] = []
    for flag, value in flags.items():
        if value is True:
            words.append(flag)
        elif isinstance(value, list):
            words += [flag, *map(str, value)]
        else:
            words += [flag, str(value)]
    return words


def command(flags: dict[str, Any]) -> str:
    """The shell command, one flag a line; $PROMPTS and $REWARD_URL stay for the shell to fill."""
    lines = [f"python -m {ENTRY}"]
    for flag, value in flags.items():
        values = command_words({flag: value})[1:]
        quoted = [v if v.startswith("$") else shlex.quote(v) for v in values]
        lines.append(" ".join([flag, *(f'"{v}"' if v.startswith("$") else v for v in quoted)]))
    return " \\\n  ".join(lines) + "\n"
