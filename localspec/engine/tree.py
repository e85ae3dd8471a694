"""Draft trees: several continuations verified in one target pass (SpecInfer, Medusa, EAGLE-2's dynamic
trees, SuffixDecoding's speculation trees), and the choice of the path the target keeps.

A tree's nodes are draft tokens, each the child of another node or of the root (the last committed token,
which the target has not decoded yet). The target decodes the root and every node in one batch, each node
at its parent's position plus one and attending to its ancestors only (in llama.cpp: one sequence id per
leaf, a node belonging to the sequences of the leaves below it, so a shared prefix is decoded once); row 0
is the root's, row i + 1 node i's. The verification walks down from the root:

* greedy: the child whose token is the target's argmax at the row, while there is one;
* sampling, one-hot children (n-gram, suffix, prediction branches: no distribution behind them): a token
  drawn from the target's p at the row, and the child it names, if any; every emitted token is then a
  draw from p, whatever the branches were;
* sampling, children drawn from a drafter's q, independently (SpecInfer's multi-draft rejection
  sampling): each child in turn is kept with probability min(1, p(x) / q(x)), and after a refusal p
  becomes norm(max(0, p - q)) for the next; once all are refused the token is drawn from what p became.
  Each step's token then follows p exactly (Miao et al., SpecInfer, Theorem 4.2).

Either way the walk ends at a node with no child that the target takes, with one token of the target's own
(a leaf's row gives the bonus token): the output is the target's.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from .sampling import Dist, accept, residual

ROOT = -1  # the parent of the nodes drafted right after the last committed token


@dataclass(frozen=True)
class DraftTree:
    """tokens[i] is node i's token, parents[i] its parent (ROOT or an earlier node: a parent comes before
    its children); dists[i], where a drafter drew node i's token from a distribution (and its siblings
    independently from the same), that distribution q; None for one-hot nodes. Siblings are distinct
    tokens where one-hot, and all one-hot or all drawn."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    dists: tuple[Dist | None, ...] | None = None

    def __post_init__(self):
        if len(self.tokens) != len(self.parents) or self.dists is not None and len(self.dists) != len(self.tokens):
            raise EngineError("a draft tree needs a parent (and a distribution, or none) for each token")
        for node, parent in enumerate(self.parents):
            if not ROOT <= parent < node:
                raise EngineError(f"node {node}'s parent {parent} does not come before it")
        for parent in (ROOT, *range(len(self.tokens))):
            children = self.children(parent)
            drawn = [self.dists is not None and self.dists[child] is not None for child in children]
            if any(drawn) and not all(drawn):
                raise EngineError(f"node {parent}'s children are neither all one-hot nor all drawn")
            if not any(drawn) and len({self.tokens[child] for child in children}) < len(children):
                raise EngineError(f"node {parent} has one-hot children of the same token")

    @classmethod
    def chain(cls, tokens: Sequence[int], dists: Sequence[Dist] | None = None) -> "DraftTree":
        """A tree of one branch: a chain draft as the loop verifies it today."""
        return cls(tuple(tokens), tuple(range(-1, len(tokens) - 1)), tuple(dists) if dists is not None else None)

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        return [child for child, parent in enumerate(self.parents) if parent == node]

    def depths(self) -> list[int]:
        """Each node's depth: 0 for the root's children, so that node i sits at the root's position plus
        depths[i] + 1."""
        depths: list[int] = []
        for parent in self.parents:
            depths.append(0 if parent == ROOT else depths[parent] + 1)
        return depths

    def leaves(self) -> list[int]:
        has_children = set(self.parents)
        return [node for node in range(len(self.tokens)) if node not in has_children]

    def branches(self) -> list[list[int]]:
        """For each node, the leaves below it (itself, for a leaf) by their index in leaves(): the sequences
        it belongs to in the verification batch. The root belongs to all of them."""
        leaves = self.leaves()
        below: list[list[int]] = [[] for _ in self.tokens]
        for index, leaf in enumerate(leaves):
            node = leaf
            while node != ROOT:
                below[node].append(index)
                node = self.parents[node]
        return below

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to node."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def verify_greedy(tree: DraftTree, argmax: Callable[[int], int]) -> tuple[list[int], int]:
    """(the nodes kept, root down; the target's own next token). argmax(row): the target's likeliest token
    at a row of the verification batch (0: the root's, i + 1: node i's)."""
    path, node = [], ROOT
    while True:
        choice = argmax(node + 1)
        child = next((c for c in tree.children(node) if tree.tokens[c] == choice), None)
        if child is None:
            return path, choice
        path.append(child)
        node = child


def verify_sampled(tree: DraftTree, p_of: Callable[[int], Dist], rng: np.random.Generator) -> tuple[list[int], int]:
    """As verify_greedy, each token following the target's p at its row (p_of(row), what its sampler chain
    keeps): one-hot children by a draw from p, drawn children by multi-draft rejection sampling."""
    path, node = [], ROOT
    while True:
        p, children = p_of(node + 1), tree.children(node)
        if not children:
            return path, p.sample(rng)
        if tree.dists is None or tree.dists[children[0]] is None:
            token = p.sample(rng)
            child = next((c for c in children if tree.tokens[c] == token), None)
        else:
            child, token = _multi_draft(tree, children, p, rng)
        if child is None:
            return path, token
        path.append(child)
        node = child


def _multi_draft(tree: DraftTree, children: list[int], p: Dist, rng: np.random.Generator) -> tuple[int | None, int]:
    """SpecInfer's rejection over children drawn independently from one q: the child kept (None: all
    refused) and its token, or the token drawn from what p became."""
    for child in children:
        token, q = tree.tokens[child], tree.dists[child]
        if accept(token, p, q, rng):
            return child, token
        p = residual(p, q)
    return None, p.sample(rng)
