"""The speculative decoding loop (Leviathan et al. 2023; Chen et al. 2023).

Each step the drafter proposes up to k tokens, the target decodes
[last] + draft in one batch with logits on every row, and we keep the longest
prefix the target agrees with plus one token of the target's own. Greedy: a
draft token is kept while it is the target's argmax. Sampling: draft token x is
kept with probability min(1, p(x)/q(x)); on rejection the target's token is
drawn from norm(max(0, p - q)); if all are kept a bonus token is drawn from p
on the last row. Either way every emitted token follows the target's own
distribution: the output is the target's, only faster. Under a grammar the
target's choices at every verified position are masked by it (engine/grammar.py); under a logit bias
each verified row is biased, and under penalties penalised for the drafted tokens before it
(engine/adjustments.py). A draft tree
(engine/tree.py) is verified the same way along the path the walk takes.
"""

from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np

from ..config import Limits, Sampling, Speculation
from ..errors import ContextOverflow, InputError
from ..events import Candidate, Done, Event, Logprobs, Prefill, Reading, Step, Token
from . import backend
from .backend import Context
from .drafters import Draft, Drafter, ForcedDrafter, Learner, proposal
from .drafters.spec import draft_limit
from .grammar import Grammar
from .adjustments import Adjustments
from .sampling import (Dist, Mirostat, accept, chain_for, excluded, logprobs_of, one_hot, residual, sampled_logprobs,
                       softmax)
from .text import TextStream, unshown_tokens
from .tree import DraftTree
from .tree import verify_greedy as tree_greedy
from .tree import verify_sampled as tree_sampled
from .turns import Turn, decoded_alone, timed
from .vision import is_media, media_runs


def generate(
    target: Context,
    drafter: Drafter,
    prompt: list[int],
    sampling: Sampling,
    speculation: Speculation,
    limits: Limits,
) -> Iterator[Event | Turn]:
    if not prompt:
        raise InputError("the prompt is empty")
    if is_media(prompt[-1]):
        raise InputError("the prompt ends with an image: text must follow it (a chat template's turn does)")
    # (the context's room: an image's rows under M-RoPE take more cells than the positions it holds)
    room = target.n_ctx - (target.media.extra_cells(prompt) if target.media is not None else 0)
    if len(prompt) >= room:
        raise ContextOverflow(
            f"the prompt is {len(prompt) + target.n_ctx - room} tokens but the context holds {target.n_ctx};"
            " raise --ctx-size or shorten the prompt"
        )
    grammar = Grammar(target.model, sampling.grammar, sampling.grammar_triggers) if sampling.grammar else None
    try:
        yield from _generate(target, drafter, prompt, sampling, speculation, limits, grammar, room)
    finally:
        if grammar:
            grammar.close()


def scored(target: Context, tokens: list[int], top: int = 0, start: int = 1) -> tuple[Logprobs, ...]:
    """Each token's logprobs from `start` on, given those before it (those before start: None), outside any
    generation, the tokens read into the cache anew: a text's perplexity (llama.cpp's llama-perplexity reads
    its rows so, and scores the second half of each chunk)."""
    target.sample_with(chain_for(Sampling(temperature=0)), host=True)
    return decoded_alone(prompt_logprobs(target, tokens, top, start))


def prompt_logprobs(target: Context, prompt: list[int], top: int, start: int = 1
                    ) -> Generator[Turn, None, tuple[Logprobs, ...]]:
    """Each prompt token's logprobs from `start` on given those before it (before start: None): the prompt but
    its last token read anew (a row is wanted of every scored position, a cached one has none), the part
    before the first scored row as a prompt is read (whole batches, no rows kept), then in pieces whose rows
    fit a batch, each read before the next piece overwrites them; in turns where the sequence shares its
    context."""
    if min(prompt, default=0) < 0:
        raise InputError("the logprobs of a prompt's tokens are not given where it holds an image")
    target.keep_common([])
    shared = target.n_seq > 1
    piece = min(target.max_rows, target.prompt_piece) if shared else target.max_rows
    unread = prompt[: start - 1]
    if shared:
        for offset in range(0, len(unread), target.prompt_piece):
            yield Turn(target, unread[offset : offset + target.prompt_piece], logits="none")
    elif unread:
        target.prefill(unread)
    found = [Logprobs(Candidate(token, target.model.piece(token), None)) for token in prompt[:start]]
    for offset in range(start - 1, len(prompt) - 1, piece):
        tokens = prompt[offset : min(offset + piece, len(prompt) - 1)]
        if shared:
            yield Turn(target, tokens, logits="all")
        else:
            target.decode(tokens, logits="all")
        found += [logprobs_of(target.logits(row), prompt[offset + row + 1], top, target.model.piece)
                  for row in range(len(tokens))]
    return tuple(found)


def _generate(target: Context, drafter: Drafter, prompt: list[int], sampling: Sampling, speculation: Speculation,
              limits: Limits, grammar: Grammar | None, room: int) -> Iterator[Event | Turn]:
    rng = np.random.default_rng(sampling.seed)
    adjustments = Adjustments.of(sampling, target.model)
    mirostat = Mirostat.of(sampling, target.model.n_vocab)
    reporting = sampling.logprobs is not None
    reporting_rows = reporting and not sampling.logprobs_sampled  # (else the p each token was chosen from)
    reporting_sampled = reporting and sampling.logprobs_sampled
    # a grammar masks full rows, a bias and penalties change them and the rows' logprobs read them, on the host
    target.sample_with(chain_for(sampling), host=grammar is not None or adjustments is not None or reporting_rows
                       or sampling.prompt_logprobs is not None)
    trees = target.branch_room > 0 and getattr(drafter, "branches", 1) > 1 and speculation.branches != 1
    started = perf_counter()
    scored_prompt: tuple[Logprobs, ...] = ()
    if sampling.prompt_logprobs is not None:
        reused, scored_prompt = 0, (yield from prompt_logprobs(target, prompt, sampling.prompt_logprobs))
    else:
        # the prompt in pieces: beside the other sequences' rows of a step, or a batch at a time, each piece
        # watched where there are several (Reading)
        reused = target.keep_common(prompt[:-1])
        shared = target.n_seq > 1
        piece = target.prompt_piece if shared else target.n_batch
        watched = len(prompt) - 1 - reused > piece
        # an image's rows are read by themselves, whole (a batch holds tokens or rows, not both)
        runs = media_runs(prompt[:-1]) if target.media is not None else [(0, len(prompt) - 1, False)]
        for start, end, image in runs:
            if end <= reused:
                continue
            for offset in range(max(start, reused), end, end if image else piece):
                tokens = prompt[offset : min(offset + piece, end) if not image else end]
                if shared and not image:
                    yield Turn(target, tokens, logits="none")
                else:
                    target.decode(tokens, logits="none")
                if watched:
                    yield Reading(offset + len(tokens), len(prompt), reused, perf_counter() - started)
        target.remember(len(prompt) - 1 - reused, perf_counter() - started)
    model = target.model
    draft_max = draft_limit(speculation, drafter.kind)
    if grammar and speculation.jump_forward:
        drafter = ForcedDrafter(grammar, model, drafter)
    drafter.begin(prompt, sampling, rng)
    learns = isinstance(drafter, Learner)
    yield Prefill(len(prompt), reused, perf_counter() - started, scored_prompt)

    text = TextStream(limits.stop, limits.indent)
    history = list(prompt)  # committed tokens; the target has decoded all but the last
    produced = 0
    max_tokens = limits.max_tokens or room  # the context ends a generation without a limit of its own
    finish, end_token = None, None
    decode_started = perf_counter()
    while finish is None:
        n_past = len(history) - 1
        if backend.CHECK_CACHES:
            target.check_holds(history[:-1])
        k = min(
            draft_max,
            target.max_rows - 1,  # [last] + draft must fit one batch
            room - len(history),
            max_tokens - produced - 1,
        )
        draft, draft_seconds = (yield from timed(proposal(drafter, history, k))) if k > 0 else (Draft.nothing(), 0.0)
        if target.media is not None:
            draft = draft.without_images()
        # a tree is verified where it fits: else the chain it was grown from
        if draft.tree is not None and (not trees or not fits(target, draft.tree)):
            draft = replace(draft, tree=None)
        if draft.size < speculation.draft_min:
            draft = Draft(source=draft.source, catch_up_seconds=draft.catch_up_seconds)
        rank = 0
        choice = Choice(sampling, rng, grammar, mirostat, [] if reporting_sampled else None)
        if draft.tree is not None:
            verifying, others = yield from _verification(target, [history[-1]], draft.tree)
            # the model's own rows, as logprobs report them (adjustments change the rows in place)
            rows_read = [target.logits(row).copy() if adjustments else target.logits(row)
                         for row in range(1 + draft.size)] if reporting_rows else []
            if adjustments:
                adjustments.apply_tree(target.logits, history, draft.tree)
            kept, own, rank, path_rows = verify_tree(target, draft.tree, choice)
            accepted = len(kept)
            rows_read = [rows_read[row] for row in path_rows] if reporting_rows else []
        else:
            verifying, others = yield from _verification(target, [history[-1], *draft.tokens])
            # the model's own rows, as logprobs report them (adjustments change the rows in place)
            rows_read = [target.logits(i).copy() if adjustments else target.logits(i) for i in range(1 + draft.size)
                         ] if reporting_rows else []
            if adjustments:
                adjustments.apply_rows(target.logits, history, draft.tokens)
            if sampling.greedy:
                accepted, own = verify_greedy(target, draft, grammar)
            else:
                accepted, own = verify_sampled(target, draft, choice)
            target.truncate(n_past + 1 + accepted)
            kept = draft.tokens[:accepted]
        tree = draft.tree
        step = Step(draft.source, draft.size, accepted, draft_seconds, perf_counter() - verifying,
                    draft.catch_up_seconds, draft.probe is not None, draft.probe.plain_seconds if draft.probe else 0.0,
                    others, branches=len(tree.leaves()) if tree else 0, depth=1 + max(tree.depths()) if tree else 0,
                    rank=rank)
        emitted = [*kept, own]
        # read before anything is handed on: on a shared context the next batch may overwrite the rows meanwhile
        if reporting_rows:
            reports = [logprobs_of(rows_read[i], token, sampling.logprobs, model.piece)
                       for i, token in enumerate(emitted)]
        elif reporting_sampled:  # (greedy chose each token alone)
            chosen_from = [one_hot(token) for token in emitted] if sampling.greedy else choice.seen
            reports = [sampled_logprobs(chosen_from[i], token, sampling.logprobs, model.piece)
                       for i, token in enumerate(emitted)]
        else:
            reports = [None] * len(emitted)
        if learns:
            drafter.observe(step)  # (the whole verification: what the drafter got right, wherever the answer ends)

        tokens = []
        for i, token in enumerate(emitted):
            history.append(token)
            if model.is_eog(token):
                finish, end_token = "stop", token
                break
            produced += 1
            tokens.append(Token(token, text.push(model.piece(token)), from_draft=i < accepted, logprobs=reports[i]))
            if text.stopped:
                finish = "stop"
            elif produced == max_tokens or text.outdented or (  # (llama-server's limits, a code completion's)
                    limits.seconds is not None and b"\n" in model.piece(token)
                    and perf_counter() - decode_started > limits.seconds):
                finish = "length"
            if finish:
                break
        # an answer that ends inside the accepted draft takes none of it past its end: the record counts what it took
        taken = len(tokens) + (end_token is not None)
        yield step if taken > accepted else replace(step, accepted=taken, own_taken=False)
        yield from tokens
        if finish is None and len(history) > room:
            finish = "context"

    tail = text.flush()
    held = unshown_tokens([model.piece(token) for token in history[len(prompt):]], text.text) if text.stopped else 0
    yield Done(finish, tail, perf_counter() - decode_started, stop_sequence=text.stopped, end_token=end_token,
               unshown_tokens=held)


def _verification(target: Context, rows: list[int], tree: DraftTree | None = None
                  ) -> Generator[Turn, None, tuple[float, int]]:
    """Decode a step's rows (the last committed token, then the draft, or the tree after it) with logits on
    every row: (when the verification began, as the step's time counts it; how many rows the other
    sequences had in its batch)."""
    if target.n_seq == 1:
        started = perf_counter()
        if tree is None:
            target.decode(rows, logits="all")
        else:
            target.decode_tree(tree, rows[0])
        return started, 0
    turn = Turn(target, rows, tree=tree)  # decoded with the other sequences' rows, in a batch someone else runs
    yield turn
    return perf_counter() - turn.seconds, target.others  # what went on meanwhile is the other sequences' time


def verify_greedy(target: Context, draft: Draft, grammar: Grammar | None = None) -> tuple[int, int]:
    """(number of draft tokens kept, the target's own next token). A grammar masks each choice and
    follows the tokens kept, so that the next row's choice is masked by the state after them."""
    for i, token in enumerate(draft.tokens):
        choice = target.token(i) if grammar is None else grammar.best(target.logits(i))
        if choice != token:
            return i, _committed(choice, grammar, target)
        if grammar:
            grammar.accept(token)
    bonus = len(draft.tokens)
    return bonus, target.token(bonus) if grammar is None else _committed(grammar.best(target.logits(bonus)), grammar,
                                                                         target)


@dataclass
class Choice:
    """What a sampled verification chooses by at each row: the sampling and its random numbers, the grammar the
    choices follow, Mirostat's mu, and where the answer reports them, the p of each row as it was read."""

    sampling: Sampling
    rng: np.random.Generator
    grammar: Grammar | None = None
    mirostat: Mirostat | None = None
    seen: list[Dist] | None = None

    def p(self, target: Context, row: int) -> Dist:
        """p at a row: what the chain keeps of it among the tokens the grammar admits, cut at Mirostat's mu, or
        after XTC's exclusion."""
        p = _chosen_from(target, row, self.grammar)
        p = self.mirostat.kept(p) if self.mirostat else excluded(p, self.sampling, self.rng)
        if self.seen is not None:
            self.seen.append(p)
        return p

    @property
    def needs_p(self) -> bool:
        """Whether a token no draft competes for is drawn from p itself (not by llama.cpp's sampler)."""
        return self.sampling.xtc or self.mirostat is not None or self.seen is not None

    def follow(self, token: int) -> None:
        """A token chosen at the last row p was read of, followed by the grammar and by Mirostat's mu."""
        if self.grammar:
            self.grammar.accept(token)
        if self.mirostat:
            self.mirostat.chose(token)

    def committed(self, token: int, target: Context) -> int:
        """The target's own token, followed (an end-of-generation token ends the grammar instead)."""
        _committed(token, self.grammar, target)
        if self.mirostat:
            self.mirostat.chose(token)
        return token


def verify_sampled(target: Context, draft: Draft, choice: Choice) -> tuple[int, int]:
    """As verify_greedy, by the rejection rule; p is the chain over the tokens the grammar admits (Choice.p)."""
    rng, grammar = choice.rng, choice.grammar
    for i, token in enumerate(draft.tokens):
        p = choice.p(target, i)
        q = draft.dists[i] if draft.dists is not None else one_hot(token)
        if not accept(token, p, q, rng):
            return i, choice.committed(residual(p, q).sample(rng), target)
        choice.follow(token)
    bonus = len(draft.tokens)  # no draft token competes here: only a token is wanted, not p
    if choice.needs_p:
        return bonus, choice.committed(choice.p(target, bonus).sample(rng), target)
    if target.on_backend:
        return bonus, softmax(*target.candidates(bonus)).sample(rng)
    if grammar and grammar.awaiting:  # the few tokens that would set off a trigger badly are taken out first
        return bonus, _committed(_chosen_from(target, bonus, grammar).sample(rng), grammar, target)
    only = grammar.admitted(target.logits(bonus)) if grammar else None
    return bonus, _committed(target.draw(bonus, rng, only), grammar, target)


def fits(target: Context, tree: DraftTree) -> bool:
    """Whether the target can verify the tree: room for its branches, rows it can read, and its nodes and
    root in one batch."""
    return target.reads_trees and len(tree.leaves()) <= target.branch_room and len(tree) < target.max_rows


def verify_tree(target: Context, tree: DraftTree, choice: Choice) -> tuple[list[int], int, int, list[int]]:
    """Walk a draft tree the target has decoded (after the last committed token) as its rows say
    (engine/tree.py), each row's choice masked by the grammar as it stands after the path above it (and cut at
    Mirostat's mu after it), and keep the path: (the tokens kept, the target's own next token, the rank of the
    branch it took, the rows each of those tokens was chosen at: the root's, then each kept node's)."""
    grammar = choice.grammar
    if choice.sampling.greedy:
        argmax = target.token if grammar is None else lambda row: grammar.best(target.logits(row))
        path, own = tree_greedy(tree, argmax, grammar.accept if grammar else lambda token: None)
        own = _committed(own, grammar, target)
    else:
        path, own = tree_sampled(tree, lambda row: choice.p(target, row), choice.rng, choice.follow)
        own = choice.committed(own, target)
    target.keep_path(path)
    return [tree.tokens[node] for node in path], own, tree.rank(path), [0, *(node + 1 for node in path)]


def _chosen_from(target: Context, row: int, grammar: Grammar | None) -> Dist:
    """p: what the target's sampler chain keeps of a row, among the tokens the grammar admits."""
    if grammar is None:
        return softmax(*target.candidates(row))
    return grammar.restrict(softmax(*target.candidates(row, grammar.admitted(target.logits(row)))))


def _committed(token: int, grammar: Grammar | None, target: Context) -> int:
    """The target's own token, followed by the grammar (an end-of-generation token ends it instead)."""
    if grammar and not target.model.is_eog(token):
        grammar.accept(token)
    return token
