"""Draft trees from the free drafters: the alternatives n-gram lookup and the suffix cache hold beside the
chain they bet on, the trees fixed drafting grows of them, and what auto makes of them."""

import copy
from dataclasses import replace

import numpy as np
import pytest

from localspec.config import DrafterKind, Limits, Sampling, Speculation
from localspec.engine.belief import Belief
from localspec.engine.backend import Context, Part, decode_together
from localspec.engine.library import llama
from localspec.engine.drafters import Draft, ModelDrafter, NgramDrafter, NoDrafter
from localspec.engine.drafters import forward
from localspec.engine.drafters.forward import drawn_siblings, runner_ups
from localspec.engine.model import Model
from localspec.engine.adjustments import Adjustments
from localspec.engine.policy import AutoDrafter
from localspec.engine.sampling import Dist
from localspec.engine.speculative import generate
from localspec.engine.suffix import SuffixCache
from localspec.engine.tree import ROOT, Alternative, DraftTree
from localspec.errors import EngineError
from localspec.events import Step, Token
from localspec.stats import record

from test_grammar import LETTERS, masked_distribution
from test_grammar import greedy as grammar_greedy
from test_lossless import (ALPHA, PENALISED, SETTINGS, chi_square_p_value, decoded_row, exact_distribution,
                           own_continuation, penalised, sample_counts)
from sequences import run_alone, run_together
from test_policy import GPU_LIKE, costs

GREEDY = Sampling(temperature=0.0)
KEPT_PATH_ROWS = 1e-2


def test_a_forked_tree_holds_the_chain_first_and_each_alternative_below_its_fork():
    chain = [10, 11, 12, 13]
    tree = DraftTree.forked(chain, [Alternative(2, 2, (20, 21, 22)), Alternative(0, 3, (30,)),
                                    Alternative(0, 2, (40, 41)), Alternative(4, 2, (50,))])
    # the fork at 0 first (rank 2 before rank 3), then the fork at 2 cut to end as deep as the chain;
    # the one beyond the chain left out
    assert tree.tokens == (10, 11, 12, 13, 40, 41, 30, 20, 21)
    assert tree.parents == (ROOT, 0, 1, 2, ROOT, 4, ROOT, 1, 7)
    assert max(tree.depths()) == len(chain) - 1
    assert tree.rank([0, 1, 2, 3]) == 1 and tree.rank([4, 5]) == 2 and tree.rank([6]) == 3
    assert tree.rank([0, 1, 7, 8]) == 2 and tree.rank([]) == 1


def test_the_suffix_cache_holds_the_runner_up_continuations_at_its_branch_points():
    cache = SuffixCache(depth=4, min_probability=0.05)
    cache.extend([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 9, 8, 7], [1, 2, 3, 4, 5, 16, 17]])
    found = cache.propose([0, 1, 2, 3], 6, alternatives=3)
    assert found.tokens == cache.propose([0, 1, 2, 3], 6).tokens == [4, 5, 6, 7]
    assert {(a.fork, a.rank, a.tokens) for a in found.alternatives} == {(0, 2, (9, 8, 7)), (2, 2, (16, 17))}
    assert [a.share for a in found.alternatives] == pytest.approx([1 / 3, 1 / 4])  # the likeliest first
    assert len(cache.propose([0, 1, 2, 3], 6, alternatives=1).alternatives) == 1
    assert cache.propose([0, 1, 2, 3], 6).alternatives == ()


def test_ngram_lookup_holds_the_other_continuations_of_its_match():
    history = [1, 2, 7, 7, 7, 5, 1, 2, 8, 8, 8, 5, 1, 2, 9, 9, 9, 5, 1, 2, 8, 8, 5, 1, 2]
    ngram = NgramDrafter(2, 2, alternatives=2)
    ngram.begin(history, Sampling(), None)
    draft = ngram.propose(history, 4)
    assert draft.tokens == [8, 8, 5, 1] and draft.tree is None  # the latest occurrence's; no tree asked
    # 8 followed twice, 7 and 9 once each: the others by count, the later first among equals
    assert [(a.fork, a.rank, a.tokens[0]) for a in draft.alternatives] == [(0, 2, 9), (0, 3, 7)]
    assert draft.alternatives[0].tokens == (9, 9, 9, 5) and draft.alternatives[0].share == pytest.approx(0.25)
    trees = NgramDrafter(2, 2, alternatives=2, branching=True)
    trees.begin(history, Sampling(), None)
    tree = trees.propose(history, 4).tree
    assert tree.tokens[:4] == (8, 8, 5, 1) and len(tree.leaves()) == 3 and trees.branches == 3


def greedy(context, prompt: list[int], drafter=None, **speculation) -> list:
    return list(generate(context, drafter or NoDrafter(), prompt, GREEDY, Speculation(**speculation),
                         Limits(max_tokens=24)))


def tokens(events) -> list[int]:
    return [e.id for e in events if isinstance(e, Token)]


def forked_prompt(target) -> list[int]:
    """A prompt ending in a 2-gram G that it holds twice: first followed by what the target goes on to write
    after the prompt, then, later, by something else, which n-gram lookup bets on. Found by writing the
    target's own continuation in until it is what the target writes (a fixed point, in a few rounds)."""
    start = target.model.tokenize("ab ac ad", add_special=True, parse_special=False)
    gram, other, written = [7, 8], [90, 91, 92, 93], [50, 51, 52, 53]
    for _ in range(8):
        prompt = start + gram + written + gram + other + gram
        now = tokens(greedy(target, prompt))[:4]
        if now == written:
            return prompt
        written = now
    raise AssertionError("the tiny target's continuation found no fixed point")


def test_fixed_ngram_trees_keep_greedy_output_the_targets_and_take_the_runner_up(branching, load):
    target = load("target")
    prompt = forked_prompt(target)
    events = greedy(branching, prompt, NgramDrafter(2, 2, alternatives=2, branching=True), draft_max=4)
    assert tokens(events) == tokens(greedy(target, prompt))
    steps = [e for e in events if isinstance(e, Step)]
    first = steps[0]  # the chain bet on the later continuation; the runner-up was the target's
    assert (first.branches, first.rank, first.accepted) == (2, 2, 4)
    assert all(step.rank >= 1 for step in steps if step.branches > 1)
    assert all(step.branches == step.rank == 0 for step in steps if step.branches <= 1)
    chains = greedy(branching, prompt, NgramDrafter(2, 2), draft_max=4)
    assert [e for e in chains if isinstance(e, Step)][0].accepted == 0


def test_ngram_alternatives_go_on_to_shorter_matches_where_the_longest_went_on_one_way():
    history = [5, 1, 2, 7, 7, 6, 1, 2, 8, 8, 5, 1, 2, 9, 9, 5, 1, 2]
    ngram = NgramDrafter(2, 3, alternatives=3)
    ngram.begin(history, Sampling(), None)
    draft = ngram.propose(history, 2)
    assert draft.tokens == [9, 9]  # "5 1 2" last went on with 9
    # its other follower first, then what "1 2" alone was followed by: 8, never after "5 1 2"
    assert [(a.rank, a.tokens) for a in draft.alternatives] == [(2, (7, 7)), (3, (8, 8))]


@pytest.mark.parametrize("setting", ["temperature 0.7", "top-k 5", "xtc", "mirostat 2", "mirostat 1"])
def test_fixed_ngram_trees_keep_the_target_distribution(branching, prompt, setting):
    sampling = SETTINGS[setting]
    counts = sample_counts(branching, NgramDrafter(1, 1, alternatives=2, branching=True), prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(branching, prompt, sampling)) > ALPHA


# Two patterns after the same two tokens, in no order a chain can learn: the latest occurrence's
# continuation is right half the time, the other one the other half.
PATTERNS = {0: [1, 2, 30, 31, 32, 33], 1: [1, 2, 40, 41, 42, 43]}
ORDER = [0, 1, 1, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1, 0] * 3
TEXT = [token for pattern in ORDER for token in PATTERNS[pattern]]
STEEP = {1: 0.050, 2: 0.100, 9: 0.450}  # every row costs as much as a plain step


def write(auto, text: list[int], start: int) -> list:
    """The engine writing a known (greedy) text, tree or chain: the drafts it was handed."""
    history, drafts = list(text[:start]), []
    while len(history) < len(text) - 1:
        draft = auto.propose(history, min(6, len(text) - len(history) - 1))
        ahead, kept = text[len(history):], []
        if draft.tree is not None:
            node = ROOT
            while (child := next((c for c in draft.tree.children(node)
                                  if draft.tree.tokens[c] == ahead[len(kept)]), None)) is not None:
                kept.append(child)
                node = child
        else:
            kept = [i for i, _ in enumerate(next(([*draft.tokens[:i]] for i in range(len(draft.tokens), -1, -1)
                                                  if draft.tokens[:i] == ahead[:i]), []))]
        seconds = auto.costs.verify_seconds(draft.size + 1)
        auto.observe(Step(draft.source, draft.size, len(kept), 0.0, seconds))
        history += ahead[: len(kept) + 1]
        drafts.append(draft)
    return drafts


def auto_on(verify: dict[int, float], branches: int) -> AutoDrafter:
    ngram = NgramDrafter(2, 2, alternatives=branches - 1)
    auto = AutoDrafter(ngram, [], costs(verify, 0.01), branches=branches)
    auto.begin(TEXT[:12], Sampling(), None)
    return auto


def test_auto_grows_trees_where_extra_rows_cost_little_and_learns_the_runner_up_from_the_text():
    auto = auto_on(GPU_LIKE, branches=2)
    drafts = write(auto, TEXT, 12)
    trees = [d for d in drafts if d.tree is not None]
    assert len(trees) > len(drafts) / 4
    assert auto.ranks[(DrafterKind.NGRAM, 2)].mean > 0.8  # the runner-up was right wherever the chain was not


def test_auto_grows_no_tree_where_rows_cost_what_a_step_does_nor_without_room():
    assert all(d.tree is None for d in write(auto_on(STEEP, branches=2), TEXT, 12))
    assert all(d.tree is None for d in write(auto_on(GPU_LIKE, branches=1), TEXT, 12))


def test_a_tree_is_grown_by_what_the_text_showed_of_the_runner_up():
    learned = auto_on(GPU_LIKE, branches=2)
    write(learned, TEXT[:60], 12)
    at_a_fork = TEXT[:62]  # a pattern's first two tokens: either continuation may follow
    grown = {}
    for chance in (0.9, 0.0):
        auto = copy.deepcopy(learned)
        auto.ranks[(DrafterKind.NGRAM, 2)] = Belief(1000 * chance, 1000 * (1 - chance))
        grown[chance] = auto.propose(at_a_fork, 6).tree
    assert grown[0.9] is not None and len(grown[0.9].leaves()) == 2 and grown[0.0] is None


def test_a_greedy_draft_holds_the_likeliest_runner_ups_of_its_positions():
    q = [Dist(np.array([5, 7, 8]), np.array([0.6, 0.3, 0.1])), Dist(np.array([9, 6]), np.array([0.15, 0.85]))]
    assert runner_ups([5, 6], q, 2) == (Alternative(0, 2, (7,), 0.3), Alternative(1, 2, (9,), 0.15))
    assert runner_ups([5, 6], q, 1) == (Alternative(0, 2, (7,), 0.3),)


def test_fixed_draft_model_trees_keep_greedy_output_the_targets_and_take_runner_ups(branching, load, prompt):
    drafter = ModelDrafter(load("partial"), 0.0, branching.model.n_vocab)
    drafter.alternatives, drafter.branching = 2, True
    events = greedy(branching, prompt, drafter, draft_max=3)
    assert tokens(events) == tokens(greedy(load("target"), prompt))
    trees = [e for e in events if isinstance(e, Step) and e.branches]
    assert len(trees) == len([e for e in events if isinstance(e, Step) and e.drafted])
    assert any(step.rank > 1 for step in trees)  # a runner-up was the target's where the draft's likeliest was not


class Runner:
    """A costly drafter of known drafts: the next tokens of a text, each with a wrong runner-up, or, where
    `wrong` says, the wrong token first and the text's own as its runner-up."""

    kind = DrafterKind.DRAFT

    def __init__(self, text: list[int], wrong: set[int]):
        self.text, self.wrong = text, wrong

    def begin(self, prompt, sampling, rng):
        pass

    def prepare(self, sampling, rng):
        pass

    def behind(self, history):
        return 0

    def propose(self, history, k):
        at, tokens, others = len(history), [], []
        for fork, token in enumerate(self.text[len(history): len(history) + k]):
            drafted, other = (token + 1000, token) if at + fork in self.wrong else (token, token + 1000)
            tokens.append(drafted)
            others.append(Alternative(fork, 2, (other,), 0.3))
        return Draft(tokens, source=self.kind, alternatives=tuple(others))


def test_auto_grows_a_draft_models_runner_ups_where_the_text_showed_they_are_right():
    text = list(range(100, 400))
    wrong = set(range(10, 400, 5))  # every fifth token is the draft's runner-up
    auto = AutoDrafter(NgramDrafter(2, 2), [Runner(text, wrong)], costs(GPU_LIKE, 0.0001), branches=2)
    auto.begin(text[:10], Sampling(), None)
    history, kept_by_runner_ups = text[:10], 0
    while len(history) < 200:
        draft = auto.propose(history, 6)
        ahead, kept = text[len(history):], 0
        if draft.tree is not None:
            node = ROOT
            while (child := next((c for c in draft.tree.children(node)
                                  if draft.tree.tokens[c] == ahead[kept]), None)) is not None:
                kept_by_runner_ups += child >= len(draft.tokens)
                kept, node = kept + 1, child
        else:
            kept = next((i for i, (a, b) in enumerate(zip(draft.tokens, ahead)) if a != b), len(draft.tokens))
        auto.observe(Step(draft.source, draft.size, kept, 0.0001 * len(draft.tokens),
                          auto.costs.verify_seconds(draft.size + 1)))
        history += ahead[: kept + 1]
    assert auto.ranks[(DrafterKind.DRAFT, 2)].mean > 0.8 and kept_by_runner_ups > 5


@pytest.fixture(scope="module")
def on_backend(tiny):
    """The tiny target with room for three branches, by what it samples in the decode graph: every chain
    (True) or an argmax chain only (None)."""
    models, contexts = [], {}
    for kind in (True, None):
        models.append(Model(tiny["target"]))
        contexts[kind] = Context(models[-1], 256, 64, threads=2, backend_sampling=kind, max_outputs=64, branches=3)
    yield contexts
    for context, model in zip(contexts.values(), models):
        context.close()
        model.close()


@pytest.mark.parametrize("kind", [True, None], ids=["every chain", "an argmax chain"])
def test_on_the_backend_a_trees_rows_are_sampled_by_its_branches_own_samplers(load, on_backend, kind):
    target, context = load("target"), on_backend[kind]
    prompt = forked_prompt(target)
    events = greedy(context, prompt, NgramDrafter(2, 2, alternatives=2, branching=True), draft_max=4)
    assert context.on_backend and context.reads_trees
    assert tokens(events) == tokens(greedy(target, prompt))
    first = [e for e in events if isinstance(e, Step)][0]
    assert (first.branches, first.rank, first.accepted) == (2, 2, 4)


@pytest.mark.parametrize("setting", ["temperature 0.7", "top-k 5"])
def test_trees_sampled_on_the_backend_keep_the_target_distribution(on_backend, load, prompt, setting):
    sampling, context = SETTINGS[setting], on_backend[True]
    counts = sample_counts(context, NgramDrafter(1, 1, alternatives=2, branching=True), prompt, sampling)
    assert context.on_backend
    assert chi_square_p_value(counts, exact_distribution(load("target"), prompt, sampling)) > ALPHA


def test_logprobs_are_read_from_the_rows_of_the_branch_kept(branching, load):
    target = load("target")
    prompt = forked_prompt(target)
    reporting = Sampling(temperature=0.0, logprobs=3)

    def run(context, drafter):
        return list(generate(context, drafter, prompt, reporting, Speculation(draft_max=4), Limits(max_tokens=16)))

    plain = [e for e in run(target, NoDrafter()) if isinstance(e, Token)]
    events = run(branching, NgramDrafter(2, 2, alternatives=2, branching=True))
    assert [e for e in events if isinstance(e, Step)][0].rank == 2  # the runner-up's rows were read
    treed = [e for e in events if isinstance(e, Token)]
    assert [t.id for t in treed] == [t.id for t in plain]
    # within the KV cache's F16 rounding: after a kept path, rows read cells in another order (test_tree's
    # measured 1.3e-3 of a logit); a row of a branch not kept would be off by whole logits
    for alone, verified in zip(plain, treed):
        assert verified.logprobs.chosen.logprob == pytest.approx(alone.logprobs.chosen.logprob, abs=KEPT_PATH_ROWS)
        assert [c.id for c in verified.logprobs.top] == [c.id for c in alone.logprobs.top]


@pytest.fixture(scope="module")
def branching_sequences(tiny):
    """Four sequences of one context on the tiny target, each with room for trees of three branches."""
    model = Model(tiny["target"])
    context = Context(model, 256, 64, threads=2, max_outputs=64, n_seq=4, branches=3)
    yield [context] + [context.sequence(seq) for seq in range(1, 4)]
    context.close()
    model.close()


def test_parallel_sequences_verify_their_trees_in_one_batch_each_as_alone(branching_sequences, load):
    target = load("target")
    forked = forked_prompt(target)
    prompts = [forked, target.model.tokenize("the cat sat on the mat", add_special=True, parse_special=False),
               forked, forked[:-3] + forked[-2:]]
    drafters = [NgramDrafter(2, 2, alternatives=2, branching=True).for_sequence() for _ in prompts]
    assert all(drafter.branches == 3 for drafter in drafters)
    got, steps = run_together(branching_sequences, prompts, drafters)
    assert [got[i] for i in range(len(prompts))] == [run_alone(target, prompt, NoDrafter()) for prompt in prompts]
    # the forked prompts' first steps: trees, verified beside the other sequences' rows, the runner-up kept
    for key in (0, 2):
        first = steps[key][0]
        assert (first.branches, first.rank, first.accepted) == (2, 2, 4) and first.batch_rows > 0
    for sequence in branching_sequences:
        sequence.check_holds(sequence.tokens)
        for branch in range(sequence._first_branch, sequence._first_branch + sequence.branch_room):
            assert llama.llama_memory_seq_pos_max(sequence._memory, branch) == -1  # no branch left behind


def test_a_failed_joint_decode_beside_a_tree_leaves_every_sequence_and_branch_as_it_was(branching_sequences, load):
    model = load("target").model
    for sequence in branching_sequences[:2]:
        sequence.truncate(0)
        sequence.decode(model.tokenize("the cat", add_special=True, parse_special=False), logits="none")
    before = [list(sequence.tokens) for sequence in branching_sequences[:2]]
    tree = DraftTree.forked([5, 6, 7], [Alternative(0, 2, (8, 9))])
    with pytest.raises(EngineError):  # more rows than a batch
        decode_together([Part(branching_sequences[0], [4], tree=tree), Part(branching_sequences[1], [5] * 60, "none")])
    assert [sequence.tokens for sequence in branching_sequences[:2]] == before
    for sequence in branching_sequences[:2]:
        sequence.check_holds(sequence.tokens)
        assert llama.llama_memory_seq_pos_max(sequence._memory, sequence._first_branch) == -1
    assert all(branching_sequences[0]._batch.n_seq_id[i] == 1 for i in range(64))


def test_sequences_share_out_what_sequence_ids_llama_cpp_has_for_branches(tiny):
    model = Model(tiny["target"])
    try:
        contexts = [Context(model, 256, 512, threads=2, max_outputs=16, n_seq=64, branches=16),
                    Context(model, 256, 16, threads=2, max_outputs=16, n_seq=4, branches=16)]
        try:
            many, few = contexts
            last = many.sequence(63)
            assert many.branch_room == (llama.llama_max_parallel_sequences() - 64) // 64 == 3
            assert many._first_branch == 64 and last._first_branch == 64 + 63 * 3
            assert last._first_branch + last.branch_room <= llama.llama_max_parallel_sequences()
            assert few.branch_room == (16 - 4) // 4  # an output row for each sequence id in a batch of 16
        finally:
            for context in contexts:
                context.close()
    finally:
        model.close()


def tree_steps(events) -> list[Step]:
    return [e for e in events if isinstance(e, Step) and e.branches > 1]


def test_greedy_trees_under_a_grammar_write_plain_decodings_text(branching, load):
    target = load("target")
    prompt = target.model.tokenize("abcabcabcabc", add_special=True, parse_special=False)
    words = r'root ::= [a-z ]{20,40} "."'
    plain = grammar_greedy(target, NoDrafter(), prompt, words).text
    events = list(generate(branching, NgramDrafter(1, 3, alternatives=2, branching=True), prompt,
                           Sampling(temperature=0, grammar=words), Speculation(draft_max=4, p_min=0.0),
                           Limits(max_tokens=40)))
    assert record(events).text == plain
    assert any(step.rank == 2 for step in tree_steps(events))  # a runner-up kept under the mask


def test_sampled_trees_under_a_grammar_follow_the_targets_masked_distribution(branching, load, prompt):
    target = load("target")
    sampling = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, grammar=LETTERS)
    counts = sample_counts(branching, NgramDrafter(1, 1, alternatives=2, branching=True), prompt, sampling)
    assert chi_square_p_value(counts, masked_distribution(target, prompt, sampling)) > ALPHA


@pytest.fixture(scope="module")
def penalty_window(load):
    target = load("target")
    return own_continuation(target, target.model.tokenize("abcabcabcabc", add_special=True, parse_special=False))


# greedy under penalties, where the tiny target's text from PROMPT_TEXT keeps a runner-up in a tree
GREEDY_PENALISED = Sampling(temperature=0, repeat_penalty=1.1, presence_penalty=0.5)


def test_greedy_trees_under_penalties_write_plain_decodings_text(branching, load, prompt):
    target = load("target")

    def run(context, drafter, sampling=GREEDY_PENALISED):
        return list(generate(context, drafter, prompt, sampling, Speculation(draft_max=3, p_min=0.0),
                             Limits(max_tokens=40)))

    events = run(branching, NgramDrafter(1, 2, alternatives=2, branching=True))
    assert tokens(events) == tokens(run(target, NoDrafter()))
    assert any(step.rank == 2 for step in tree_steps(events))  # a runner-up's row, penalised for its own path
    assert tokens(run(target, NoDrafter(), GREEDY)) != tokens(events)  # the penalties changed the text


@pytest.mark.parametrize("verifier", ["right", "leaving a tree's rows unpenalised"])
def test_sampled_trees_under_penalties_keep_the_target_distribution(branching, load, penalty_window, verifier,
                                                                     monkeypatch):
    if verifier != "right":
        monkeypatch.setattr(Adjustments, "apply_tree", lambda self, rows, history, tree: None)
    counts = sample_counts(branching, NgramDrafter(1, 1, alternatives=2, branching=True), penalty_window, PENALISED)
    p_value = chi_square_p_value(counts, exact_distribution(load("target"), penalty_window, PENALISED))
    assert p_value > ALPHA if verifier == "right" else p_value < ALPHA


def test_each_tree_row_is_penalised_for_the_path_above_it(branching, load, penalty_window):
    """Row by row against llama.cpp's penalties over plain decoding's rows: the drafted tokens repeat the
    window's, so each path moves the counts its own way (the chain's prefixes read other rows here)."""
    window, target = penalty_window, load("target")
    chain = window[-4:-1]
    other = next(token for token in reversed(window) if token != chain[0])
    tree = DraftTree.forked(chain, [Alternative(0, 2, (other, chain[0]))])
    branching.prefill(window[:-1])
    branching.decode_tree(tree, window[-1])
    rows = [branching.logits(row).copy() for row in range(1 + len(tree))]
    branching.keep_path([])
    Adjustments(PENALISED).apply_tree(rows.__getitem__, window, tree)
    before = tree.prefixes()
    assert before[-1] == [other, chain[0]] and before[3] == chain
    for row, path in zip(rows, before):
        expected = penalised(decoded_row(target, window, path), window + path, PENALISED)
        assert np.allclose(row, expected, atol=KEPT_PATH_ROWS)
    chain_rows = [penalised(decoded_row(target, window, chain[:len(path)]), window + chain[:len(path)], PENALISED)
                  for path in before]
    assert not np.allclose(rows[-1], chain_rows[-1], atol=KEPT_PATH_ROWS)


def test_logprobs_beside_trees_under_penalties_are_the_models_own_rows(branching, load, prompt):
    target, reporting = load("target"), replace(GREEDY_PENALISED, logprobs=3)

    def run(context, drafter):
        return list(generate(context, drafter, prompt, reporting, Speculation(draft_max=3, p_min=0.0),
                             Limits(max_tokens=40)))

    plain = [e for e in run(target, NoDrafter()) if isinstance(e, Token)]
    events = run(branching, NgramDrafter(1, 2, alternatives=2, branching=True))
    assert any(step.rank == 2 for step in tree_steps(events))
    treed = [e for e in events if isinstance(e, Token)]
    assert [t.id for t in treed] == [t.id for t in plain]
    for alone, verified in zip(plain, treed):
        assert verified.logprobs.chosen.logprob == pytest.approx(alone.logprobs.chosen.logprob, abs=KEPT_PATH_ROWS)
        assert [c.id for c in verified.logprobs.top] == [c.id for c in alone.logprobs.top]


def test_a_sampled_draft_draws_siblings_where_q_is_spread_whatever_was_drawn():
    spread, peaked = Dist(np.array([5, 6, 7]), np.array([0.4, 0.35, 0.25])), Dist(np.array([8, 9]), np.array([0.9, 0.1]))
    for seed in range(20):
        found = drawn_siblings([peaked, spread, spread, spread], 2, np.random.default_rng(seed))
        assert [(a.fork, a.rank) for a in found] == [(1, 2), (2, 2)]  # the first two spread positions, every time
        assert all(a.tokens[0] in (5, 6, 7) and a.share == pytest.approx(1 - 0.4**2 - 0.35**2 - 0.25**2) for a in found)
    draws = [drawn_siblings([spread], 1, np.random.default_rng(seed))[0].tokens[0] for seed in range(600)]
    assert {token: draws.count(token) / 600 for token in (5, 6, 7)} == pytest.approx({5: 0.4, 6: 0.35, 7: 0.25},
                                                                                     abs=0.06)
    tree = DraftTree.forked([5, 8], [Alternative(0, 2, (6,))], [spread, peaked])
    assert tree.tokens == (5, 8, 6) and tree.dists == (spread, peaked, spread)  # the sibling's q is its fork's


def sampled_tree_drafter(load, branching):
    drafter = ModelDrafter(load("partial"), 0.0, branching.model.n_vocab)
    drafter.alternatives, drafter.branching = 2, True
    return drafter


@pytest.mark.parametrize("setting", ["temperature 0.7", "top-k 5", "xtc", "mirostat 2", "mirostat 1"])
def test_fixed_sampled_draft_model_trees_keep_the_target_distribution(branching, load, prompt, setting):
    sampling = SETTINGS[setting]
    drafter = sampled_tree_drafter(load, branching)
    counts = sample_counts(branching, drafter, prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(load("target"), prompt, sampling)) > ALPHA


def test_sampled_draft_model_trees_are_verified_and_keep_siblings(branching, load, prompt):
    drafter, kept = sampled_tree_drafter(load, branching), []
    for seed in range(40):
        events = generate(branching, drafter, prompt, replace(SETTINGS["temperature 0.7"], seed=seed),
                          Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=12))
        kept += [step.rank for step in tree_steps(events)]
    assert len(kept) > 40 and kept.count(2) > 5  # a sibling drawn beside the chain was what the target kept


def test_siblings_chosen_by_what_the_chain_drew_fail_the_check(branching, load, prompt, monkeypatch):
    """A sibling must be an independent draw from q: one chosen by what the chain drew (q's likeliest token
    where the chain drew another, a greedy draft's runner-up) is no such draw, and the multi-draft rule then
    no longer keeps p."""
    forked = DraftTree.forked

    def likeliest_where_the_chain_missed(chain, alternatives, dists=None):
        made = []
        for other in alternatives:
            q = dists[other.fork]
            likeliest = int(q.ids[np.argmax(q.probs)])
            if chain[other.fork] != likeliest:
                made.append(replace(other, tokens=(likeliest,)))
        return forked(chain, made, dists)

    monkeypatch.setattr(forward.DraftTree, "forked", staticmethod(likeliest_where_the_chain_missed))
    sampling = SETTINGS["temperature 0.7"]
    counts = sample_counts(branching, sampled_tree_drafter(load, branching), prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(load("target"), prompt, sampling)) < ALPHA


class Drawn:
    """A costly drafter whose sampled drafts are set by the test: tokens, their q, siblings."""

    kind = DrafterKind.DRAFT
    draft = Draft()

    def begin(self, prompt, sampling, rng):
        pass

    def prepare(self, sampling, rng):
        pass

    def behind(self, history):
        return 0

    def propose(self, history, k):
        return self.draft


def test_auto_grows_a_sampled_drafts_siblings_by_nothing_drawn_at_their_fork_or_after():
    """Whether a node gets its sibling must not depend on what was drawn at it or after (how long the chain
    went on, the siblings it drew further down): weighed best first and for the chain's own length instead,
    the second draft's sibling at 1 gives way to the one at 3, which the others lack."""
    spread = Dist(np.array([5, 6, 7, 8]), np.array([0.3, 0.3, 0.2, 0.2]))
    drawn, history = Drawn(), list(range(200, 210))
    auto = AutoDrafter(NgramDrafter(2, 2), [drawn], costs(GPU_LIKE, 0.0001), branches=2)
    auto.begin(history, SETTINGS["temperature 0.7"], None)
    for step in range(40):  # the draft's second token is right 3 times in 5, its fourth never
        drawn.draft = Draft([5, 6, 7, 8, 5, 6], [spread] * 6, source=DrafterKind.DRAFT)
        draft = auto.propose(history, 6)
        auto.observe(Step(DrafterKind.DRAFT, draft.size, 3 if step % 5 < 3 else 1, 0.0001 * draft.size,
                          auto.costs.verify_seconds(draft.size + 1)))
    grown = {}
    # the same draft up to its second token and the sibling there; after it, each goes on its own way
    for name, tokens, siblings in [("short", [5, 6], [(1, 7)]), ("long", [5, 6, 8, 5, 7, 7], [(1, 7), (3, 6)]),
                                   ("a sibling next", [5, 6, 7, 7], [(1, 7), (2, 5)])]:
        drawn.draft = Draft(tokens, [spread] * len(tokens), source=DrafterKind.DRAFT,
                            alternatives=tuple(Alternative(fork, 2, (token,), 0.75) for fork, token in siblings))
        tree = auto.propose(history, 6).tree
        grown[name] = tree is not None and len(tree.children(0)) == 2  # the sibling at 1, beside the chain's
        assert tree is None or tree.dists is not None and all(q is spread for q in tree.dists)
    assert grown == {"short": True, "long": True, "a sibling next": True}


def test_auto_with_sampled_draft_trees_keeps_the_target_distribution(branching, load, prompt, monkeypatch):
    drafter = ModelDrafter(load("partial"), 0.0, branching.model.n_vocab)
    drafter.alternatives = 2
    auto = AutoDrafter(NgramDrafter(1, 1), [drafter], costs(GPU_LIKE, 0.0001), branches=3)
    for learning in ("observe_verify", "observe_draft"):  # a GPU's curve, not learned anew from this CPU's steps
        monkeypatch.setattr(auto.costs, learning, lambda *args: None)
    sampling, trees = SETTINGS["temperature 0.7"], 0
    for seed in range(20):
        events = generate(branching, auto, prompt, replace(sampling, seed=seed), Speculation(draft_max=3, p_min=0.0),
                          Limits(max_tokens=12))
        trees += sum(1 for step in tree_steps(events) if step.drafter == DrafterKind.DRAFT)
    assert trees > 10  # auto grew the draft model's drawn siblings into trees
    counts = sample_counts(branching, auto, prompt, sampling)
    assert chi_square_p_value(counts, exact_distribution(load("target"), prompt, sampling)) > ALPHA


def test_a_fixed_trees_runner_ups_are_drafted_on_as_deep_as_the_chain(branching, load, prompt):
    """Each runner-up goes on as the draft model itself would after it (EAGLE-2's deeper branches)."""
    draft = load("partial")
    drafter = ModelDrafter(draft, 0.0, branching.model.n_vocab)
    drafter.alternatives, drafter.branching = 2, True
    drafter.begin(prompt, GREEDY, np.random.default_rng(0))
    proposed = drafter.propose(prompt, 4)
    assert len(proposed.tokens) == 4 and proposed.alternatives
    for other in proposed.alternatives:
        assert len(other.tokens) == 4 - other.fork
        alone = ModelDrafter(draft, 0.0, branching.model.n_vocab)
        alone.begin([*prompt, *proposed.tokens[: other.fork], other.tokens[0]], GREEDY, np.random.default_rng(0))
        after = alone.propose([*prompt, *proposed.tokens[: other.fork], other.tokens[0]], len(other.tokens) - 1)
        assert list(other.tokens[1:]) == after.tokens
    assert max(proposed.tree.depths()) == 3 and len(proposed.tree) == 4 + sum(len(o.tokens) for o in proposed.alternatives)


def test_fixed_deep_draft_model_trees_keep_greedy_output_the_targets(branching, load, prompt):
    drafter = ModelDrafter(load("partial"), 0.0, branching.model.n_vocab)
    drafter.alternatives, drafter.branching = 2, True
    events = greedy(branching, prompt, drafter, draft_max=4)
    assert tokens(events) == tokens(greedy(load("target"), prompt))
    # a runner-up's own continuation kept: more tokens than the chain's prefix and the runner-up alone
    assert any(step.rank > 1 and step.accepted >= 2 for step in tree_steps(events))
