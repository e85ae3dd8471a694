"""Structured output: a grammar masks the target's choices, and speculation under it stays lossless."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest

import localspec.engine.speculative as speculative
from localspec.config import Limits, Sampling, Speculation
from localspec.engine.drafters import ModelDrafter, NgramDrafter, NoDrafter
from localspec.engine.grammar import Grammar, from_json_schema, json_object
from localspec.engine.sampling import transform
from localspec.errors import InputError
from localspec.events import Token
from localspec.stats import record
from test_lossless import ALPHA, FLOOR, LENGTH, SAMPLES, chi_square_p_value

# vowels, then two consonants, then letters until a full stop: every position masks, in a different way
LETTERS = r'root ::= [aeiou] [b-df-hj-np-tv-z]{2} [a-z]{0,30} "."'
SHAPE = re.compile(r"[aeiou][b-df-hj-np-tv-z]{2}[a-z]{0,30}\.")


def text(target, tokens) -> str:
    return b"".join(target.model.piece(t) for t in tokens).decode()


def test_the_grammar_says_which_tokens_come_next_and_follows_what_is_committed(target):
    with Grammar(target.model.vocab, LETTERS) as grammar:
        pieces = {target.model.piece(int(t)) for t in grammar.admitted(np.zeros(target.model.n_vocab, np.float32))}
        assert {b"a", b"e", b"i", b"o", b"u"} <= pieces and b"b" not in pieces
        a, b = (target.model.tokenize(c, add_special=False, parse_special=False)[-1] for c in "ab")
        assert grammar.admits(a) and not grammar.admits(b)
        logits = np.zeros(target.model.n_vocab, np.float32)
        logits[b] = 9.0  # the row's favourite is refused: the best admitted token is chosen instead
        logits[a] = 1.0
        assert grammar.best(logits) == a
        grammar.accept(a)
        assert grammar.admits(b) and not grammar.admits(a)


def test_a_grammar_that_does_not_compile_or_admits_nothing_is_one_error(target):
    with pytest.raises(InputError, match="the grammar does not compile"):
        Grammar(target.model.vocab, 'root ::= "unclosed')
    with Grammar(target.model.vocab, 'root ::= "\u00e9t\u00e9"') as grammar:  # no tiny token spells it but bytes
        assert grammar.admitted(np.zeros(target.model.n_vocab, np.float32)).size
    with pytest.raises(InputError, match="cannot be turned into a grammar"):
        from_json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})


def greedy(target, drafter, prompt, grammar=LETTERS, tokens=40):
    events = speculative.generate(target, drafter, prompt, Sampling(temperature=0, grammar=grammar),
                                  Speculation(draft_max=4, p_min=0.0), Limits(max_tokens=tokens))
    return record(events)


@pytest.mark.parametrize("kind", ["draft model", "ngram"])
def test_greedy_text_under_a_grammar_is_the_same_with_and_without_speculation(load, target, prompt, kind):
    plain = greedy(target, NoDrafter(), prompt)
    assert SHAPE.fullmatch(plain.text) and plain.finish_reason == "stop"
    drafter = ModelDrafter(load("partial"), 0.0, target.model.n_vocab) if kind == "draft model" else NgramDrafter(1, 3)
    drafted = greedy(target, drafter, prompt)
    assert drafted.text == plain.text
    assert drafted.summary().drafted > 0  # it did draft, and the grammar refused what it had to


def test_a_json_schema_gives_json_that_validates(target, prompt):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
              "required": ["ok", "n"], "additionalProperties": False}
    out = greedy(target, NoDrafter(), prompt, from_json_schema(schema), tokens=200)
    value = json.loads(out.text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and isinstance(value["n"], int)
    # any JSON object: a random model's strings run on, but what it writes opens an object
    assert greedy(target, NoDrafter(), prompt, json_object(), tokens=8).text.startswith("{")


def masked_distribution(target, prompt, sampling) -> dict[tuple, float]:
    """exact_distribution of test_lossless with the grammar's mask applied at every prefix."""
    probabilities: dict[tuple, float] = {}

    def walk(prefix: list[int], mass: float) -> None:
        target.truncate(0)
        target.decode(prompt + prefix, logits="last")
        with Grammar(target.model.vocab, sampling.grammar) as grammar:
            for token in prefix:
                grammar.accept(token)
            logits = np.full(target.model.n_vocab, -np.inf, np.float32)
            admitted = grammar.admitted(target.logits(-1))
            logits[admitted] = target.logits(-1)[admitted]
        p = transform(logits, sampling)
        for token, p_token in zip(p.ids.tolist(), p.probs.tolist()):
            reach = mass * p_token
            if reach < FLOOR:
                continue
            if len(prefix) + 1 == LENGTH or target.model.is_eog(token):
                probabilities[tuple(prefix + [token])] = reach
            else:
                walk(prefix + [token], reach)

    walk([], 1.0)
    return probabilities


@pytest.mark.parametrize("kind", ["draft model", "plain"])
def test_sampling_under_a_grammar_follows_the_targets_masked_distribution(load, target, prompt, kind):
    sampling = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, grammar=LETTERS)
    drafter = ModelDrafter(load("partial"), 0.0, target.model.n_vocab) if kind == "draft model" else NoDrafter()
    counts = {}
    for seed in range(SAMPLES):
        events = speculative.generate(target, drafter, prompt, replace(sampling, seed=seed),
                                      Speculation(draft_max=3, p_min=0.0), Limits(max_tokens=LENGTH))
        outcome = tuple(e.id for e in events if isinstance(e, Token))
        counts[outcome] = counts.get(outcome, 0) + 1
    assert all(text(target, outcome)[0] in "aeiou" for outcome in counts)  # the mask held on every draw
    assert chi_square_p_value(counts, masked_distribution(target, prompt, sampling)) > ALPHA
