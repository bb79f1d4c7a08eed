"""Monte-Carlo tree search over reasoning steps, guided by a PRM, under a token budget.

A node is a partial solution (search/budget.py::Partial); its children are `children`
next steps sampled from the policy in one call. Each iteration, for every problem still
searching (all problems in lockstep, batched calls):

    select     from the root, follow the child with the highest UCT score
                   Q(c) + c_uct · sqrt(ln N(parent) / N(c))
               (Kocsis & Szepesvári 2006) through expanded nodes to one not yet expanded
    expand     sample its `children` next steps
    simulate   roll each new child out to the end of a solution (sampled, one call)
    evaluate   the PRM's aggregated score of the whole rolled-out solution is the child's
               value; the rollout itself is kept as a candidate answer
    backup     each child's value is added to every node on its path (N += 1, W += v)

The rollouts are what make it MCTS rather than best-first search: a node's value is an
estimate of where the policy ends up from it, not a verdict on the steps so far, and every
rollout is a finished solution, so the search has answers from its first iteration. They
also cost most of its tokens (a rollout is the rest of a solution; a step is a few tokens).
A finished child (end of sequence) is its own rollout and is never expanded; a node whose
children are all closed is closed. A problem stops when its root closes or its budget is
spent. Its answer is the finished solution (a rollout or a finished node) with the highest
value, ties to the earliest found.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from posttrain.config import SamplingParams
from posttrain.rewards.process_reward_model import StepFormat
from posttrain.roles.engines import Engine
from posttrain.search.budget import Partial, Problem, extend_steps, finish
from posttrain.search.methods import Scorer, prefix_values


@dataclass(eq=False)  # identity: a tree's nodes point at each other, and two equal partials are two nodes
class Node:
    partial: Partial
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    visits: int = 0
    value_sum: float = 0.0
    expanded: bool = False
    closed: bool = False  # nothing below it can be expanded any more

    @property
    def q(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0


def select(root: Node, c_uct: float) -> Node | None:
    """The node to expand next (UCT descent), or None once the whole tree is closed."""
    while not root.closed:
        node = root
        while node.expanded:
            open_children = [c for c in node.children if not c.closed]
            if not open_children:
                node.closed = True
                break
            log_n = math.log(max(node.visits, 1))
            node = max(open_children, key=lambda c: c.q + c_uct * math.sqrt(log_n / max(c.visits, 1)))
        else:
            return node
    return None


def backup(node: Node, value: float) -> None:
    while node is not None:
        node.visits += 1
        node.value_sum += value
        node = node.parent


def mcts(engine: Engine, problems: list[Problem], scorer: Scorer, fmt: StepFormat,
         separators: tuple[str, ...], children: int, step_tokens: int, max_new_tokens: int,
         c_uct: float = 1.0, generator: torch.Generator | None = None, params: SamplingParams | None = None,
         aggregation: str = "min") -> list[Partial | None]:
    """One answer per problem (module docstring)."""
    if children < 1:
        raise ValueError(f"MCTS needs children >= 1 per expansion, got {children}")
    roots = [Node(Partial()) for _ in problems]
    found: list[list[tuple[float, Partial]]] = [[] for _ in problems]  # finished solutions and their values
    searching = list(range(len(problems)))
    while searching:
        leaves = {i: select(roots[i], c_uct) for i in searching}
        searching = [i for i in searching if leaves[i] is not None]
        rows = [(problems[i], leaves[i].partial) for i in searching for _ in range(children)]
        if not rows:
            break
        owners = [i for i in searching for _ in range(children)]
        drawn = extend_steps(engine, rows, separators, step_tokens, max_new_tokens, generator, params)
        grown = [(i, child) for i, child in zip(owners, drawn) if child is not None]
        # simulate: each new child to the end of a solution (a finished child already is one)
        open_children = [(problems[i], child) for i, child in grown if not child.done]
        ends = iter(finish(engine, open_children, max_new_tokens, generator, params))
        rollouts = [child if child.done else next(ends) for _, child in grown]
        valued = [(k, r) for k, r in enumerate(rollouts) if r is not None]
        values = [0.0] * len(grown)
        scores = prefix_values(scorer, fmt, [problems[grown[k][0]].example.prompt for k, _ in valued],
                               [r for _, r in valued], aggregation)
        for (k, rollout), value in zip(valued, scores):
            values[k] = value
            if rollout.done:
                found[grown[k][0]].append((value, rollout))
        for i in searching:
            leaves[i].expanded = True
        for (i, partial), value in zip(grown, values):
            child = Node(partial, parent=leaves[i], closed=partial.done)
            leaves[i].children.append(child)
            backup(child, value)
        # a problem whose expansion drew nothing has spent its budget
        searching = [i for i in searching if any(owner == i for owner, _ in grown)]
    return [max(candidates, key=lambda pair: pair[0])[1] if candidates else best_open(root)
            for candidates, root in zip(found, roots)]


def best_open(root: Node) -> Partial | None:
    """No finished solution: the deepest-visited open node's partial (it cannot be right,
    but it is what the search got to); None for an empty tree."""
    node = root
    while node.children:
        node = max(node.children, key=lambda c: (c.visits, c.q))
    return node.partial if node is not root else None
