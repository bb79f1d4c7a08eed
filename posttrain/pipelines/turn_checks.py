"""The settings a multi-turn environment accepts (roles/agent.py runs its episodes): the
reward stack on an episode's verdict, the algorithms that train a turn as a row, and the
agentic reward terms only where a tool environment records calls.

    check_multi_turn(cfg, env)   refuses, naming the setting, what cannot read an episode
    turn_row_algorithms()        the registered algorithms that train one row per model turn

Apart from data_checks.py, which measures the task's data against the model; checks.check_train
calls both once the settings have passed.
"""

from __future__ import annotations

from posttrain.algorithms import ALGORITHMS
from posttrain.config import TrainConfig, check
from posttrain.envs.tool_env import ToolEnvironment
from posttrain.pipelines.build import REWARD_PRESETS, is_preference, make_algorithm
from posttrain.rewards.agentic import AGENTIC_PRESETS, TOOL_TERMS
from posttrain.rewards.user_function import parse_reward
from posttrain.roles.environment import is_multi_turn
from posttrain.types import Environment


def turn_row_algorithms() -> list[str]:
    """The algorithms whose every instance trains a turn as a row (a class-level True; DAPO's
    depends on its overlong setting, so it is named apart where it can)."""
    return [name for name, algorithm in ALGORITHMS.items() if algorithm.accepts_turn_rows is True]


def check_multi_turn(cfg: TrainConfig, env: Environment) -> None:
    """The agent loop stacks rl.reward.terms on a multi-turn episode's verdict (roles/agent.py): refuse
    what cannot read an episode, and agentic terms (rewards/agentic.py) without a tool environment."""
    # the presets name the terms; "rm" would load a reward model, and is no tool term
    terms = parse_reward(cfg.rl.reward.terms, {**REWARD_PRESETS, **AGENTIC_PRESETS, "rm": lambda: []})
    tools = [term.name for _, term in terms if isinstance(term, TOOL_TERMS)]
    check(not tools or isinstance(env, ToolEnvironment), "rl.reward.terms", cfg.rl.reward.terms,
          f"terms without {tools} for env.name={cfg.env.name!r}: they read the tool calls a multi-turn tool "
          "environment records (env.name tool_arithmetic or search_qa), and this one records none")
    if not is_multi_turn(env):
        return
    where = f"for the multi-turn environment {cfg.env.name!r}"
    check(not is_preference(cfg.rl), "rl.algo", cfg.rl.algo, f"an RL algorithm {where}: the preference losses train "
          "on pairs of single completions, and a multi-turn episode is not one yet")
    check(not cfg.rl.rm.path, "rl.rm.path", cfg.rl.rm.path,
          f"'' {where}: a reward model learned from single completions (posttrain rlhf), and an episode's "
          "transcript, tool observations and all, is not what it was trained to score; stack rl.reward.terms on the "
          "environment's verdict instead (e.g. 'accuracy + 0.2*tool_validity + 0.1*rubric')")
    check(cfg.rl.reward.length_penalty == 0 and cfg.rl.reward.length_reward == 0, "rl.reward.length_penalty",
          f"{cfg.rl.reward.length_penalty:g} (rl.reward.length_reward {cfg.rl.reward.length_reward:g})",
          f"0, and rl.reward.length_reward 0, {where}: the length terms price the tokens the policy writes, and an "
          "episode's response holds the environment's observations too (Kimi's length reward reads the response "
          "ids, tool results included); charge steps with --rl.reward.terms 'accuracy + 0.05*call_cost' instead")
    thinking = getattr(env, "thinking", "keep_all")  # the protocol's optional setting (roles/agent.py)
    if thinking != "keep_all":
        check(make_algorithm(cfg.rl).accepts_turn_rows, "rl.algo", cfg.rl.algo,
              f"an algorithm that trains an episode as one row per model turn, for "
              f"env.tool_arithmetic.thinking={thinking!r} ({', '.join(turn_row_algorithms())}, or dapo with "
              f"--dapo.overlong_cache 0): under {thinking} each "
              "turn is sampled in its own context, and this algorithm's advantages or loss read a row as a whole "
              "episode (a critic's returns, reward-to-go, a length penalty, a sequence ratio); or use "
              "--env.tool_arithmetic.thinking keep_all")
