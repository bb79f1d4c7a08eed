"""Every check that runs before a job starts, so that a setting the library cannot use is
refused with its name and what to do, before any compute is spent.

    check_config(cfg)       every setting's type (config/type_checks.py) and value (cfg.validate()),
                            then what only the library can judge: names that must exist,
                            files that must be readable, parameters an algorithm must accept,
                            splits big enough, prompts and demonstrations that fit the model,
                            placements the machine offers, and settings under which RL cannot
                            learn. Returns what a training run's checks found (--dry_run).

Here are the checks of the settings themselves; those that read the task's data through the
model's tokenizer (splits, prompt and demonstration lengths, the vocabulary, a multi-turn
environment's rules) are in data_checks.py, which check_train calls and which never calls
back. The other commands' checks are in command_checks.py.

The objects themselves are built by pipelines/build.py, which these checks call to build an
algorithm or a reward once and see it accepted.
"""

from __future__ import annotations

from typing import Any, Callable

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES
from posttrain.config import ConfigError, RLConfig, TrainConfig, check
from posttrain.config.commands import PrmConfig
from posttrain.config.scoring import BonConfig, EvalConfig, SearchConfig, ThinkConfig, VerifyConfig, WinrateConfig
from posttrain.config.sections import SELF_TEACHER
from posttrain.config.type_checks import check_types
from posttrain.data.preference import load_preference_data
from posttrain.models import (
    MODELS,
    check_checkpoint_shape,
    is_pretrained,
    is_transformers_policy,
    load_tokenizer,
    policy_context,
    read_model_dir,
)
from posttrain.models.device import resolve_device
from posttrain.models.model_dirs import resolve_model_dir
from posttrain.models.smollm2 import KNOWN_MODELS
from posttrain.pipelines.algorithm_settings import algorithm_settings
from posttrain.pipelines.build import is_preference, make_algorithm, reward_stack, teacher_directory
from posttrain.pipelines.command_checks import (check_bon, check_env, check_eval, check_placement, check_prm,
                                                check_search, check_think, check_winrate)
from posttrain.pipelines.data_checks import check_data
from posttrain.pipelines.turn_checks import check_multi_turn
from posttrain.pipelines.preference_diagnostics import ood_environment
from posttrain.pipelines.stage_plan import stage_plan
from posttrain.rewards.reward_model import check_reward_model_dir
from posttrain.roles.engines import ENGINES, check_engine
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.teacher import check_same_tokenizer
from posttrain.runs.trackers import check_trackers
from posttrain.algorithms.contract import Algorithm
from posttrain.types import Environment, PreferencePair

# the configs check_config checks: a training run's, and each scoring command's
CheckedConfig = (TrainConfig | EvalConfig | BonConfig | PrmConfig | SearchConfig | VerifyConfig | ThinkConfig
                 | WinrateConfig)


def check_config(cfg: CheckedConfig, env: Environment | None = None) -> list[str]:
    """Refuse a config before anything starts: its types and values (check_types,
    cfg.validate()), then the names, files, data and parameters only the library can judge.
    `env`: a TrainConfig's environment object, given instead of cfg.env (api.train).
    Raises ConfigError naming the setting; returns what a training run's checks found
    (the model a name resolved to, data sizes, sequence lengths), for --dry_run."""
    check_types(cfg)
    cfg.validate()
    try:
        if isinstance(cfg, TrainConfig):
            return check_train(cfg, env)
        command_checks: dict[type, Callable[[Any], None]] = {
            EvalConfig: check_eval, BonConfig: check_bon, PrmConfig: check_prm, SearchConfig: check_search,
            VerifyConfig: check_search, ThinkConfig: check_think, WinrateConfig: check_winrate}
        command_checks[type(cfg)](cfg)
        return []
    except ConfigError:
        raise
    except (ValueError, FileNotFoundError) as error:  # a registry or a loader said why
        raise ConfigError(str(error)) from None


def check_model(cfg: TrainConfig) -> None:
    known = sorted(MODELS) + sorted(KNOWN_MODELS)
    name = cfg.model.name
    if name not in known:
        try:  # a directory, or a hub name in the local Hugging Face cache; never a download
            directory = resolve_model_dir(name)
        except ValueError as error:
            raise ConfigError(f"model.name={name!r} is not allowed: expected one of {known}, a local transformers "
                              f"directory or a name in the local Hugging Face cache; {error}") from None
        try:
            read_model_dir(directory)  # its config.json, not its weights: a directory of something else fails now
        except ValueError as error:
            raise ConfigError(f"model.name={name!r} is not allowed: {error}") from None
    if not cfg.init:  # with init, the model it loads decides (check_train)
        check(not cfg.model.lora_r or name not in MODELS, "model.lora_r", cfg.model.lora_r,
              "0 for gpt_mini (LoRA is for pretrained transformers models; gpt_mini trains every weight)")


def check_rl(rl: RLConfig) -> None:
    check(rl.algo in ALGORITHMS or rl.algo in PREFERENCE_LOSSES, "rl.algo", rl.algo,
          f"one of {sorted(ALGORITHMS)} (RL) or {sorted(PREFERENCE_LOSSES)} (preference)")
    check(rl.sampling.engine in ENGINES, "rl.sampling.engine", rl.sampling.engine,
          f"one of {sorted(ENGINES)} (the engines registered in posttrain/roles/engines/)")
    check_engine(rl.sampling)  # what the chosen engine cannot do (vllm: installed, top_p 1)
    preference = is_preference(rl)
    # rl.algo_params typed against the algorithm's own fields: a typo or a wrong type is refused
    # by name here, before any model loads; the instance is what the run will build
    settings = algorithm_settings(rl)
    if rl.preference.self_reward:
        check(preference and not rl.preference.pairs, "rl.preference.self_reward", rl.preference.self_reward,
              "false unless rl.algo is a preference loss whose pairs are built from the policy's samples (no "
              "rl.preference.pairs file): the policy judges its own samples into pairs, and an RL algorithm or a "
              "fixed file has none to judge")
    if preference:
        loss = settings
        check(not loss.paired or rl.update.micro_batch_size % 2 == 0, "rl.update.micro_batch_size",
              rl.update.micro_batch_size, f"an even number with {rl.algo} (a pair's two rows must share a micro-batch), or 0")
        if rl.preference.pairs:
            # an unreadable file fails now, not after SFT
            records = load_preference_data(rl.preference.pairs, rl.preference.pairs_columns)
            unscored = [i for i, r in enumerate(records) if not isinstance(r, PreferencePair) or r.score_chosen is None]
            check(loss.gap_weighting == "none" or not unscored, f"{rl.algo}.gap_weighting", loss.gap_weighting,
                  f"'none' for rl.preference.pairs={rl.preference.pairs!r}: {len(unscored)} of its {len(records)} "
                  f"records (the first: record {unscored[0] if unscored else 0}) carry no score_chosen / score_rejected, and gap "
                  "weighting weighs each pair by their difference; add the columns (map yours with "
                  "--rl.preference.pairs_columns 'score_chosen=COLUMN,score_rejected=COLUMN') or weight no pair")
    else:
        algo = settings
    check_can_learn(rl, None if preference else algo)
    check(not (preference and rl.curation.enabled()), "rl.curation.pool_size", rl.curation.pool_size,
          f"0 with a preference loss (rl.algo={rl.algo!r}): curation chooses the prompts of the RL stage, and a "
          "preference loss trains on pairs (rl.preference.pairs, or the samples of rl.preference.pair_prompts prompts)")
    try:  # imports its functions and reads their signatures: a bad term fails before the run exists
        stack = reward_stack(rl)
    except ValueError as error:
        raise ConfigError(f"rl.reward.terms={rl.reward.terms!r} is not allowed: {error}") from None
    terms = 1 if stack is None else len(stack.terms) + len(stack.group_terms)
    check_entropy_and_terms(rl, None if preference else algo, terms)
    if rl.preference.online_rounds > 1:
        check(preference and not rl.preference.pairs, "rl.preference.online_rounds", rl.preference.online_rounds,
              "1 unless rl.algo is a preference loss whose pairs the verifier builds (no rl.preference.pairs file: "
              "a fixed file cannot be resampled from the current policy)")
        check(rl.preference.online_rounds <= min(rl.steps, rl.preference.pair_prompts), "rl.preference.online_rounds",
              rl.preference.online_rounds,
              f"at most rl.steps={rl.steps} and rl.preference.pair_prompts={rl.preference.pair_prompts} "
              "(every round needs a step and a prompt)")
    if rl.preference.refresh_reference:
        check(rl.preference.online_rounds > 1 and preference and loss.uses_reference, "rl.preference.refresh_reference",
              rl.preference.refresh_reference, "false unless rl.preference.online_rounds > 1 and rl.algo is a "
              "preference loss with a reference (dpo, ipo, kto): there is no next round, or no reference, to refresh")
    if rl.rm.path:
        try:
            for directory in rl.rm.paths():
                check_reward_model_dir(directory)
        except ValueError as error:
            raise ConfigError(f"rl.rm.path={rl.rm.path!r} is not allowed: {error}") from None
        if preference:
            check(not rl.preference.pairs, "rl.rm.path", rl.rm.path, "'' with rl.preference.pairs: a pairs file is "
                  "already ranked; the reward model ranks the policy's own samples when there is no file")
    if rl.reward.length_reward > 0:
        check_length_reward(rl, preference)
    if rl.kl.target > 0:
        check(not preference, "rl.kl.target", rl.kl.target,
              "0 for a preference loss (its beta already sets how close to the reference it stays)")
        check(algo.kl_coef > 0, "rl.kl.target", rl.kl.target,
              f"0 unless the algorithm has a KL term: set --{rl.algo}.kl_coef 0.04 "
              f"({rl.algo} has kl_coef={algo.kl_coef!r}; the controller multiplies it)")


def check_entropy_and_terms(rl: RLConfig, algo: Algorithm | None, terms: int) -> None:
    """Per-term normalisation (GDPO) needs several terms and an algorithm whose advantage
    normalises each within its group; entropy control needs an RL algorithm, and the token
    settings one whose loss applies them (`algo`: None for a preference loss; `terms`: the
    reward's number of terms)."""
    settings = f"rl.algo={rl.algo!r}" + (f" with rl.algo_params={rl.algo_params}" if rl.algo_params else "")
    if rl.reward.normalize == "per_term":
        check(algo is not None and algo.accepts_reward_terms, "rl.reward.normalize", "per_term",
              f"'sum' with {settings}: per-term normalisation (GDPO) is a group-relative advantage normalised term by "
              "term, for grpo and its family (dr_grpo, lite_ppo, gspo, dapo, cispo) with adv_norm 'group', "
              "'group-mean-batch-std' or 'group-mean-pooled-std' (centring alone is linear: per term or summed, the "
              "same), and dapo only with overlong_cache 0 (its penalty is added to the summed reward)")
        check(terms >= 2, "rl.reward.normalize", "per_term",
              f"'sum' with rl.reward.terms={rl.reward.terms!r}: that reward has one term, and normalising one term on "
              "its own is normalising the sum; add a term (e.g. --rl.reward.terms r1, accuracy + 0.2 × format)")
    entropy = rl.entropy
    if entropy.target > 0:
        check(algo is not None, "rl.entropy.target", entropy.target,
              f"0 with a preference loss ({settings}): the adaptive coefficient steers an RL algorithm's entropy bonus")
    if entropy.selects_tokens():
        setting = "rl.entropy.cov" if entropy.cov != "none" else "rl.entropy.top_quantile"
        value = entropy.cov if entropy.cov != "none" else entropy.top_quantile
        check(algo is not None and algo.accepts_token_selection, setting, value,
              f"{'none' if entropy.cov != 'none' else 1} with {settings}: Clip-Cov, KL-Cov and high-entropy token "
              "training select tokens of PPO's clipped surrogate, which grpo and its family (dr_grpo, lite_ppo, "
              "dapo, gspo) compute; use one of those")


def check_length_reward(rl: RLConfig, preference: bool) -> None:
    """Kimi's length reward compares the K right-or-wrong samples of one prompt: refuse the
    settings where there is no such group, no verdict, or no step it would be paid on."""
    setting = f"with rl.reward.length_reward={rl.reward.length_reward:g}"
    check(not preference, "rl.algo", rl.algo, f"an RL algorithm {setting}: a preference loss trains on pairs, and "
          "the length reward is paid to samples against their group in the RL loop; set rl.reward.length_reward 0")
    check(not rl.rm.path, "rl.rm.path", rl.rm.path, f"'' {setting}: the length reward pays right and wrong answers "
          "differently, and a reward model's score is no verdict; set rl.reward.length_reward 0 to train on the model")
    check(rl.samples_per_prompt >= 2, "rl.samples_per_prompt", rl.samples_per_prompt,
          f"at least 2 {setting}: it ranks a sample's length among its prompt's samples, and alone it is always 0")
    check(rl.reward.length_reward_start < rl.steps, "rl.reward.length_reward_start", rl.reward.length_reward_start,
          f"less than rl.steps={rl.steps} {setting}: it would never be paid")


def check_can_learn(rl: RLConfig, algo: Algorithm | None) -> None:
    """Refuse settings under which the RL stage (algo; None for a preference loss) would
    sample at full cost and learn nothing. Group baselines need K >= 2 samples per prompt:
    a group of one is its own baseline, so every advantage is exactly 0. Temperature 0 is
    refused for every algorithm, not warned about: greedy decoding makes a prompt's K
    samples identical (zero advantage under a group baseline, no pair for a preference
    loss), and for the rest the policy only ever tries its current best answer, so there
    is nothing to compare it with, and the score-function gradient assumes samples from π."""
    if rl.steps == 0 or (algo is None and rl.preference.pairs):
        return  # nothing is trained, or the pairs come from a file: the policy's samples teach nothing
    settings = f"rl.algo={rl.algo!r}" + (f" with rl.algo_params={rl.algo_params}" if rl.algo_params else "")
    if algo is None:
        check(rl.samples_per_prompt >= 2, "rl.samples_per_prompt", rl.samples_per_prompt,
              f"at least 2 with {settings} and no rl.preference.pairs file: a pair is a correct and an incorrect "
              "sample of one prompt, and one sample makes no pair; use 8 (the default) or pass rl.preference.pairs FILE")
    elif algo.needs_groups:
        check(rl.samples_per_prompt >= 2, "rl.samples_per_prompt", rl.samples_per_prompt,
              f"at least 2 with {settings}: its baseline is the other samples of the same prompt, so a group of one "
              "is its own baseline and every advantage is 0 (nothing is learnt, at full cost); use 8 (the "
              "default), or an algorithm without a group baseline: ppo, reinforce_pp or reinforce")
    check(rl.sampling.temperature > 0, "rl.sampling.temperature", rl.sampling.temperature,
          f"a number > 0 with {settings}: at 0 the rollout decodes greedily, so a prompt's samples are identical "
          "(every group-baseline advantage 0, no preference pair) and the policy never tries anything but its "
          "current best answer; use 1.0 (the policy's own distribution, the default) or e.g. 0.7 to explore less")


def check_implicit_prm(cfg: TrainConfig) -> None:
    """An algorithm with an implicit PRM (PRIME, rewards/implicit_prm.py) trains it in the
    controller's process on outcome labels in [0, 1]: refuse the topologies it has not been
    run with, and rewards that are not a probability's label."""
    if is_preference(cfg.rl) or make_algorithm(cfg.rl).implicit_prm_settings() is None:
        return
    algo = f"rl.algo={cfg.rl.algo!r}"
    check(cfg.dist.resolved_topology() == "colocated", "dist.topology", cfg.dist.topology,
          f"'colocated' (--workers 0) with {algo}: its implicit PRM is stepped by the controller, and that has only "
          "been tested with the rollout in the same process; drop --workers / --dist.topology")
    check(cfg.dist.trainer_ranks == 1, "dist.trainer_ranks", cfg.dist.trainer_ranks,
          f"1 with {algo}: its implicit PRM trains in one process beside the policy, never data-parallel")
    reward = cfg.rl.reward
    check(reward.terms in ("accuracy", "rubric") and reward.length_penalty == 0 and reward.length_reward == 0
          and not cfg.rl.rm.path, "rl.reward.terms", reward.terms,
          f"'accuracy' (or 'rubric'), with no rl.reward.length_penalty, rl.reward.length_reward or rl.rm.path, for "
          f"{algo}: its implicit PRM learns p(correct) from the reward, so the reward must be an outcome label in [0, 1]")


def check_teacher(cfg: TrainConfig) -> list[str]:
    """A teacher the run reads (OPD's, algorithm_params.teacher; R1's distillation stage's,
    sft.teacher) loads, with the student's tokenizer: it scores or writes the student's token
    ids. What was found, for --dry_run."""
    settings = None if is_preference(cfg.rl) or not cfg.rl.steps else make_algorithm(cfg.rl).teacher_settings()
    found = []
    if settings is not None:
        found.append(teacher_found(cfg, f"rl.algo_params.teacher (--{cfg.rl.algo}.teacher)", settings["teacher"],
                                   f"a teacher for rl.algo={cfg.rl.algo!r}"))
    if cfg.sft.teacher and cfg.sft.teacher != SELF_TEACHER and cfg.sft.steps:
        found.append(teacher_found(cfg, "sft.teacher", cfg.sft.teacher, "a teacher"))
    return found


def teacher_found(cfg: TrainConfig, setting: str, name: str, what: str) -> str:
    check(bool(name), setting, name, f"{what}: a checkpoint directory (runs/<id>/checkpoints/<stage>/step_N), a run "
          "directory (its last checkpoint) or a model name, with the student's tokenizer")
    try:
        directory = teacher_directory(name)
        teacher_tokenizer = load_tokenizer(directory)
    except (OSError, ValueError) as error:
        raise ConfigError(f"{setting}={name!r} is not allowed: it does not load as a teacher ({error})") from None
    context = policy_context(cfg.model, cfg.init)  # None: a known model not yet converted, checked when it is
    if context is not None:
        check_same_tokenizer(context[1], teacher_tokenizer, setting, name)
    return f"teacher: {name!r} is {directory}"


def check_int8_sampling(cfg: TrainConfig) -> None:
    """torch's int8 kernels run on the CPU and quantise float32 weights (models/int8.py)."""
    if cfg.rl.sampling.weights != "int8":
        return
    device = resolve_device(cfg.device)
    check(device.type == "cpu" and cfg.dtype == "float32", "rl.sampling.weights", "int8",
          f"'float32' with device={cfg.device!r} (resolved to {device.type}) and dtype={cfg.dtype!r}: the int8 "
          "sampler uses torch's CPU int8 kernels on float32 weights; pass --device cpu --dtype float32, or keep "
          "float32 sampling")
    check(not cfg.model.lora_r, "rl.sampling.weights", "int8",
          f"'float32' with model.lora_r={cfg.model.lora_r}: LoRA's adapters wrap the Linear layers the int8 "
          "sampler would quantise; train without LoRA, or keep float32 sampling")


def check_train(cfg: TrainConfig, env: Environment | None = None, stages_before: int = 0) -> list[str]:
    """The checks of a training run; what they found, one line each (check_data's, and the
    model directory a name resolved to), for --dry_run to show. `stages_before`: how many
    stages of --stages run before this one (0 for a plain run)."""
    if cfg.stages:
        return check_stages(cfg, env)
    check(not (cfg.sft.teacher == SELF_TEACHER and cfg.sft.steps and not stages_before), "sft.teacher",
          SELF_TEACHER, "a checkpoint, a run directory or a model name here: 'self' samples the policy that earlier "
          "stages of --stages trained (R1's rejection-sampling SFT), and this is a plain run or the first stage, "
          "with no such policy; use it after an RL stage, e.g. --stages 'sft,grpo,sft[sft.teacher=self],grpo'")
    check_trackers(cfg.trackers())  # a missing tracker library: before compare's root directory too
    check_placement(cfg.device, cfg.dtype, cfg.dist)
    check_int8_sampling(cfg)
    check_model(cfg)
    check_rl(cfg.rl)
    if env is None:
        env = check_env(cfg.env)  # the slow one (a file's solutions are scored): last of the three
    check_multi_turn(cfg, env)
    if cfg.dist.partial_rollout_tokens:  # chunks are resumed by the torch engine, one completion per row
        check(cfg.rl.sampling.engine == "torch" and not is_multi_turn(env), "dist.partial_rollout_tokens",
              cfg.dist.partial_rollout_tokens, f"0 with rl.sampling.engine={cfg.rl.sampling.engine!r} and env "
              f"{cfg.env.name!r}: partial rollouts resume single completions of the torch engine only; drop "
              "--dist.partial_rollout_tokens, or sample a single-turn environment with --rl.sampling.engine torch")
    check_implicit_prm(cfg)
    check_preference_diagnostics(cfg)
    check(not (cfg.sft.teacher and cfg.sft.steps and is_multi_turn(env)), "sft.teacher", cfg.sft.teacher,
          f"'' for the multi-turn environment {cfg.env.name!r}: the teacher's samples are single completions")
    teacher = check_teacher(cfg)
    if is_preference(cfg.rl):
        check(cfg.dist.trainer_ranks == 1, "dist.trainer_ranks", cfg.dist.trainer_ranks,
              f"1 with a preference loss (rl.algo={cfg.rl.algo!r} trains in one process; only RL algorithms run "
              "data-parallel)")
    if cfg.init:
        try:  # a run's checkpoint, any transformers model directory, or a model name (as model.name takes)
            init = resolve_model_dir(cfg.init)
        except ValueError as error:
            raise ConfigError(f"init={cfg.init!r}: no such checkpoint directory ({error})") from None
        check_checkpoint_shape(init, cfg.model)
        check(not cfg.model.lora_r or is_transformers_policy(cfg.model, cfg.init), "model.lora_r", cfg.model.lora_r,
              f"0 with init={cfg.init!r}, a gpt_mini checkpoint (LoRA is for transformers models; gpt_mini trains "
              "every weight)")
    # an update may share each prompt through a KV cache, which transformers drops in a checkpointed layer
    check(not (cfg.model.gradient_checkpointing and cfg.rl.update.share_prompt
               and is_transformers_policy(cfg.model, cfg.init)), "model.gradient_checkpointing", True,
          "false with rl.update.share_prompt on a transformers policy (or set rl.update.share_prompt false): "
          "transformers drops the KV cache of a checkpointed layer, and a shared-prompt update fills one")
    start = [f"start: init={cfg.init!r} is {init}"] if cfg.init else []
    if is_pretrained(cfg.model) and cfg.model.name not in KNOWN_MODELS:
        start.append(f"model: model.name={cfg.model.name!r} is {resolve_model_dir(cfg.model.name)}")
    return start + teacher + check_data(cfg, env)


def check_preference_diagnostics(cfg: TrainConfig) -> None:
    """rl.preference's checks after training (pipelines/preference_diagnostics.py) need a preference
    loss, and a shifted task the environment can build (its level, or its held-out file)."""
    pref = cfg.rl.preference
    on = [f"rl.preference.{name}" for name in ("eval_temperatures", "ood_level", "ood_path") if getattr(pref, name)]
    if not on:
        return
    check(is_preference(cfg.rl), on[0], getattr(pref, on[0].rpartition(".")[2]),
          f"unset unless rl.algo is a preference loss (rl.algo={cfg.rl.algo!r}): the checks run after a preference stage")
    ood_environment(cfg)  # ValueError naming the setting: a level for a task without levels, a missing file


def check_stages(cfg: TrainConfig, env: Environment | None = None) -> list[str]:
    """Every stage of cfg.stages checked as the run it is: its settings typed and valid, then
    check_train's checks on its own config; what they found, each line named by its stage."""
    plan = stage_plan(cfg)
    check(not cfg.model.lora_r, "model.lora_r", cfg.model.lora_r, "0 with stages: each stage starts from the full "
          "weights the one before saved (LoRA adapters are not carried from stage to stage)")
    env = check_env(cfg.env) if env is None else env
    found = []
    for index, stage in enumerate(plan):
        check_types(stage.cfg)
        stage.cfg.validate()
        try:
            stage_env = env if stage.cfg.env == cfg.env else check_env(stage.cfg.env)  # a stage's own env.* settings
        except ValueError as error:  # ConfigError is one: the task refused a setting, named here by its stage
            raise ConfigError(f"stages: {stage.name}'s env.* settings: {error}") from error
        found += [f"stage {stage.name} ({stage.kind}, {stage.steps} steps): {line}"
                  for line in check_train(stage.cfg, stage_env, stages_before=index)]
    return found
