"""Every check that runs before a job starts, so that a setting the library cannot use is
refused with its name and what to do, before any compute is spent.

    check_config(cfg)       every setting's type (config_checks.py) and value (cfg.validate()),
                            then what only the library can judge: names that must exist,
                            files that must be readable, parameters an algorithm must accept,
                            splits big enough, prompts and demonstrations that fit the model,
                            placements the machine offers, and settings under which RL cannot
                            learn. Returns what a training run's checks found (--dry_run).

The objects themselves are built by pipelines/build.py, which these checks call to build an
algorithm or a reward once and see it accepted.
"""

from __future__ import annotations

from posttrain.algorithms import ALGORITHMS
from posttrain.algorithms.preference import PREFERENCE_LOSSES, make_preference_loss
from posttrain.command_configs import PrmConfig
from posttrain.config import ConfigError, RLConfig, TrainConfig, check
from posttrain.config_checks import check_types
from posttrain.data.preference import load_preference_data
from posttrain.data.preference_rows import preference_episodes
from posttrain.models import (
    MODELS,
    check_checkpoint_shape,
    is_pretrained,
    is_transformers_policy,
    policy_context,
    read_model_dir,
)
from posttrain.models.device import resolve_device
from posttrain.models.hf import resolve_model_dir
from posttrain.models.smollm2 import KNOWN_MODELS
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import is_preference, make_algorithm, reward_terms
from posttrain.pipelines.command_checks import (check_bon, check_env, check_eval, check_placement, check_prm,
                                                check_search, check_think, check_winrate, fixed_set)
from posttrain.pipelines.curation import build_pool, pool_seed, summary_line
from posttrain.pipelines.sft import demonstration_episodes, sft_judge_rows
from posttrain.pipelines.stage_plan import stage_plan
from posttrain.rewards.judge import COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, judge_prompt_ids, label_ids
from posttrain.rewards.reward_model import check_reward_model_dir
from posttrain.rewards.self_judge import SELF_JUDGE_CRITERION
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.rollout import example_prompt_ids
from posttrain.runs.trackers import check_trackers
from posttrain.scoring_configs import BonConfig, EvalConfig, SearchConfig, ThinkConfig, VerifyConfig, WinrateConfig
from posttrain.types import PreferencePair


def check_config(cfg, env=None) -> list[str]:
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
        {EvalConfig: check_eval, BonConfig: check_bon, PrmConfig: check_prm, SearchConfig: check_search,
         VerifyConfig: check_search, ThinkConfig: check_think, WinrateConfig: check_winrate}[type(cfg)](cfg)
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
    preference = is_preference(rl)
    if rl.self_reward:
        check(preference and not rl.pairs, "rl.self_reward", rl.self_reward,
              "false unless rl.algo is a preference loss whose pairs are built from the policy's samples (no "
              "rl.pairs file): the policy judges its own samples into pairs, and an RL algorithm or a fixed file "
              "has none to judge")
    if preference:
        loss = make_preference_loss(rl.algo, **rl.algo_params)  # raises, listing the valid fields
        check(not loss.paired or rl.micro_batch_size % 2 == 0, "rl.micro_batch_size", rl.micro_batch_size,
              f"an even number with {rl.algo} (a pair's two rows must share a micro-batch), or 0")
        if rl.pairs:
            records = load_preference_data(rl.pairs, rl.pairs_columns)  # an unreadable file fails now, not after SFT
            unscored = [i for i, r in enumerate(records) if not isinstance(r, PreferencePair) or r.score_chosen is None]
            check(loss.gap_weighting == "none" or not unscored, f"{rl.algo}.gap_weighting", loss.gap_weighting,
                  f"'none' for rl.pairs={rl.pairs!r}: {len(unscored)} of its {len(records)} records (the first: "
                  f"record {unscored[0] if unscored else 0}) carry no score_chosen / score_rejected, and gap "
                  "weighting weighs each pair by their difference; add the columns (map yours with "
                  "--rl.pairs_columns 'score_chosen=COLUMN,score_rejected=COLUMN') or weight no pair")
    else:
        algo = make_algorithm(rl)
    check_can_learn(rl, None if preference else algo)
    check(not (preference and rl.curation.enabled()), "rl.curation.pool_size", rl.curation.pool_size,
          f"0 with a preference loss (rl.algo={rl.algo!r}): curation chooses the prompts of the RL stage, and a "
          "preference loss trains on pairs (rl.pairs, or the samples of rl.pair_prompts prompts)")
    try:  # imports its functions and reads their signatures: a bad term fails before the run exists
        reward_terms(rl)
    except ValueError as error:
        raise ConfigError(f"rl.reward={rl.reward!r} is not allowed: {error}") from None
    if rl.online_rounds > 1:
        check(preference and not rl.pairs, "rl.online_rounds", rl.online_rounds,
              "1 unless rl.algo is a preference loss whose pairs the verifier builds (no rl.pairs file: "
              "a fixed file cannot be resampled from the current policy)")
        check(rl.online_rounds <= min(rl.steps, rl.pair_prompts), "rl.online_rounds", rl.online_rounds,
              f"at most rl.steps={rl.steps} and rl.pair_prompts={rl.pair_prompts} "
              "(every round needs a step and a prompt)")
    if rl.refresh_reference:
        check(rl.online_rounds > 1 and preference and loss.uses_reference, "rl.refresh_reference",
              rl.refresh_reference, "false unless rl.online_rounds > 1 and rl.algo is a preference loss with a "
              "reference (dpo, ipo, kto): there is no next round, or no reference, to refresh")
    if rl.rm.path:
        try:
            for directory in rl.rm.paths():
                check_reward_model_dir(directory)
        except ValueError as error:
            raise ConfigError(f"rl.rm.path={rl.rm.path!r} is not allowed: {error}") from None
        if preference:
            check(not rl.pairs, "rl.rm.path", rl.rm.path, "'' with rl.pairs: a pairs file is already ranked; the "
                  "reward model ranks the policy's own samples when there is no file")
    if rl.length_reward > 0:
        check_length_reward(rl, preference)
    if rl.kl_target > 0:
        check(not preference, "rl.kl_target", rl.kl_target,
              "0 for a preference loss (its beta already sets how close to the reference it stays)")
        check(algo.kl_coef > 0, "rl.kl_target", rl.kl_target,
              f"0 unless the algorithm has a KL term: set --{rl.algo}.kl_coef 0.04 "
              f"({rl.algo} has kl_coef={algo.kl_coef!r}; the controller multiplies it)")


def check_length_reward(rl: RLConfig, preference: bool) -> None:
    """Kimi's length reward compares the K right-or-wrong samples of one prompt: refuse the
    settings where there is no such group, no verdict, or no step it would be paid on."""
    setting = f"with rl.length_reward={rl.length_reward:g}"
    check(not preference, "rl.algo", rl.algo, f"an RL algorithm {setting}: a preference loss trains on pairs, and "
          "the length reward is paid to samples against their group in the RL loop; set rl.length_reward 0")
    check(not rl.rm.path, "rl.rm.path", rl.rm.path, f"'' {setting}: the length reward pays right and wrong answers "
          "differently, and a reward model's score is no verdict; set rl.length_reward 0 to train on the model")
    check(rl.samples_per_prompt >= 2, "rl.samples_per_prompt", rl.samples_per_prompt,
          f"at least 2 {setting}: it ranks a sample's length among its prompt's samples, and alone it is always 0")
    check(rl.length_reward_start < rl.steps, "rl.length_reward_start", rl.length_reward_start,
          f"less than rl.steps={rl.steps} {setting}: it would never be paid")


def check_can_learn(rl: RLConfig, algo) -> None:
    """Refuse settings under which the RL stage (algo; None for a preference loss) would
    sample at full cost and learn nothing. Group baselines need K >= 2 samples per prompt:
    a group of one is its own baseline, so every advantage is exactly 0. Temperature 0 is
    refused for every algorithm, not warned about: greedy decoding makes a prompt's K
    samples identical (zero advantage under a group baseline, no pair for a preference
    loss), and for the rest the policy only ever tries its current best answer, so there
    is nothing to compare it with, and the score-function gradient assumes samples from π."""
    if rl.steps == 0 or (algo is None and rl.pairs):
        return  # nothing is trained, or the pairs come from a file: the policy's samples teach nothing
    settings = f"rl.algo={rl.algo!r}" + (f" with rl.algo_params={rl.algo_params}" if rl.algo_params else "")
    if algo is None:
        check(rl.samples_per_prompt >= 2, "rl.samples_per_prompt", rl.samples_per_prompt,
              f"at least 2 with {settings} and no rl.pairs file: a pair is a correct and an incorrect sample of one "
              "prompt, and one sample makes no pair; use 8 (the default) or pass rl.pairs FILE")
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
    check(cfg.rl.reward in ("accuracy", "rubric") and cfg.rl.length_penalty == 0 and cfg.rl.length_reward == 0
          and not cfg.rl.rm.path, "rl.reward", cfg.rl.reward,
          f"'accuracy' (or 'rubric'), with no rl.length_penalty, rl.length_reward or rl.rm.path, for {algo}: its "
          "implicit PRM learns p(correct) from the reward, so the reward must be an outcome label in [0, 1]")




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


def check_train(cfg: TrainConfig, env=None) -> list[str]:
    """The checks of a training run; what they found, one line each (check_data's, and the
    model directory a name resolved to), for --dry_run to show."""
    if cfg.stages:
        return check_stages(cfg, env)
    check_trackers(cfg.trackers())  # a missing tracker library: before compare's root directory too
    check_placement(cfg.device, cfg.dtype, cfg.dist)
    check_int8_sampling(cfg)
    check_model(cfg)
    check_rl(cfg.rl)
    if env is None:
        env = check_env(cfg.env)  # the slow one (a file's solutions are scored): last of the three
    check_multi_turn(cfg, env)
    check_implicit_prm(cfg)
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
    start = [f"start: init={cfg.init!r} is {init}"] if cfg.init else []
    if is_pretrained(cfg.model) and cfg.model.name not in KNOWN_MODELS:
        start.append(f"model: model.name={cfg.model.name!r} is {resolve_model_dir(cfg.model.name)}")
    return start + check_data(cfg, env)


def check_stages(cfg: TrainConfig, env=None) -> list[str]:
    """Every stage of cfg.stages checked as the run it is: its settings typed and valid, then
    check_train's checks on its own config; what they found, each line named by its stage."""
    plan = stage_plan(cfg)
    check(not cfg.model.lora_r, "model.lora_r", cfg.model.lora_r, "0 with stages: each stage starts from the full "
          "weights the one before saved (LoRA adapters are not carried from stage to stage)")
    env = check_env(cfg.env) if env is None else env
    found = []
    for stage in plan:
        check_types(stage.cfg)
        stage.cfg.validate()
        found += [f"stage {stage.name} ({stage.kind}, {stage.steps} steps): {line}" for line in check_train(stage.cfg, env)]
    return found




def check_data(cfg: TrainConfig, env) -> list[str]:
    """Draw now what the run will draw: the held-out and dev sets, SFT's demonstrations
    (each needs a reference solution), so a split too small fails here; then check that
    the longest prompt + rl.sampling.max_new_tokens, each demonstration and each pair of
    an rl.pairs file fit the model's positions (read from its config, no weights).
    Returns what was found, one line a check, for --dry_run to show."""
    heldout = fixed_set(env, "heldout_size", "heldout", cfg.heldout_size, 0)
    dev = fixed_set(env, "rl.dev_size", "dev", cfg.rl.dev_size, 0)
    # no SFT stage (a start checkpoint, or sft.steps 0): no demonstrations needed
    demos = [] if cfg.init or cfg.sft.steps == 0 else fixed_set(env, "sft.num_examples", "train",
                                                                 cfg.sft.num_examples, cfg.seed)
    # a problem without a solution fails now, not after a run starts; a multi-turn demonstration
    # is measured laid out as SFT trains on it (its turns' EOS, the observations' own tokens)
    solutions = [env.solution(example) for example in demos]
    found = [f"data: {len(heldout)} held-out and {len(dev)} dev problems; " + (
        f"{len(demos)} SFT demonstrations, each with a solution" if demos else
        f"no SFT ({'init' if cfg.init else 'sft.steps 0'}), so no demonstrations are needed")]
    context = policy_context(cfg.model, cfg.init)
    if context is None:
        return found + [f"sequence length: not checked for {cfg.model.name} (read only after its one-time conversion; "
                        "SmolLM2-135M has 8,192 positions)"]
    positions, tokenizer = context
    check_vocabulary(tokenizer, heldout + dev + env.sample("train", 1024, seed=0), solutions)
    longer = "raise model.max_seq_len" if not (is_pretrained(cfg.model) or cfg.init) else "use a longer-context model"
    # a seeded draw of the training split; a rarer longer prompt is still refused by the rollout itself
    examples = {e.prompt: e for e in heldout + dev + env.sample("train", 1024, seed=0)}
    longest = max(len(example_prompt_ids(tokenizer, examples[prompt])) for prompt in sorted(examples, key=len)[-16:])
    budget = cfg.rl.sampling.max_new_tokens
    if longest >= positions:  # no max_new_tokens can help: say what the model needs
        need, why = longest + budget, (f"the longest prompt alone is {longest} tokens, and a completion needs "
                                       f"rl.sampling.max_new_tokens ({budget}) more")
        if longer.startswith("raise"):
            check(False, "model.max_seq_len", positions, f"at least {need}: {why}; give --model.max_seq_len {need} "
                  "(more if a demonstration is longer)")
        check(False, "model.name", cfg.model.name, f"a model with at least {need} positions: {why}; {longer}")
    check(longest + budget <= positions, "rl.sampling.max_new_tokens", budget,
          f"at most {positions - longest}: the longest prompt ({longest} tokens) + max_new_tokens must fit the "
          f"model's {positions} positions; lower it, or {longer}"
          + (f" to at least {longest + budget}" if longer.startswith("raise") else ""))
    demo_lengths = []
    multi_turn = is_multi_turn(env)
    for example, solution in zip(demos, solutions):
        response = (len(demonstration_episodes(env, tokenizer, [example])[0].response_ids) if multi_turn
                    else len(tokenizer.encode(solution)) + 1)  # + EOS
        length = len(example_prompt_ids(tokenizer, example)) + response
        demo_lengths.append(length)
        if length > positions:
            what = "prompt, turns, observations" if multi_turn else "prompt, solution, EOS"
            raise ConfigError(f"sft.num_examples: the demonstration for {example.prompt[:60]!r} is {length} tokens "
                              f"({what}), more than the model's {positions} positions; {longer} or "
                              "shorten its " + ("demonstration" if multi_turn else "meta.solution"))
    if cfg.rl.curation.enabled():  # the pool as the run will build it: big enough, screened, labelled
        fixed_set(env, "rl.curation.pool_size", "train", cfg.rl.curation.pool_size, pool_seed(cfg))
        found.append(f"curation: {summary_line(build_pool(cfg, env))}")
    if is_preference(cfg.rl) and cfg.rl.pairs:
        try:
            preference_episodes(load_preference_data(cfg.rl.pairs, cfg.rl.pairs_columns), tokenizer, positions)
        except ValueError as error:
            raise ConfigError(f"rl.pairs={cfg.rl.pairs!r}: {error}") from None
    found += check_self_judge(cfg, env, tokenizer, positions, examples[max(examples, key=len)], bool(demos))
    return found + [f"sequence length: the longest prompt ({longest} tokens) + rl.sampling.max_new_tokens ({budget}) "
                    f"= {longest + budget} of the model's {positions} positions"
                    + (f"; the longest demonstration {max(demo_lengths)}" if demos else "")]


def check_self_judge(cfg: TrainConfig, env, tokenizer, positions: int, longest_prompt, sft: bool) -> list[str]:
    """rl.self_reward and sft.judge_demos: the judge's Y/N labels are single tokens of this
    model, its compact prompt with a whole sample fits the model, judge demonstrations have an
    SFT stage to join and fit too, and gpt_mini, which cannot read a judge prompt untaught, is
    taught (sft.judge_demos) unless it starts from a checkpoint. What was found, for --dry_run."""
    if not (cfg.rl.self_reward or cfg.sft.judge_demos):
        return []
    try:
        label_ids(tokenizer, CORRECT_YN)
    except ValueError as error:
        raise ConfigError(f"rl.self_reward / sft.judge_demos: the judge's verdict is one token: {error}") from None
    found = []
    if cfg.sft.judge_demos:
        check(sft, "sft.judge_demos", cfg.sft.judge_demos, "0 without an SFT stage (--init, or sft.steps 0): judge "
              "demonstrations are SFT rows; make the SFT checkpoint with them first and --init from it")
        rows = sft_judge_rows(cfg, env, tokenizer)
        longest = max(len(e.prompt_ids) + len(e.response_ids) for e in rows)
        check(longest <= positions, "sft.judge_demos", cfg.sft.judge_demos,
              f"0 for this model: the longest judge demonstration is {longest} tokens, more than its {positions} "
              "positions; raise model.max_seq_len")
        found.append(f"judge demonstrations: {len(rows)} rows ({cfg.sft.judge_demos} problems, Y and N), the "
                     f"longest {longest} tokens")
    if cfg.rl.self_reward and is_preference(cfg.rl):
        check(bool(cfg.init) or is_pretrained(cfg.model) or cfg.sft.judge_demos > 0, "sft.judge_demos",
              cfg.sft.judge_demos, "a positive number of problems with rl.self_reward on gpt_mini (e.g. 300): a "
              "character-level model trained on the task alone never saw the judge's question and answers it at "
              "chance; or --init a checkpoint whose SFT had them")
        budget = cfg.rl.sampling.max_new_tokens
        judged = len(judge_prompt_ids(tokenizer, CORRECT_YN, *SELF_JUDGE_CRITERION, longest_prompt, "",
                                      COMPACT_JUDGE_PROMPT_VERSION)) + budget + 1  # + the sample, + the verdict
        check(judged <= positions, "rl.sampling.max_new_tokens", budget,
              f"at most {budget - (judged - positions)} with rl.self_reward: the judge reads the prompt, a sample of "
              f"up to max_new_tokens and its question ({judged} tokens in all) within the model's {positions} "
              "positions, and a longer judge prompt is no verdict (scored 0)")
        found.append(f"self-judge: the longest judge prompt {judged} of the model's {positions} positions")
    return found


def check_vocabulary(tokenizer, examples: list, solutions: list[str]) -> None:
    """A character-level tokenizer (gpt_mini's: printable ASCII and newline) turns any other
    character into <unk>, so the model would read a prompt it cannot tell apart from others
    and could never write such an answer: refuse the task, naming the characters."""
    if not isinstance(tokenizer, CharTokenizer):
        return  # subword tokenizers fall back to bytes: every character survives
    texts = [("prompt", e.prompt) for e in examples] + [("demonstration", text) for text in solutions]
    for what, text in texts:
        unknown = sorted(set(text) - set(tokenizer.stoi))
        if unknown:
            raise ConfigError(f"env.name: a {what} holds characters gpt_mini's character tokenizer cannot encode "
                              f"({', '.join(map(repr, unknown[:8]))}) in {text[:80]!r}: a character-level model "
                              "reads printable ASCII and newlines only; choose another task, or a pretrained model "
                              "(--model.name smollm2-135m)")














def check_multi_turn(cfg: TrainConfig, env) -> None:
    """A multi-turn environment's episodes come back scored by the environment (roles/agent.py):
    refuse the reward settings that would otherwise be ignored."""
    if not is_multi_turn(env):
        return
    check(not is_preference(cfg.rl), "rl.algo", cfg.rl.algo,
          f"an RL algorithm for the multi-turn environment {cfg.env.name!r}: the preference losses train on "
          "pairs of single completions, and a multi-turn episode is not one yet")
    check(cfg.rl.reward == "accuracy" and not cfg.rl.rm.path and cfg.rl.length_penalty == 0
          and cfg.rl.length_reward == 0, "rl.reward", cfg.rl.reward,
          f"'accuracy', with no rl.rm.path, rl.length_penalty or rl.length_reward, for the multi-turn environment "
          f"{cfg.env.name!r}: its reward is the one its last turn gives (TurnResult.reward), so a reward stacked on "
          "one completion's text would be ignored; put the terms in the environment's step instead")
    thinking = getattr(env, "thinking", "keep_all")  # the protocol's optional setting (roles/agent.py)
    if thinking != "keep_all":
        check(make_algorithm(cfg.rl).accepts_turn_rows, "rl.algo", cfg.rl.algo,
              f"an algorithm that trains an episode as one row per model turn, for env.thinking={thinking!r} "
              f"(grpo, dr_grpo, cispo, rloo, reinforce, or dapo with --dapo.overlong_cache 0): under {thinking} each "
              "turn is sampled in its own context, and this algorithm's advantages or loss read a row as a whole "
              "episode (a critic's returns, reward-to-go, a length penalty, a sequence ratio); or use "
              "--env.thinking keep_all")

