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

TreeDecoding is the part of a Context that decodes a tree and keeps the path the walk chose.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import EngineError
from .library import llama
from .sampling import Dist, accept, residual

ROOT = -1  # the parent of the nodes drafted right after the last committed token


@dataclass(frozen=True)
class Alternative:
    """A continuation a free drafter holds beside the chain it bets on: it departs from the chain at
    position `fork` (its first token in place of the chain's there), the `rank`-th likeliest there (2: the
    runner-up), seen with frequency `share` where the earlier text went on past the chain's prefix."""

    fork: int
    rank: int
    tokens: tuple[int, ...]
    share: float = 0.0


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

    @classmethod
    def forked(cls, chain: Sequence[int], alternatives: Sequence["Alternative"],
               dists: Sequence[Dist] | None = None) -> "DraftTree":
        """A chain and the alternatives that fork from it (each cut to end no deeper than the chain), the
        chain's nodes first and each fork's alternatives by rank: so a node's rank among its siblings is its
        order among them (rank()). Alternatives that fork beyond the chain are left out. dists: the q each
        chain token was drawn from, where it was; an alternative's first token was then drawn from its
        fork's q too (a multi-draft sibling), and what follows it is one-hot."""
        tokens, parents = list(chain), list(range(-1, len(chain) - 1))
        drawn: list[Dist | None] | None = list(dists) if dists is not None else None
        for alternative in sorted(alternatives, key=lambda a: (a.fork, a.rank)):
            if alternative.fork >= len(chain):
                continue
            parent = alternative.fork - 1  # the chain node it follows (ROOT for a fork at the first token)
            for depth, token in enumerate(alternative.tokens[: len(chain) - alternative.fork]):
                tokens.append(token)
                parents.append(parent)
                if drawn is not None:
                    drawn.append(drawn[alternative.fork] if depth == 0 else None)
                parent = len(tokens) - 1
        return cls(tuple(tokens), tuple(parents), tuple(drawn) if drawn is not None else None)

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

    def rank(self, path: Sequence[int]) -> int:
        """Which of its siblings' branches a kept path took (1: always the first, the chain a drafter bet
        on; 2: somewhere the runner-up, ...): the largest of its nodes' orders among their siblings."""
        return max((self.children(self.parents[node]).index(node) + 1 for node in path), default=1)

    def prefixes(self) -> list[list[int]]:
        """The draft tokens each row of its verification follows: none for row 0 (the root's), the tokens of
        the path down to node i for row i + 1."""
        before: list[list[int]] = [[]]
        for node, parent in enumerate(self.parents):
            before.append([*before[parent + 1], self.tokens[node]])
        return before

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to node."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


def verify_greedy(tree: DraftTree, argmax: Callable[[int], int],
                  follow: Callable[[int], None] = lambda token: None) -> tuple[list[int], int]:
    """(the nodes kept, root down; the target's own next token). argmax(row): the target's likeliest token
    at a row of the verification batch (0: the root's, i + 1: node i's); follow(token): told each token kept
    before the next row is read (a grammar then masks that row by the state after it)."""
    path, node = [], ROOT
    while True:
        choice = argmax(node + 1)
        child = next((c for c in tree.children(node) if tree.tokens[c] == choice), None)
        if child is None:
            return path, choice
        path.append(child)
        follow(choice)
        node = child


def verify_sampled(tree: DraftTree, p_of: Callable[[int], Dist], rng: np.random.Generator,
                   follow: Callable[[int], None] = lambda token: None) -> tuple[list[int], int]:
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
        follow(token)
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


class TreeDecoding:
    """Draft trees decoded in a batch (Context.decode_tree, decode_together): a part of Context, which holds
    llama.cpp's context, its memory (_memory), its sequence (seq), the first sequence id free for its
    branches (_first_branch) and how many there are (branch_room), and its tokens."""

    _tree: tuple[DraftTree, int] | None = None  # the tree decoded last, and its root's position

    def tree_rows(self, tree: DraftTree, root: int) -> list[tuple[int, int, list[int]]]:
        """The batch rows (token, position, sequence ids) that decode root (the last committed token) and
        every node of tree after the cache's tokens, with logits on every row (row 0 the root's, i + 1 node
        i's): each node at its parent's position plus one, in the sequences of the leaves below it, each of
        which is made to hold the cache's tokens too (shared cells, not copies). Once they are decoded,
        keep_path keeps one path; where the decode failed, tree_failed forgets the branches."""
        if self.hidden.layers:
            raise EngineError("a tree's rows keep no hidden states for the drafters that read them (not built yet)")
        if not self.reads_trees:
            raise EngineError("a tree's rows are sampled on the backend without samplers for its branches")
        self._settle()
        start, leaves, below = len(self.tokens), tree.leaves(), tree.branches()
        if len(leaves) > self.branch_room:
            raise EngineError(f"a tree of {len(leaves)} branches, where the context has room for {self.branch_room}")
        if 1 + len(tree) > self.max_rows or start + 2 + max(tree.depths(), default=-1) > self.n_ctx:
            raise EngineError(f"a tree of {len(tree)} tokens does not fit after {start}")
        branch_ids = [self._first_branch + index for index in range(len(leaves))]
        self._drop_branches(len(leaves))  # (what a decode interrupted by Ctrl-C may have left in them)
        for seq in branch_ids:
            llama.llama_memory_seq_cp(self._memory, self.seq, seq, 0, start)
        rows = [(root, start, [self.seq, *branch_ids])]
        rows += [(token, start + 1 + depth, [branch_ids[leaf] for leaf in leaves_below])
                 for token, depth, leaves_below in zip(tree.tokens, tree.depths(), below)]
        self._tree = (tree, start)
        return rows

    def tree_failed(self) -> None:
        """The decode of tree_rows' rows failed: forget the branches."""
        tree, _ = self._tree
        self._drop_branches(len(tree.leaves()))
        self._tree = None

    def keep_path(self, path: list[int]) -> None:
        """Keep the nodes of the tree decoded last along path (root down; [] for none) after the root, in
        this sequence, and forget every other branch."""
        tree, start = self._tree
        if path:
            leaf = tree.branches()[path[-1]][0]  # a leaf below the path's end: its sequence holds the path
            llama.llama_memory_seq_cp(self._memory, self._first_branch + leaf, self.seq, start + 1,
                                      start + 1 + len(path))
            self.tokens.extend(tree.tokens[node] for node in path)
        self._drop_branches(len(tree.leaves()))
        self._tree = None

    def _drop_branches(self, count: int) -> None:
        for seq in range(self._first_branch, self._first_branch + count):
            llama.llama_memory_seq_rm(self._memory, seq, -1, -1)
