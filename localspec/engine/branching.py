"""How auto grows a draft into a draft tree: where the chosen draft holds alternatives (a free drafter's
other continuations, a draft model's runner-ups or drawn siblings), by those that raise the expected rate
(_tree). Each is worth the chance the chain fails where it forks times what the text has shown of
alternatives of its rank there (`ranks`, scored against the committed tokens as n-gram proposals are:
_learn_forks), against what its rows cost on the curve."""

from dataclasses import dataclass, replace

from ..config import DrafterKind
from .belief import MEAN, PRIOR, SURE
from .drafters import Draft
from .tree import Alternative, DraftTree


@dataclass
class Fork:
    """An alternative at a fork of a proposal (a free drafter's, or a draft model's where it drafted),
    waiting for the text to show whether it was right where the chain was wrong: what auto knows of a branch
    of that rank, learned without verifying it."""

    start: int  # where in history the proposal's first token would go
    chain: list[int]  # the proposal up to the fork, the chain's token there included
    first: int  # the alternative's token at the fork
    key: tuple[DrafterKind, int]  # its drafter and rank


class TreeWeighing:
    """A part of AutoDrafter, which holds the most branches a tree may have (branches), what the text has
    shown of each (drafter, rank) of alternatives (ranks), the forks waiting for the text (forks), the costs
    and the last batch sizes (costs, sizes), and weighs an Option's expected tokens (expected_tokens, read
    beyond what the text has scored as _beyond says)."""

    @staticmethod
    def _forks(start: int, draft: Draft) -> list[Fork]:
        return [Fork(start, draft.tokens[: other.fork + 1], other.tokens[0], (draft.source, other.rank))
                for other in draft.alternatives]

    def _tree(self, draft: Draft, option, length: int, planned: int, seconds: list[float],
              rows: int) -> DraftTree | None:
        """The chosen draft (its first `length` tokens) grown by the alternatives it holds, one by one while
        each raises the expected rate (None: the chain alone pays best). An alternative at fork f adds its
        rows and is worth R_f (1 - a_f) b r, where R_f is the chance the chain reaches f, a_f its acceptance
        there, b what the text has shown of alternatives of that rank (at its doubtful side: a tree must pay
        even there) and r what its own tokens reach, taken as the chain's deeper positions would. seconds:
        the chosen option's (policy.Option's) step seconds by length. A sampled draft's siblings (drawn from q) are weighed in
        the order of their forks, each as if the chain were as long as planned: whether a node gets one then
        depends on nothing drawn at it or after, as their verification needs (its children independent draws
        from its q)."""
        drawn = draft.dists is not None
        weighed = planned if drawn else length
        others = [other for other in draft.alternatives if other.fork < length]
        if not others or self.branches < 2:
            return None
        expected = [1.0, *self.expected_tokens(replace(option, most=weighed), MEAN, beyond=self._beyond(option))]
        reach = [1.0] + [after - before for before, after in zip(expected, expected[1:])]  # R_0 .. R_weighed

        def worth(other: Alternative) -> float:
            fork, size = other.fork, min(len(other.tokens), weighed - other.fork)
            chance = self.ranks.get((option.drafter, other.rank), PRIOR).view(SURE)
            goes_on = sum(reach[fork + 1 + j] / reach[fork + 1] for j in range(size)) if reach[fork + 1] else 1.0
            return (reach[fork] - reach[fork + 1]) * chance * goes_on

        verify = self.costs.verify_table(rows + 1 + weighed + sum(len(other.tokens) for other in others), self.sizes)
        drafting = seconds[weighed - 1] - verify[rows + weighed]  # (the alternatives were found on the way: no more)
        tokens, size, rate, grown = expected[weighed], weighed, expected[weighed] / seconds[weighed - 1], []
        order = sorted(others, key=lambda other: other.fork) if drawn else sorted(others, key=worth, reverse=True)
        for other in order[: self.branches - 1]:
            added = min(len(other.tokens), weighed - other.fork)
            faster = (tokens + worth(other)) / (drafting + verify[rows + size + added])
            if faster <= rate:
                break
            tokens, size, rate = tokens + worth(other), size + added, faster
            grown.append(other)
        if not grown:
            return None
        return DraftTree.forked(draft.tokens[:length], grown, draft.dists[:length] if drawn else None)

    def _learn_forks(self, history: list[int]) -> None:
        """Learn, from each fork the committed tokens have reached, whether its alternative was right where
        the chain was wrong."""
        waiting = []
        for fork in self.forks:
            at = fork.start + len(fork.chain) - 1
            if at >= len(history):
                waiting.append(fork)
            elif history[fork.start : at] == fork.chain[:-1] and history[at] != fork.chain[-1]:
                self.ranks.setdefault(fork.key, replace(PRIOR)).observe(history[at] == fork.first)
        self.forks = waiting
