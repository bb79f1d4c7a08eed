"""The pre-run check of a self_critique reward term the policy judges (rewards/self_critique.py):
what data_checks.py checks of the self-judge, for the critic. It needs the tokenizer and the
model's positions, so data_checks.check_data calls it once they are loaded.

    check_self_critique(...)   the verdict's labels are single tokens of the policy; gpt_mini is
                               taught to judge (sft.judge_demos) or starts from a checkpoint; the
                               longest critique (prompt, a whole response, verdict) fits its positions
"""

from __future__ import annotations

from posttrain.config import ConfigError, TrainConfig, check
from posttrain.models import is_pretrained
from posttrain.pipelines.build import REWARD_PRESETS
from posttrain.rewards.agentic import AGENTIC_PRESETS
from posttrain.rewards.judge import label_ids
from posttrain.rewards.self_critique import POLICY_JUDGE, SelfCritique, critique_question, longest_critique
from posttrain.rewards.user_function import parse_reward
from posttrain.roles.environment import is_multi_turn
from posttrain.types import Environment, Example, Tokenizer


def check_self_critique(cfg: TrainConfig, env: Environment, tokenizer: Tokenizer, positions: int,
                        longest_prompt: Example) -> list[str]:
    """Refuse, naming the setting, a self_critique term the policy cannot judge; what was found, for --dry_run."""
    terms = parse_reward(cfg.rl.reward.terms, {**REWARD_PRESETS, **AGENTIC_PRESETS, "rm": lambda: []})
    if cfg.rl.reward.judge != POLICY_JUDGE or not any(isinstance(term, SelfCritique) for _, term in terms):
        return []
    try:
        label_ids(tokenizer, critique_question(tokenizer)[0])
    except ValueError as error:
        raise ConfigError(f"rl.reward.judge='policy' cannot give the self_critique verdict: {error}; pass a judge "
                          "model with --rl.reward.judge (smollm2-135m, or a gpt_mini checkpoint)") from None
    # measured (docs/guides/your-task.md): an SFT gpt_mini never taught the question puts ~0% of its
    # next-token probability on Y and N, so every judgement is refused and the term pays 0 to every sample
    check(bool(cfg.init) or is_pretrained(cfg.model) or cfg.sft.judge_demos > 0, "sft.judge_demos",
          cfg.sft.judge_demos, "a positive number of problems with a self_critique term the policy judges on gpt_mini "
          "(e.g. 1000): a character-level model trained on the task alone never saw the judge's question, and its "
          "every judgement is refused (scored 0); or --init a checkpoint whose SFT had them, or --rl.reward.judge DIRECTORY")
    response = env.max_total_tokens if is_multi_turn(env) else cfg.rl.sampling.max_new_tokens  # an episode: its transcript
    judged = longest_critique(tokenizer, longest_prompt, response)
    check(judged <= positions, "rl.reward.judge", cfg.rl.reward.judge,
          f"a judge model with at least {judged} positions, or shorter responses: the policy critiques the prompt and "
          f"a response of up to {response} tokens in {judged} tokens, more than its {positions} positions, and a "
          "judgement that does not fit scores 0")
    return [f"self-critique: the longest judge prompt {judged} of the model's {positions} positions"]
