"""The pre-run checks of a training run that read its data: the task's problems, drawn as
the run will draw them, measured in the model's own tokenizer and positions, and the
environment's own rules.

    check_data(cfg, env)      the held-out, dev and SFT sets are big enough, every prompt,
                              demonstration and rl.preference.pairs pair fits the model's positions,
                              the curated pool builds; what it found, for --dry_run
    check_self_judge(...)     the self-judge's labels, prompt and demonstrations fit the model
    check_vocabulary(...)     gpt_mini's character tokenizer can read every prompt and solution
    check_multi_turn(cfg, env) the reward and algorithm settings a multi-turn environment accepts

They are apart from checks.py, which judges the settings themselves, because these need the
environment built and the tokenizer loaded (the slow part of the checks), and what they
refuse is a task that does not fit a model, not a setting out of range. checks.check_train
calls them once the settings have passed; nothing here calls back into checks.py.
"""

from __future__ import annotations

from posttrain.config import ConfigError, TrainConfig, check
from posttrain.data.preference import load_preference_data
from posttrain.data.preference_rows import preference_episodes
from posttrain.models import is_pretrained, policy_context
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import is_preference, make_algorithm
from posttrain.pipelines.command_checks import fixed_set
from posttrain.pipelines.curation import build_pool, pool_seed, summary_line
from posttrain.pipelines.sft import demonstration_episodes, sft_judge_rows
from posttrain.rewards.judge import COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, judge_prompt_ids, label_ids
from posttrain.rewards.self_judge import SELF_JUDGE_CRITERION
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.types import Environment, Example, Tokenizer


def check_data(cfg: TrainConfig, env: Environment) -> list[str]:
    """Draw now what the run will draw: the held-out and dev sets, SFT's demonstrations
    (each needs a reference solution), so a split too small fails here; then check that
    the longest prompt + rl.sampling.max_new_tokens, each demonstration and each pair of
    an rl.preference.pairs file fit the model's positions (read from its config, no weights).
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
    if is_preference(cfg.rl) and cfg.rl.preference.pairs:
        try:
            pairs = load_preference_data(cfg.rl.preference.pairs, cfg.rl.preference.pairs_columns)
            preference_episodes(pairs, tokenizer, positions)
        except ValueError as error:
            raise ConfigError(f"rl.preference.pairs={cfg.rl.preference.pairs!r}: {error}") from None
    found += check_self_judge(cfg, env, tokenizer, positions, examples[max(examples, key=len)], bool(demos))
    return found + [f"sequence length: the longest prompt ({longest} tokens) + rl.sampling.max_new_tokens ({budget}) "
                    f"= {longest + budget} of the model's {positions} positions"
                    + (f"; the longest demonstration {max(demo_lengths)}" if demos else "")]


def check_self_judge(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer, positions: int, longest_prompt: Example,
                     sft: bool) -> list[str]:
    """rl.preference.self_reward and sft.judge_demos: the judge's Y/N labels are single tokens of this
    model, its compact prompt with a whole sample fits the model, judge demonstrations have an
    SFT stage to join and fit too, and gpt_mini, which cannot read a judge prompt untaught, is
    taught (sft.judge_demos) unless it starts from a checkpoint. What was found, for --dry_run."""
    if not (cfg.rl.preference.self_reward or cfg.sft.judge_demos):
        return []
    try:
        label_ids(tokenizer, CORRECT_YN)
    except ValueError as error:
        raise ConfigError(f"rl.preference.self_reward / sft.judge_demos: the judge's verdict is one token: "
                          f"{error}") from None
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
    if cfg.rl.preference.self_reward and is_preference(cfg.rl):
        check(bool(cfg.init) or is_pretrained(cfg.model) or cfg.sft.judge_demos > 0, "sft.judge_demos",
              cfg.sft.judge_demos, "a positive number of problems with rl.preference.self_reward on gpt_mini (e.g. "
              "300): a character-level model trained on the task alone never saw the judge's question and answers it at "
              "chance; or --init a checkpoint whose SFT had them")
        budget = cfg.rl.sampling.max_new_tokens
        judged = len(judge_prompt_ids(tokenizer, CORRECT_YN, *SELF_JUDGE_CRITERION, longest_prompt, "",
                                      COMPACT_JUDGE_PROMPT_VERSION)) + budget + 1  # + the sample, + the verdict
        check(judged <= positions, "rl.sampling.max_new_tokens", budget,
              f"at most {budget - (judged - positions)} with rl.preference.self_reward: the judge reads the prompt, a "
              f"sample of up to max_new_tokens and its question ({judged} tokens in all) within the model's {positions} "
              "positions, and a longer judge prompt is no verdict (scored 0)")
        found.append(f"self-judge: the longest judge prompt {judged} of the model's {positions} positions")
    return found


def check_vocabulary(tokenizer: Tokenizer, examples: list[Example], solutions: list[str]) -> None:
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


def check_multi_turn(cfg: TrainConfig, env: Environment) -> None:
    """A multi-turn environment's episodes come back scored by the environment (roles/agent.py):
    refuse the reward settings that would otherwise be ignored."""
    if not is_multi_turn(env):
        return
    check(not is_preference(cfg.rl), "rl.algo", cfg.rl.algo,
          f"an RL algorithm for the multi-turn environment {cfg.env.name!r}: the preference losses train on "
          "pairs of single completions, and a multi-turn episode is not one yet")
    check(cfg.rl.reward.terms == "accuracy" and not cfg.rl.rm.path and cfg.rl.reward.length_penalty == 0
          and cfg.rl.reward.length_reward == 0, "rl.reward.terms", cfg.rl.reward.terms,
          f"'accuracy', with no rl.rm.path, rl.reward.length_penalty or rl.reward.length_reward, for the multi-turn "
          f"environment {cfg.env.name!r}: its reward is the one its last turn gives (TurnResult.reward), so a reward stacked on "
          "one completion's text would be ignored; put the terms in the environment's step instead")
    thinking = getattr(env, "thinking", "keep_all")  # the protocol's optional setting (roles/agent.py)
    if thinking != "keep_all":
        check(make_algorithm(cfg.rl).accepts_turn_rows, "rl.algo", cfg.rl.algo,
              f"an algorithm that trains an episode as one row per model turn, for "
              f"env.tool_arithmetic.thinking={thinking!r} (grpo, dr_grpo, cispo, rloo, reinforce, or dapo with --dapo.overlong_cache 0): under {thinking} each "
              "turn is sampled in its own context, and this algorithm's advantages or loss read a row as a whole "
              "episode (a critic's returns, reward-to-go, a length penalty, a sequence ratio); or use "
              "--env.tool_arithmetic.thinking keep_all")
