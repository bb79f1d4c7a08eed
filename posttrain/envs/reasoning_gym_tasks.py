"""Any reasoning-gym task (about 100 procedural generators, each with its own grader) as
an environment: `--env.name reasoning_gym:chain_sum`.

    prompt:      "State the final answer to the following arithmetic problem: 4 - 1 - 7 =\\n"
                 "Put the answer in <answer></answer>.\\n"
    completion:  "<answer>-4</answer>"       (the SFT demonstration: the item's own answer)
    scored by:   reasoning_gym/answer-tag-v1, the task's score_answer (verifiers/reasoning_gym_answer.py),
                 or its exact variant (--env.spec_version reasoning_gym/answer-tag-exact-v1): see there
                 why partial credit can be a reward hack

The problems. reasoning-gym builds item i of a dataset from its seed and i, so a pool of
`pool_size` items with a fixed `seed` is the same on every machine and every run. Items
are generated on first use and kept, so a run pays only for the ones it touches.

The splits. An item's split is a pure function of its prompt, through sha256 into 100
buckets (the arithmetic task's rule, envs/arithmetic.py): about 80% train, 10% dev, 10%
held-out, and a question that the generator repeats at two indices lands in one split
only. So a held-out problem is never a training problem, whatever the pool size or seed.
Small tasks (chain_sum with two one-digit terms has about 200 distinct questions) repeat a
lot: `fixed_set` lists distinct problems and says how many a split holds when asked for more.

The task's settings are reasoning-gym's own config fields, given as a JSON object
(`--env.reasoning_gym.task_config '{"min_terms": 2, "max_terms": 3}'`); an unknown field is refused with
the task's list. The answer line is reasoning-gym's `<answer>` convention, not `Final:`,
because many of its answers are not integers and some span lines (a grid, a list).

Worked steps (`worked_steps=True`, `--env.reasoning_gym.worked_steps true`). reasoning-gym items carry
their answer and the facts it was made from (`metadata`), never a worked solution, and a
small model taught only the answer has no chain of thought to learn (docs/guides/your-task.md, "External
tasks": gpt_mini stayed below 10% on chain_sum). For the tasks in STEP_WRITERS the
demonstration writes the work out from the metadata (aiw's: from the question), one step per line, before the answer
line: steps a model can imitate and a process reward model can score, one per line
(rewards/process_reward_model.py, step format "answer_tag"). Nothing checks such a step
when the policy writes it: its label comes from Monte-Carlo rollouts
(rewards/monte_carlo_labels.py).

    leg_counting   "2 cats, 3 spiders" ->  2 cats: 2*4=8
                                           3 spiders: 3*8=24, 8+24=32
                                           <answer>32</answer>
    chain_sum      "4 - 1 - 7 ="       ->  4 - 1 = 3
                                           3 - 7 = -4
                                           <answer>-4</answer>
    aiw            "Susan has 5 sisters ->  5 sisters + Susan = 6
                   and she also has 3      <answer>6</answer>
                   brothers. How many
                   sisters does James's
                   brother have?"

aiw's items carry no counts in their metadata, so its writer reads them from the question,
whose every wording (reasoning_gym/logic/aiw.py's templates) it matches whole; a question
it cannot read (the colleagues type, or a future wording) is refused by name, never guessed.

Character-level models (gpt_mini) need prompts inside their vocabulary: printable ASCII
and newlines. Several tasks (emoji_mystery, figlet_font, ...) are not; the training
command's checks refuse those prompts naming the characters (pipelines/data_checks.py).
"""

from __future__ import annotations

import difflib
import json
import random
import re
from typing import Any, Callable

from posttrain.envs.arithmetic import SPLIT_RULE, check_split_request, split_of
from posttrain.types import Example
from posttrain.verifiers.reasoning_gym_answer import SPECS, answer_tag, load_reasoning_gym

# One line after every question: reasoning-gym questions do not all say how to answer,
# and the grader reads only what is inside the tags.
ANSWER_FORMAT = "Put the answer in <answer></answer>.\n"


def leg_counting_steps(entry: dict) -> list[str]:
    """One line per kind of animal, as the question names it ("3 spiders"): count times legs,
    then the running total from the second line on."""
    legs = load_reasoning_gym().arithmetic.leg_counting.ANIMALS
    steps, total = [], 0
    for k, (animal, count) in enumerate(entry["metadata"]["animals"].items()):
        product = count * legs[animal]
        step = f"{count} {animal}{'s' if count > 1 else ''}: {count}*{legs[animal]}={product}"
        if k:
            step += f", {total}+{product}={total + product}"
        steps.append(step)
        total += product
    return steps


def chain_sum_steps(entry: dict) -> list[str]:
    """One line per operation, left to right, from the previous result: "4 - 1 = 3"."""
    tokens = entry["metadata"]["expression"].split()  # "4 - 1 - 7": numbers and operators, spaced
    value, steps = int(tokens[0]), []
    for op, term in zip(tokens[1::2], tokens[2::2]):
        result = value + int(term) if op == "+" else value - int(term)
        steps.append(f"{value} {op} {term} = {result}")
        value = result
    return steps


# aiw's wordings (Alice in Wonderland, Nezhurina et al. 2024: the trick is that the girl who
# is asked about counts too), each read whole: (pattern, what is counted). The siblings
# type has two templates, the count of sisters first or second; friends has one.
AIW_QUESTIONS = [
    (re.compile(r"(?P<name>[A-Z]\w*) has \d+ brothers and she also has (?P<count>\d+) sisters\. "
                r"How many sisters does [A-Z]\w*'s brother have\?"), "sisters"),
    (re.compile(r"(?P<name>[A-Z]\w*) has (?P<count>\d+) sisters and she also has \d+ brothers\. "
                r"How many sisters does [A-Z]\w*'s brother have\?"), "sisters"),
    (re.compile(r"(?P<name>[A-Z]\w*) has \d+ male friends and she also has (?P<count>\d+) female friends\. "
                r"They all are friends with each other and have no other friends aside\. "
                r"How many female friends does [A-Z]\w*, a male friend of (?P=name), have\?"), "female friends"),
]


def aiw_steps(entry: dict) -> list[str]:
    """One line that states the trick: her brother's (or male friend's) sisters (female
    friends) are hers and she herself, "5 sisters + Susan = 6". Read from the question,
    never from the answer."""
    question = entry["question"].strip()
    for pattern, counted in AIW_QUESTIONS:
        match = pattern.fullmatch(question)
        if match:
            count = int(match["count"])
            return [f"{count} {counted} + {match['name']} = {count + 1}"]
    raise ValueError(f"aiw: no step writer reads the question {question[:90]!r} (task type "
                     f"{entry['metadata'].get('task_type')!r}); worked steps cover the siblings and friends types: "
                     "give --env.reasoning_gym.task_config '{\"task_type_weights\": [1, 0, 0]}' (siblings only)")


# tasks whose demonstrations can show their work: item (as the environment holds it) -> steps
STEP_WRITERS: dict[str, Callable[[dict], list[str]]] = {"leg_counting": leg_counting_steps,
                                                         "chain_sum": chain_sum_steps, "aiw": aiw_steps}


def list_tasks() -> list[str]:
    """Every reasoning-gym task name, sorted (ImportError naming the extra without it)."""
    return sorted(load_reasoning_gym().factory.DATASETS)


class ReasoningGymEnv:
    """Problems of one reasoning-gym task, graded by its own score_answer.

    task          the task's name in reasoning-gym (from `--env.name reasoning_gym:NAME`)
    pool_size     items generated, indices 0..pool_size-1; the splits divide their distinct questions
    task_config   the task's own settings: a JSON object (or a dict) of its config fields
    seed          reasoning-gym's dataset seed: which pool of items; also the stream of `sample`
    spec_version  reasoning_gym/answer-tag-v1 (the grader's number, partial credit included; the
                  default) or reasoning_gym/answer-tag-exact-v1 (1.0 only for full credit)
    worked_steps  demonstrations that show their work, one step per line (module docstring);
                  only the tasks in STEP_WRITERS have a step writer
    """

    def __init__(self, task: str = "", pool_size: int = 10_000, task_config: str | dict = "", seed: int = 0,
                 spec_version: str | None = None, worked_steps: bool = False):
        reasoning_gym = load_reasoning_gym()
        known = list_tasks()
        if task not in known:
            close = difflib.get_close_matches(task, known, n=3) if task else []
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(
                f"reasoning-gym has no task {task!r}; {hint}give it as --env.name reasoning_gym:NAME, e.g. "
                f"{', '.join(n for n in ('chain_sum', 'basic_arithmetic', 'countdown', 'gsm_symbolic') if n in known)}"
                f" ({len(known)} in all: python -c \"import reasoning_gym; print(sorted(reasoning_gym.factory"
                f".DATASETS))\")")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ValueError(f"pool_size must be a positive int (items generated), got {pool_size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if not isinstance(worked_steps, bool):
            raise ValueError(f"worked_steps must be true or false, got {worked_steps!r}")
        if worked_steps and task not in STEP_WRITERS:
            raise ValueError(f"reasoning-gym's {task} has no step writer, so its demonstrations cannot show their "
                             f"work: use worked_steps=False (the answer alone), or one of {sorted(STEP_WRITERS)}")
        self.task, self.pool_size, self.seed, self.worked_steps = task, pool_size, seed, worked_steps
        self.task_config = _parse_config(task_config)
        config_class = reasoning_gym.factory.DATASETS[task][1]
        fields = [f for f in config_class.__dataclass_fields__ if f not in ("seed", "size")]
        unknown = sorted(set(self.task_config) - set(fields))
        if unknown:
            raise ValueError(f"task_config: reasoning-gym's {task} has no setting(s) {unknown}; its settings: "
                             f"{', '.join(fields)}")
        try:
            self._dataset = reasoning_gym.create_dataset(task, seed=seed, size=pool_size, **self.task_config)
        except Exception as error:  # the task's own validation (AssertionError, ValueError, ...)
            raise ValueError(f"reasoning-gym refused task_config {self.task_config} for {task}: "
                             f"{type(error).__name__}: {error}") from None
        spec_version = spec_version or "reasoning_gym/answer-tag-v1"
        if spec_version not in SPECS:
            raise ValueError(f"spec_version {spec_version!r} cannot grade reasoning-gym items; use one of {list(SPECS)}")
        self._spec = SPECS[spec_version]
        self._items: dict[int, Example] = {}
        self._rng = random.Random(seed)

    @property
    def spec_version(self) -> str:
        return self._spec.version

    @property
    def name(self) -> str:
        return f"reasoning_gym:{self.task}"

    @property
    def split_rule(self) -> str:
        return SPLIT_RULE + " (of the prompt)"

    def _item(self, index: int) -> Example:
        if index not in self._items:
            entry = self._dataset[index]
            prompt = f"{entry['question'].strip()}\n{ANSWER_FORMAT}"
            # JSON's view of the item (tuples become lists): what a saved sample holds, so a
            # score from a completions file equals the one given in the run
            entry = json.loads(json.dumps(entry, default=str))
            self._items[index] = Example(prompt=prompt, expected_answer=str(entry["answer"]),
                                         id=f"{self.task}-{self.seed}-{index}",
                                         meta={"entry": entry, "split": split_of(prompt)})
        return self._items[index]

    def sample(self, split: str, n: int, seed: int | None = None) -> list[Example]:
        """n items of `split` drawn i.i.d. from the pool (repeats possible). An int `seed`
        makes the draw reproducible on its own; None continues the environment's stream."""
        check_split_request(split, n)
        rng = self._rng if seed is None else random.Random(seed)
        examples: list[Example] = []
        draws = 0
        while len(examples) < n:
            draws += 1
            if draws > 200 * n + 10_000:  # ~10 draws per dev/held-out hit: only an empty split gets here
                raise ValueError(f"{self.name}: no items of split {split!r} in {draws - 1} draws from a pool of "
                                 f"{self.pool_size}; raise pool_size or widen task_config")
            example = self._item(rng.randrange(self.pool_size))
            if example.meta["split"] == split:
                examples.append(example)
        return examples

    def fixed_set(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """n DISTINCT problems of `split`, the same every call: items visited in an order
        fixed by `seed`, so a smaller set is a prefix of a larger one."""
        check_split_request(split, n)
        order = list(range(self.pool_size))
        random.Random(seed).shuffle(order)
        chosen: dict[str, Example] = {}
        for index in order:
            if len(chosen) == n:
                break
            example = self._item(index)
            if example.meta["split"] == split:
                chosen.setdefault(example.prompt, example)
        if len(chosen) < n:
            raise ValueError(f"{self.name}: split {split!r} holds only {len(chosen)} distinct problems in a pool of "
                             f"{self.pool_size} items, fewer than n={n}; ask for fewer, raise pool_size, or widen "
                             "task_config (a small task repeats its questions)")
        return list(chosen.values())

    def solution(self, example: Example) -> str:
        """The item's own answer in tags, after its worked steps with worked_steps=True: the
        SFT demonstration. It must earn full credit from the task's grader, or SFT would
        teach what RL is then paid to unlearn."""
        steps = STEP_WRITERS[self.task](example.meta["entry"]) if self.worked_steps else []
        completion = "\n".join(steps + [answer_tag(example.expected_answer)])
        result = self.score(example, completion)
        if not result["details"]["correct"]:
            raise ValueError(f"{self.name}: the item's own answer {example.expected_answer!r} scores "
                             f"{result['reward']:g} under its grader ({result['details']['reason']}: "
                             f"{result['details']['error']}), so it cannot be an SFT demonstration; skip SFT "
                             "with --init CHECKPOINT or --sft.steps 0")
        return completion

    def score(self, example: Example, completion: str) -> dict[str, Any]:
        return self._spec(example, completion)

    def __repr__(self) -> str:
        return (f"ReasoningGymEnv(task={self.task!r}, pool_size={self.pool_size}, "
                f"task_config={self.task_config}, seed={self.seed}, spec_version={self.spec_version!r}, "
                f"worked_steps={self.worked_steps})")


def _parse_config(task_config: str | dict) -> dict:
    if isinstance(task_config, dict):
        return dict(task_config)
    if not isinstance(task_config, str):
        raise ValueError(f"task_config must be a JSON object as a str, or a dict, got {task_config!r}")
    if not task_config.strip():
        return {}
    try:
        parsed = json.loads(task_config)
    except json.JSONDecodeError as error:
        raise ValueError(f"task_config is not valid JSON ({error.msg}): {task_config!r}; write e.g. "
                         "'{\"min_terms\": 2, \"max_terms\": 3}'") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"task_config must be a JSON object of the task's settings, got {task_config!r}")
    return parsed
