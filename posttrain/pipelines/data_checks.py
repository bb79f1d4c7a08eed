"""The pre-run checks of a training run that read its data: the task's problems, drawn as
the run will draw them, measured in the model's own tokenizer and positions, and the
environment's own rules.

    check_data(cfg, env)      the held-out, dev and SFT sets are big enough, every prompt,
                              demonstration and rl.preference.pairs pair fits the model's positions,
                              the generation budget fits the answers the verifier reads, the
                              curated pool builds; what it found, for --dry_run
    answer_needs(...)         the tokens each answer the verifier reads takes (check_answer_budget
                              refuses a budget shorter than the longest)
    run_warnings(cfg, env)    what can run but may not mean what it seems: evaluation sets too
                              small to measure, a verifier that pays partial credit, demonstrations
                              longer than the budget; the dry run lists them, a run prints them
    check_self_judge(...)     the self-judge's labels, prompt and demonstrations fit the model
                              (a self_critique term's: critique_checks.py)
    check_vocabulary(...)     gpt_mini's character tokenizer can read every prompt and solution

They are apart from checks.py, which judges the settings themselves, because these need the
environment built and the tokenizer loaded (the slow part of the checks), and what they
refuse is a task that does not fit a model, not a setting out of range. checks.check_train
calls them once the settings have passed; nothing here calls back into checks.py.
"""

from __future__ import annotations

import dataclasses

from posttrain.config import ConfigError, MismatchConfig, TrainConfig, check
from posttrain.envs import env_family
from posttrain.data.preference import load_preference_data
from posttrain.data.preference_rows import preference_episodes
from posttrain.models import is_pretrained, policy_context
from posttrain.models.device import TORCH_DTYPES
from posttrain.models.tokenizer import CharTokenizer
from posttrain.pipelines.build import is_preference, mismatch_correction
from posttrain.pipelines.command_checks import fixed_set
from posttrain.pipelines.critique_checks import check_self_critique
from posttrain.pipelines.curation import build_pool, pool_seed, summary_line
from posttrain.pipelines.sft import demonstration_episodes, sft_judge_rows
from posttrain.rewards.judge import COMPACT_JUDGE_PROMPT_VERSION, CORRECT_YN, judge_prompt_ids, label_ids
from posttrain.rewards.self_judge import SELF_JUDGE_CRITERION
from posttrain.roles.environment import is_multi_turn
from posttrain.roles.engines.contract import example_prompt_ids
from posttrain.roles.mismatch import SamplerIsTrainer
from posttrain.eval.stats import NOISE_RULE_N
from posttrain.types import Environment, Example, Tokenizer
from posttrain.verifiers.contract import is_solved
from posttrain.verifiers.reasoning_gym_answer import EXACT_SPECS

FILE_ENVS = ("jsonl", "math", "code", "gsm8k")  # the environments that read a user's file (envs/jsonl_file.py)
# how a file gives a split more than the ~10% of its rows a hash of the prompt puts there
SPLIT_REMEDY = {
    "heldout": "a held-out file of your own (--env.heldout_path FILE: every row of it held out, env.path's rows "
               "train), or a `split` column in your file (heldout, dev or train on each row: the fractions are then "
               "yours)",
    "dev": "a `split` column in your file (dev on the rows to measure RL by, heldout or train on the others: the "
           "fractions are then yours), or a source's own validation split (envs/jsonl_file.py)",
}
# fewer held-out or dev problems than this and an evaluation says little: under 100 the noise rule
# (eval/stats.py) calls a difference of 5 points or less noise, and the reward-hacking monitor's 0.1
# fall of dev pass@1 is two standard errors at 100 dev problems (runs/monitors.py)
MIN_EVAL_PROBLEMS = NOISE_RULE_N


def check_data(cfg: TrainConfig, env: Environment) -> list[str]:
    """Draw now what the run will draw: the held-out and dev sets, SFT's demonstrations
    (each needs a reference solution), so a split too small fails here; then check that
    the longest prompt + rl.sampling.max_new_tokens, each demonstration and each pair of
    an rl.preference.pairs file fit the model's positions (read from its config, no weights),
    and that rl.sampling.max_new_tokens fits the answers the verifier reads (check_answer_budget).
    Returns what was found, one line a check, and run_warnings' lines, for --dry_run to show."""
    heldout = evaluation_set(cfg, env, "heldout_size", "heldout", cfg.heldout_size)
    dev = evaluation_set(cfg, env, "rl.dev_size", "dev", cfg.rl.dev_size)
    # no SFT stage (a start checkpoint, or sft.steps 0): no demonstrations needed
    demos = [] if cfg.init or cfg.sft.steps == 0 else fixed_set(env, "sft.num_examples", "train",
                                                                 cfg.sft.num_examples, cfg.seed)
    # a problem without a solution fails now, not after a run starts; a multi-turn demonstration
    # is measured laid out as SFT trains on it (its turns' EOS, the observations' own tokens)
    solutions = [env.solution(example) for example in demos]
    found = [f"data: {len(heldout)} held-out and {len(dev)} dev problems; " + (
        f"{len(demos)} SFT demonstrations, each with a solution" if demos else
        f"no SFT ({'init' if cfg.init else 'sft.steps 0'}), so no demonstrations are needed")]
    warned = [f"warning: {line}" for line in run_warnings(cfg, env)]
    context = policy_context(cfg.model, cfg.init)
    if context is None:
        return found + [f"sequence length: not checked for {cfg.model.name} (read only after its one-time conversion; "
                        "SmolLM2-135M has 8,192 positions)"] + warned
    positions, tokenizer = context
    check_vocabulary(tokenizer, heldout + dev + env.sample("train", 1024, seed=0), solutions)
    longer = "raise model.max_seq_len" if not (is_pretrained(cfg.model) or cfg.init) else "use a longer-context model"
    # a seeded draw of the training split; a rarer longer prompt is still refused by the rollout itself
    examples = {e.prompt: e for e in heldout + dev + env.sample("train", 1024, seed=0)}
    longest = max(len(example_prompt_ids(tokenizer, examples[prompt])) for prompt in sorted(examples, key=len)[-16:])
    budget = cfg.rl.sampling.max_new_tokens
    needs: list[tuple[int, str]] = []  # the answers the RL stage must be able to write
    if samples_to_learn(cfg, env):  # SFT's demonstrations', or the task's own solutions'
        needs = answer_needs(env, tokenizer, *((demos, solutions) if demos else reference_solutions(env, heldout + dev)))
    answer = max(needs, default=(0, ""))
    if longest >= positions:  # no max_new_tokens can help: say what the model needs
        completion = max(budget, answer[0])
        need, why = longest + completion, (
            f"the longest prompt alone is {longest} tokens, and a completion needs rl.sampling.max_new_tokens "
            f"({budget}) more" if completion == budget else
            f"the longest prompt alone is {longest} tokens, and a completion needs at least {completion} more: the "
            f"longest answer the verifier reads, {answer[1]!r}, takes {completion} {unit(tokenizer)} with its EOS, "
            f"more than rl.sampling.max_new_tokens ({budget})")
        if longer.startswith("raise"):
            check(False, "model.max_seq_len", positions, f"at least {need}: {why}; give --model.max_seq_len {need}"
                  + (f" and --rl.sampling.max_new_tokens {completion}" if completion > budget else "")
                  + " (more if a demonstration is longer)")
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
    check_answer_budget(budget, tokenizer, needs, "SFT demonstrations" if demos else "solutions of the task")
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
    found += check_self_critique(cfg, env, tokenizer, positions, examples[max(examples, key=len)])
    return found + [f"sequence length: the longest prompt ({longest} tokens) + rl.sampling.max_new_tokens ({budget}) "
                    f"= {longest + budget} of the model's {positions} positions"
                    + (f"; the longest demonstration {max(demo_lengths)}" if demos else "")] + (
        [f"answer length: the longest answer the verifier reads, {answer[1]!r}, takes {answer[0]} {unit(tokenizer)} "
         f"with its EOS, within rl.sampling.max_new_tokens ({budget})"] if needs else []) + warned


def evaluation_set(cfg: TrainConfig, env: Environment, setting: str, split: str, n: int) -> list[Example]:
    """The held-out or dev set as the run draws it (command_checks.fixed_set); a file too small
    for `n` is refused with how to give it more than its ~10% (SPLIT_REMEDY)."""
    try:
        return fixed_set(env, setting, split, n, 0)
    except ConfigError as error:
        if env_family(cfg.env.name) in FILE_ENVS:
            raise ConfigError(f"{error}; or, to measure more: {SPLIT_REMEDY[split]}") from None
        raise


def samples_to_learn(cfg: TrainConfig, env: Environment) -> bool:
    """Whether the run learns from the policy's own single-turn samples: RL steps, not pairs
    from a file (a preference loss trains on those whatever it samples), not a multi-turn
    environment (its budget is per turn, and its answer a turn among several)."""
    return cfg.rl.steps > 0 and not (is_preference(cfg.rl) and cfg.rl.preference.pairs) and not is_multi_turn(env)


def unit(tokenizer: Tokenizer) -> str:
    """What a budget counts for this tokenizer: gpt_mini's is one token a character."""
    return "characters (gpt_mini's tokenizer: one token a character)" if isinstance(tokenizer, CharTokenizer) \
        else "tokens"


def reference_solutions(env: Environment, examples: list[Example]) -> tuple[list[Example], list[str]]:
    """Up to 64 of `examples` with the task's own solution (none where the task has none: a file
    without meta.solution), for a run without SFT demonstrations."""
    pairs = []
    for example in examples[:64]:
        try:
            pairs.append((example, env.solution(example)))
        except ValueError:
            return [], []
    return [e for e, _ in pairs], [s for _, s in pairs]


def answer_needs(env: Environment, tokenizer: Tokenizer, examples: list[Example],
                 solutions: list[str]) -> list[tuple[int, str]]:
    """(tokens with EOS, text) of the answer the verifier reads in each solution: its last line
    when that line alone earns full credit (a worked solution's answer line: "Final: 34",
    "<answer>6</answer>"), else all of it. The first last line that does not earn it alone (a
    function, a grid) decides that this task's answers are whole solutions, so a sandboxed
    verifier runs at most once here."""
    needs: list[tuple[int, str]] = []
    one_line = True
    for example, solution in zip(examples, solutions):
        text = solution
        last = solution.strip().splitlines()[-1] if solution.strip() else solution
        if one_line and last != solution:
            result = env.score(example, last)
            one_line = is_solved(result["reward"], result["details"])
            text = last if one_line else solution
        needs.append((len(tokenizer.encode(text)) + 1, text))  # + EOS: a sample that ends within the budget
    return needs


def check_answer_budget(budget: int, tokenizer: Tokenizer, needs: list[tuple[int, str]], what: str) -> None:
    """Refuse a generation budget shorter than an answer the verifier must read (answer_needs):
    a sample cut before its answer closes scores 0, whatever the policy knows (reasoning-gym's
    gcd at a 16-character budget: 99% of samples cut at "<answer>2</answe", nothing learnt)."""
    need, text = max(needs, default=(0, ""))
    cut = sum(n > budget for n, _ in needs)
    check(budget >= need, "rl.sampling.max_new_tokens", budget,
          f"at least {need}: the answers the verifier reads must fit in it, and the longest of the {len(needs)} "
          f"{what}, {text!r}, takes {need} {unit(tokenizer)} with its EOS; {cut} of the {len(needs)} do not fit in "
          f"{budget}, and a sample cut before its answer closes scores 0, so RL would sample at full cost and learn "
          f"nothing from them; give --rl.sampling.max_new_tokens {need} or more")


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


def unread_mismatch(cfg: TrainConfig) -> str | None:
    """What a changed rl.mismatch setting does on a run whose sampler is the trainer: nothing
    (pipelines/build.py::mismatch_correction builds no correction there), said once."""
    mismatch, defaults = cfg.rl.mismatch, MismatchConfig()
    changed = [f"rl.mismatch.{f.name}={getattr(mismatch, f.name)!r}" for f in dataclasses.fields(mismatch)
               if f.name != "always" and getattr(mismatch, f.name) != getattr(defaults, f.name)]
    # the decision the run itself makes, from the dtype the roles will compute in
    built = mismatch_correction(mismatch, cfg.rl.sampling, TORCH_DTYPES[cfg.dtype], cfg.dist.resolved_topology())
    if not changed or not isinstance(built, SamplerIsTrainer):
        return None
    return (f"{', '.join(changed)} is not read: the sampler is the trainer here (the torch engine, float32, no "
            "batch sampled ahead), so its log-probs are the trainer's and there is nothing to correct; "
            "--rl.mismatch.always true corrects and measures anyway")


def run_warnings(cfg: TrainConfig, env: Environment) -> list[str]:
    """What can run but may not mean what it seems, one line each: evaluation sets too small to
    measure a change (evaluation_warnings), a verifier that pays partial credit (partial_credit),
    SFT demonstrations longer than the generation budget. The dry run lists them; a run prints
    them before its first step (pipelines/run.py, stages.py)."""
    warnings = evaluation_warnings(cfg, env)
    note = unread_mismatch(cfg)
    warnings += [note] if note else []
    if not is_multi_turn(env):
        note = partial_credit(env, env.fixed_set("heldout", min(16, cfg.heldout_size), seed=0))
        warnings += [note] if note else []
    context = policy_context(cfg.model, cfg.init)
    if context is None or not samples_to_learn(cfg, env) or cfg.init or cfg.sft.steps == 0:
        return warnings
    tokenizer, budget = context[1], cfg.rl.sampling.max_new_tokens
    demos = env.fixed_set("train", cfg.sft.num_examples, seed=cfg.seed)
    lengths = [len(tokenizer.encode(env.solution(example))) + 1 for example in demos]
    longer = [n for n in lengths if n > budget]
    if longer:
        warnings.append(f"{len(longer)} of the {len(demos)} SFT demonstrations are longer than rl.sampling."
                        f"max_new_tokens ({budget}), the longest {max(longer)} {unit(tokenizer)} with its EOS: SFT "
                        "teaches the policy to write them, and RL cuts each one it writes at the budget (their answer "
                        f"lines fit, or the run would be refused); give --rl.sampling.max_new_tokens {max(longer)} to "
                        "let it finish what it was taught")
    return warnings


def evaluation_warnings(cfg: TrainConfig, env: Environment) -> list[str]:
    """A held-out set (and, when RL runs, a dev set) of fewer than MIN_EVAL_PROBLEMS problems:
    what that costs, and how to have more (a small file: SPLIT_REMEDY)."""
    sets = [("heldout_size", "heldout", cfg.heldout_size, "the before/after comparison cannot tell such a change "
             "from noise")]
    if cfg.rl.steps:
        sets.append(("rl.dev_size", "dev", cfg.rl.dev_size, "the reward-hacking monitor, which fires on a 0.1 fall "
                     "of dev pass@1, fires on noise"))
    warnings = []
    for setting, split, n, cost in sets:
        if n >= MIN_EVAL_PROBLEMS:
            continue
        half = 100 * 1.96 * (0.25 / n) ** 0.5  # the 95% CI's half-width of a pass@1 near 0.5
        if env_family(cfg.env.name) in FILE_ENVS:
            held = len(env.fixed_set(split, 10 ** 9))  # a file's split gives all it holds
            more = (f"your file's {split} split holds only {held}: {SPLIT_REMEDY[split]}" if held < MIN_EVAL_PROBLEMS else
                    f"the split holds {held}: raise {setting}")
        else:
            more = f"raise {setting} to {MIN_EVAL_PROBLEMS} or more"
        warnings.append(f"{n} {split} problems ({setting}), fewer than {MIN_EVAL_PROBLEMS}: one problem moves pass@1 "
                        f"by {100 / n:.1f} points and its 95% CI is up to ±{half:.0f} points wide, so {cost}; {more}")
    return warnings


def near_misses(answer: str) -> list[str]:
    """Wrong answers a partial-credit grader pays for: its items in reverse order (word_sorting
    pays 0.2 for the right words in the wrong order), its last character dropped, the answer
    twice (reasoning-gym's default grader pays len(answer)/len(reply) when the reply holds it)."""
    separator = ", " if ", " in answer else " "
    return [separator.join(reversed(answer.split(separator))), answer[:-1], answer + answer]


def brief(text: str) -> str:
    """`text` quoted, its first 50 characters and "..." when longer."""
    return repr(text) if len(text) <= 50 else repr(text[:50]) + "..."


def partial_credit(env: Environment, examples: list[Example]) -> str | None:
    """That env's verifier pays partial credit, shown on one wrong answer it pays, with the one
    flag that pays only right answers; None when no near miss of `examples`' answers is paid
    between 0 and 1 (or the task has no solutions to write them in)."""
    # optional: an environment needs solution() only when SFT runs (pipelines/api.py::ENV_METHODS)
    solve = getattr(env, "solution", None)
    if solve is None:
        return None
    for example in examples:
        try:
            solution = solve(example)
        except ValueError:
            return None
        answer = example.expected_answer
        if not answer or answer not in solution:
            continue
        at = solution.rindex(answer)
        for miss in near_misses(answer):
            if not miss or miss == answer:
                continue
            reward = env.score(example, solution[:at] + miss + solution[at + len(answer):])["reward"]
            if 0 < reward < 1:
                exact = EXACT_SPECS.get(env.spec_version)
                return (f"partial credit: {env.spec_version} pays {reward:.2g} for the wrong answer {brief(miss)} "
                        f"(the answer is {brief(answer)}); held-out pass@1 counts full credit only, but RL trains on "
                        "the reward, and a policy can learn to farm partial credit (the reward rising while pass@1 "
                        "falls); "
                        + (f"to pay only right answers: --env.spec_version {exact}" if exact else
                           "to pay only right answers, choose a verifier that does (env.spec_version)"))
    return None
