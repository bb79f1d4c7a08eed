"""Monte-Carlo tree search over reasoning steps, guided by a PRM, under a token budget.

A node is a partial solution (search/budget.py::Partial); its children are `children`
next steps sampled from the policy in one call. Each iteration, for every problem still
searching (all problems in lockstep, one batched call):

    select     from the root, follow the child with the highest UCT score
                   Q(c) + c_uct · sqrt(ln N(parent) / N(c))
               (Kocsis & Szepesvári 2006) through expanded nodes to one not yet expanded
    expand     sample its `children` next steps
    evaluate   the PRM's aggregated score of each child's steps so far is its value: no
               random rollout to the end, which would spend the budget on one line
    backup     each child's value is added to every node on its path (N += 1, W += v)

A finished child (end of sequence) is a leaf that is never expanded; a node whose children
are all closed is closed. A problem stops when its root closes or its budget is spent. Its
answer is the finished solution with the highest mean value Q, an unfinished one if none
finished. With a PRM that only ever says "right so far" this is best-first search; the
UCT bonus spends some budget on less-visited siblings in case the PRM was wrong about them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from posttrain.config import SamplingParams
from posttrain.rewards.process_reward_model import StepFormat
from posttrain.roles.rollout import RolloutEngine
from posttrain.search.budget import Partial, Problem, extend_steps
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


def mcts(engine: RolloutEngine, problems: list[Problem], scorer: Scorer, fmt: StepFormat,
         separators: tuple[str, ...], children: int, step_tokens: int, max_new_tokens: int,
         c_uct: float = 1.0, generator: torch.Generator | None = None, params: SamplingParams | None = None,
         aggregation: str = "min") -> list[Partial | None]:
    """One answer per problem (module docstring)."""
    if children < 1:
        raise ValueError(f"MCTS needs children >= 1 per expansion, got {children}")
    roots = [Node(Partial()) for _ in problems]
    searching = list(range(len(problems)))
    while searching:
        leaves = {i: select(roots[i], c_uct) for i in searching}
        searching = [i for i in searching if leaves[i] is not None]
        rows = [(problems[i], leaves[i].partial) for i in searching for _ in range(children)]
        if not rows:
            break
        drawn = extend_steps(engine, rows, separators, step_tokens, max_new_tokens, generator, params)
        owners = [i for i in searching for _ in range(children)]
        grown = [(i, child) for i, child in zip(owners, drawn) if child is not None]
        values = prefix_values(scorer, fmt, [problems[i].example.prompt for i, _ in grown],
                               [c for _, c in grown], aggregation)
        for i in searching:
            leaves[i].expanded = True
        for (i, partial), value in zip(grown, values):
            child = Node(partial, parent=leaves[i], closed=partial.done)
            leaves[i].children.append(child)
            backup(child, value)
        # a problem whose expansion drew nothing has spent its budget
        searching = [i for i in searching if any(owner == i for owner, _ in grown)]
    return [best_answer(root) for root in roots]


def best_answer(root: Node) -> Partial | None:
    """The finished node with the highest Q (ties: more visits, then drawing order); the
    best open node when none finished; None for an empty tree."""
    nodes, stack = [], [root]
    while stack:
        node = stack.pop(0)
        nodes.append(node)
        stack += node.children
    order = {id(n): k for k, n in enumerate(nodes)}  # breadth-first: the drawing order within a depth
    candidates = [n for n in nodes[1:] if n.partial.done] or nodes[1:]
    if not candidates:
        return None
    return max(candidates, key=lambda n: (n.q, n.visits, -order[id(n)])).partial
