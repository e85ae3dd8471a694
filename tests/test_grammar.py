"""Structured output: a grammar masks the target's choices, and speculation under it stays lossless."""

import json
import re
import time
from dataclasses import replace

import numpy as np
import pytest

import localspec.engine.grammar as grammar_module
import localspec.engine.speculative as speculative
from localspec.config import DrafterKind, Limits, Sampling, Speculation
from localspec.engine.backend import Context
from localspec.engine.model import Model
from localspec.engine.drafters import ForcedDrafter, ModelDrafter, NgramDrafter, NoDrafter
from localspec.engine.gbnf import (_loosened, converted_pattern, from_choices, from_json_schema, from_regex,
                                   integer_range, json_object)
from localspec.engine.grammar import Grammar
from localspec.engine.sampling import transform
from localspec.errors import InputError
from localspec.events import Token
from localspec.stats import record
from test_lossless import ALPHA, FLOOR, LENGTH, SAMPLES, chi_square_p_value, decoded_row
from tinymodels import LOWERCASE, TinySpec, write_tiny_model

# vowels, then two consonants, then letters until a full stop: every position masks, in a different way
LETTERS = r'root ::= [aeiou] [b-df-hj-np-tv-z]{2} [a-z]{0,30} "."'
SHAPE = re.compile(r"[aeiou][b-df-hj-np-tv-z]{2}[a-z]{0,30}\.")
# after a vowel the grammar admits "st" alone, then a vowel again: a forced text amid the model's choices
FORCING = r'root ::= [aeiou] "st" [aeiou] [a-z]{0,30} "."'


def text(target, tokens) -> str:
    return b"".join(target.model.piece(t) for t in tokens).decode()


def test_the_grammar_says_which_tokens_come_next_and_follows_what_is_committed(target):
    with Grammar(target.model, LETTERS) as grammar:
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


def test_the_grammar_says_what_text_it_alone_admits_without_committing_it(target):
    model = target.model
    a, s = (model.tokenize(c, add_special=False, parse_special=False)[-1] for c in "as")

    def forced(grammar, most=16):
        return grammar.forced_text(model.character_tokens, model.end_tokens, most)

    with Grammar(model, FORCING) as grammar:
        assert forced(grammar) == ("", "aeiou")
        grammar.accept(a)
        assert forced(grammar) == ("st", "aeiou") and forced(grammar, most=1) == ("s", "t")
        assert grammar.admits(s) and not grammar.admits(a)  # asking committed nothing
    with Grammar(model, 'root ::= ("abc" | "abd") "." | "ab"') as grammar:
        assert forced(grammar) == ("ab", "cd")  # then c, d or the end


DEEP = 100_000  # each of these ended the process (SIGSEGV) inside llama.cpp before it was bounded (issue 46)
TOO_DEEP_OR_BIG = {
    "nested": "root ::= " + "(" * DEEP + '"a"' + ")" * DEEP,
    "a chain of rules": "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(DEEP)) + f'r{DEEP} ::= "a"\n',
    "minLength": {"type": "string", "minLength": DEEP},
    "a pattern's repetition": {"type": "string", "pattern": "^a{0,%d}$" % DEEP},
    "minItems": {"type": "array", "items": {"type": "integer"}, "minItems": DEEP},
}


@pytest.mark.parametrize("case", list(TOO_DEEP_OR_BIG))
def test_a_grammar_too_deep_or_too_big_to_compile_safely_is_one_error(target, case):
    grammar = TOO_DEEP_OR_BIG[case]
    with pytest.raises(InputError, match="at most"):
        Grammar(target.model, grammar if isinstance(grammar, str) else from_json_schema(grammar))


def test_an_upper_bound_beyond_what_a_grammar_can_nest_is_let_go_as_llama_cpps_parser_lets_one_go(target):
    """Claude Code offers a tool whose script may be 524,288 characters long: its every request was refused ("at
    most 1,000 are taken"). An upper bound beyond what llama.cpp compiles is let go (any length admitted there); one
    within it is held."""
    for key, schema in (("maxLength", {"type": "string"}), ("maxItems", {"type": "array", "items": {"type": "integer"}}),
                        ("maxProperties", {"type": "object"})):
        loose = from_json_schema({**schema, key: 524_288})
        assert loose == from_json_schema(schema)
        Grammar(target.model, loose).close()
    # (a value the schema gives, its default, is no schema: kept as given)
    assert _loosened({"type": "object", "default": {"maxLength": 524_288}}) == {"type": "object",
                                                                                "default": {"maxLength": 524_288}}
    held = from_json_schema({"type": "string", "maxLength": 1_000})
    assert held != from_json_schema({"type": "string"}) and held.count("(char") == 1_000


def test_the_bounds_count_only_the_grammars_own_parentheses(target):
    # parentheses inside literals, character classes and comments are text, not nesting
    text = 'root ::= "' + "(" * 2_000 + '" [(] x # ' + "(" * 2_000 + '\nx ::= ("a")'
    with Grammar(target.model, text) as grammar:
        assert grammar.admits(target.model.tokenize("(", add_special=False, parse_special=False)[-1])
    with Grammar(target.model, from_json_schema({"type": "string", "maxLength": 1_000})):
        pass  # the deepest a schema's repetition that llama.cpp's own parser takes


def test_a_grammar_that_does_not_compile_is_said_in_llama_cpps_words_and_nothing_more_is_printed(target, capfd):
    # llama.cpp's parser printed its error and the whole grammar to stderr above ours ("failed to parse grammar")
    capfd.readouterr()
    with pytest.raises(InputError, match="the grammar does not compile: unexpected end of input"):
        Grammar(target.model, "root ::= [")
    with pytest.raises(InputError, match="Undefined rule identifier 'foo'"):
        Grammar(target.model, "root ::= foo")
    assert capfd.readouterr().err == ""


def test_grammars_refused_on_two_threads_at_once_leave_stderr_where_it_was(target):
    # (each parse's stderr is caught on a file of its own: two at once, unserialised, could leave fd 2 on one)
    import os
    import threading

    where = os.fstat(2)
    refusals: list[str] = []  # (an assertion inside a thread is lost with it: the main thread reads these)

    def refuse_some():
        for _ in range(30):
            try:
                Grammar(target.model, "root ::= [")
            except InputError as error:
                refusals.append(str(error))

    threads = [threading.Thread(target=refuse_some) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(refusals) == 60 and all("unexpected end of input" in refusal for refusal in refusals)
    assert (os.fstat(2).st_dev, os.fstat(2).st_ino) == (where.st_dev, where.st_ino)


def test_a_grammar_that_does_not_compile_or_admits_nothing_is_one_error(target):
    with pytest.raises(InputError, match="the grammar does not compile"):
        Grammar(target.model, 'root ::= "unclosed')
    with Grammar(target.model, 'root ::= "\u00e9t\u00e9"') as grammar:  # no tiny token spells it but bytes
        assert grammar.admitted(np.zeros(target.model.n_vocab, np.float32)).size
    with pytest.raises(InputError, match="cannot be turned into a grammar"):
        from_json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})


# Grammars whose stacks grow combinatorially: masking one row of a 150k vocabulary under 40 `[a-z]*` in a row
# took 49 s of C code that nothing can cancel (issue 46); 200 optional items likewise.
COMBINATORIAL = {"stars": "root ::= " + " ".join(["[a-z]*"] * 40), "optionals": "root ::= " + " ".join(['"a"?'] * 200)}


@pytest.mark.parametrize("case", list(COMBINATORIAL))
def test_a_grammar_that_would_take_minutes_a_step_is_one_error_within_its_budget(real_model, case):
    model = Model(real_model("qwen2.5-coder-0.5b"), gpu_layers=0)  # a real 150k vocabulary
    try:
        with Grammar(model, COMBINATORIAL[case]) as grammar:
            started = time.monotonic()
            with pytest.raises(InputError, match="would take over"):
                grammar.admitted(np.zeros(model.n_vocab, np.float32))
            assert time.monotonic() - started < 30  # a bound on runaway work, not a speed target
    finally:
        model.close()


def test_the_mask_is_judged_piece_by_piece_and_the_same_for_every_piece_size(target, monkeypatch):
    logits = np.zeros(target.model.n_vocab, np.float32)
    with Grammar(target.model, LETTERS) as grammar:
        whole = grammar.admitted(logits)
        monkeypatch.setattr(grammar_module, "PIECE", 7)
        assert np.array_equal(grammar.admitted(logits), whole)
        monkeypatch.setattr(grammar_module, "STEP_BUDGET", 0.0)
        with pytest.raises(InputError, match="would take over 0 s"):
            grammar.admitted(logits)


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


@pytest.mark.parametrize("kind", ["draft model", "ngram", "forced alone"])
def test_forced_text_is_drafted_and_the_greedy_text_stays_the_same(load, target, prompt, kind):
    plain = greedy(target, NoDrafter(), prompt, FORCING)
    assert plain.text[1:3] == "st" and not plain.drafters  # plain decoding drafts nothing
    drafter = {"draft model": lambda: ModelDrafter(load("partial"), 0.0, target.model.n_vocab),
               "ngram": lambda: NgramDrafter(1, 3),
               "forced alone": lambda: NgramDrafter(16, 16)}[kind]()  # (no 16-token match in 40 tokens)
    drafted = greedy(target, drafter, prompt, FORCING)
    assert drafted.text == plain.text
    if kind == "forced alone":  # (the tiny vocabulary spells "s" as a byte token too, which the target may prefer)
        assert set(drafted.drafters) == {DrafterKind.FORCED} and drafted.drafters[DrafterKind.FORCED].drafted >= 2


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
        row = decoded_row(target, prompt, prefix)
        with Grammar(target.model, sampling.grammar) as grammar:
            for token in prefix:
                grammar.accept(token)
            logits = np.full(target.model.n_vocab, -np.inf, np.float32)
            admitted = grammar.admitted(row)
            logits[admitted] = row[admitted]
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


def test_an_integers_bounds_are_held_as_llama_cpps_converter_holds_them(target, prompt):
    """The port of llama.cpp's converter admitted any integer under minimum and maximum (5 to 10 gave
    1000000000000000). The rules are checked against every integer from -3000 to 3000 for 300 random ranges (read as
    the regular expression they spell: digits, classes and counts alone), then in llama.cpp's grammar and under
    sampling."""
    rng = np.random.default_rng(7)
    ranges = [(5, 10), (0, None), (None, 0), (-120, -7), (None, -3), (7, None), (99, 101), (None, 12345)]
    ranges += [tuple(sorted(rng.integers(-1500, 1500, 2).tolist())) for _ in range(150)]
    ranges += [(int(rng.integers(-1500, 1500)), None) for _ in range(75)] + [(None, int(rng.integers(-1500, 1500)))
                                                                             for _ in range(75)]
    numbers = [str(n) for n in range(-3000, 3001)]
    for low, high in ranges:
        spelt = re.compile(integer_range(low, high).replace('"', "").replace(" ", ""))
        admitted = {n for n in numbers if spelt.fullmatch(n)}
        assert admitted == {n for n in numbers if (low is None or int(n) >= low) and (high is None or int(n) <= high)}
        assert not any(spelt.fullmatch(text) for text in ("05", "-0", "00", "-05", "+5", "")), (low, high)
    gbnf = from_json_schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": 5, "maximum": 10}},
                             "required": ["n"]})
    assert admits_whole(target.model, gbnf, '{"n": 7}') and not admits_whole(target.model, gbnf, '{"n": 11}')
    assert not admits_whole(target.model, gbnf, '{"n": 1000000000000000}')
    bounded = from_json_schema({"type": "integer", "exclusiveMinimum": -3.5, "exclusiveMaximum": 3})
    for seed in range(6):
        out = record(speculative.generate(target, NoDrafter(), prompt, Sampling(temperature=1.5, seed=seed, grammar=bounded),
                                          Speculation(), Limits(max_tokens=20)))
        assert -3 <= int(out.text) <= 2, out.text
    with pytest.raises(InputError, match="admit no integer"):
        from_json_schema({"type": "integer", "minimum": 5, "exclusiveMaximum": 5})


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


@pytest.fixture(scope="module")
def merging(tmp_path_factory):
    """A target whose vocabulary spells "st" as one token too: a forced "st" may come as either."""
    path = write_tiny_model(tmp_path_factory.mktemp("merging") / "st.gguf",
                            TinySpec(seed=1, sharpness=2.0, pieces=LOWERCASE + ("st",)))
    model = Model(path)
    context = Context(model, 256, 64, threads=2, max_outputs=64)
    yield context
    context.close()
    model.close()


def test_sampling_with_forced_drafts_follows_the_targets_masked_distribution(merging):
    """The forced text is tokenized as "st", which the target takes only with its masked p("st"): else
    it chooses "s" (then "t"), and the rejection rule must leave exactly the target's distribution.
    The false-alarm rate is ALPHA, as test_lossless's."""
    target = merging
    st = target.model.tokenize("st", add_special=False, parse_special=False)
    assert len(st) == 1 or st[-1] != target.model.tokenize("t", add_special=False, parse_special=False)[-1]
    prompt = target.model.tokenize("the cat sat on the mat", add_special=True, parse_special=False)
    sampling = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, grammar=FORCING)
    speculation = Speculation(drafting=DrafterKind.NGRAM, draft_max=3, p_min=0.0)
    counts, forced = {}, 0
    for seed in range(SAMPLES):
        recorded = []
        events = speculative.generate(target, NgramDrafter(16, 16), prompt, replace(sampling, seed=seed), speculation,
                                      Limits(max_tokens=LENGTH))
        for event in events:
            recorded.append(event)
        outcome = tuple(e.id for e in recorded if isinstance(e, Token))
        forced += any(getattr(e, "drafter", None) == DrafterKind.FORCED for e in recorded)
        counts[outcome] = counts.get(outcome, 0) + 1
    assert forced == SAMPLES  # every generation drafted its forced text
    # "st" and "s" (a piece, or a byte token) all came: the rejection rule had work to do
    assert len({outcome[1] for outcome in counts}) >= 2
    assert chi_square_p_value(counts, masked_distribution(target, prompt, sampling)) > ALPHA


@pytest.mark.parametrize("grammar, drafted", [
    ('root ::= "as" ("p" | "k") "."', "as"),  # "s" stays a token of its own before "p" or "k"
    ('root ::= "as" ("t" | "k") "."', "a"),  # before "t" the target would write "st": "s" is left to it
])
def test_a_forced_texts_last_token_is_drafted_only_where_nothing_after_merges_into_it(merging, grammar, drafted):
    model = merging.model
    with Grammar(model, grammar) as state:
        draft = ForcedDrafter(state, model, NoDrafter()).propose([model.tokenize("a", False, False)[-1]], 8)
    assert draft.source == DrafterKind.FORCED and b"".join(map(model.piece, draft.tokens)).decode() == drafted


def test_bench_reads_what_jump_forward_adds_beside_auto(tiny):
    from localspec import bench
    from localspec.config import Runtime
    from localspec.session import Session

    prompt = bench.Prompt([{"role": "user", "content": "the cat sat"}])
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation()) as session:
        found = bench.run(session, {"set": [prompt]}, [DrafterKind.PLAIN, DrafterKind.AUTO, "auto-no-forced"],
                          Sampling(temperature=0, grammar=FORCING), Limits(max_tokens=24), lambda text: None)
    rows = {row["mode"]: row for row in found}
    assert rows["auto"]["drafters"][DrafterKind.FORCED]["accepted"] >= 1
    assert DrafterKind.FORCED not in rows["auto-no-forced"]["drafters"]
    assert rows["auto"]["differs_from_plain"] == rows["auto-no-forced"]["differs_from_plain"] == []


def test_a_schema_of_annotations_alone_admits_any_value_as_json_schema_says(target):
    """Claude Code's Workflow tool has an argument whose schema only describes it: the converter refused it
    ("Unrecognized schema"), so every Claude Code request was a 400; and it took `{}` for an object. Each admits any
    JSON value now, as JSON Schema says, and as llama.cpp's own converter takes it."""
    schema = {"type": "object", "properties": {"args": {"description": "any input"}, "given": {}},
              "required": ["args", "given"], "additionalProperties": False}
    rules = dict(line.split(" ::= ", 1) for line in from_json_schema(schema).splitlines())
    for name in ("args", "given"):  # (each an alternative of every type, as `value` is)
        assert rules[name] == f"{name}-0 | array | string | number | boolean | null" and rules[f"{name}-0"] == "object"
    assert rules["root"] == '"{" space args-kv "," space given-kv "}" space'  # (the rest of the schema still holds)
    Grammar(target.model, from_json_schema(schema)).close()
    assert from_json_schema({"title": "anything"}) == from_json_schema({})
    assert "value ::=" in from_json_schema({}) and "root ::= alternative-0 | array" in from_json_schema({})


def admits_whole(model, gbnf: str, whole: str) -> bool:
    """Whether a grammar admits this text, a byte's token at a time (the tiny vocabulary spells a space before a
    text it tokenizes), and then its end."""
    pieces = {model.piece(token): token for token in range(model.n_vocab)}
    with Grammar(model, gbnf) as grammar:
        for token in (pieces[bytes([byte])] for byte in whole.encode()):
            if not grammar.admits(token):
                return False
            grammar.accept(token)
        return any(grammar.admits(end) for end in model.end_tokens)


PATTERNS = {r"^\d{3}-\d{2}$": (["123-45"], ["12-345", "123-456", "abc-de"]),
            r"[\w.]+@x\.com": (["a.b@x.com", "z_9@x.com"], ["a.b@xycom", "a b@x.com"]),
            r"(?:ab)+?c": (["abc", "ababc"], ["abac", "c"]),
            r"(?P<year>\d{2})\s?[^\d]": (["12 a", "34b"], ["123", "12 3"]),
            r'"q"|\x41': (['"q"', "A"], ["q", "B"]),
            r"\w\é\.": (["aé."], ["a.é", "é."]),
            r"^ab$|^c$": (["ab", "c"], ["abc", "a"]),
            r"[\D][^\d\s-]": (["a.", "-é"], ["1a", "a ", "a-"])}


@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_a_patterns_escapes_and_groups_are_held_as_the_regular_expression_means_them(target, pattern):
    """A JSON schema's pattern with \\d, \\w, \\s or an escaped character (Pydantic's `constr(pattern=r"^\\d{5}$")`)
    was copied into GBNF, which has no such escape: every such request was refused ("the grammar does not
    compile"), and `-\\d{4}` repeated `-\\d` four times. Held now as the regular expression means it, matched whole,
    and as vLLM's structured output `regex` too."""
    kept, refused = PATTERNS[pattern]
    assert all(re.fullmatch(pattern, whole) for whole in kept) and not any(re.fullmatch(pattern, w) for w in refused)
    for whole in kept:
        assert admits_whole(target.model, from_regex(pattern), whole), whole
        assert admits_whole(target.model, from_json_schema({"type": "string", "pattern": pattern}),
                            json.dumps(whole, ensure_ascii=False))
    for whole in refused:
        assert not admits_whole(target.model, from_regex(pattern), whole), whole


@pytest.mark.parametrize("pattern", [r"^.{3,12}$", r"[^@]+@x\.com", r"(\W|\w)+", r'a\\"\t\x01.'])
def test_a_patterns_text_inside_json_is_written_as_json_writes_a_string(target, pattern):
    """A schema's pattern admitted a quote, a backslash or a control character raw inside the JSON string (`.`,
    `[^@]`, as llama.cpp's converter does): a model could end the string early or write JSON that does not parse.
    Each is admitted as JSON escapes it now."""
    gbnf = from_json_schema({"type": "string", "pattern": pattern})
    for whole in ('a\\"\t\x01é', 'a\\"\t\x01.@x.com', 'say "hi"', "tab\tback\\slash\x7f\x1f"):
        if re.fullmatch(pattern, whole):  # (held to match whole, as converted_pattern says)
            assert admits_whole(target.model, gbnf, json.dumps(whole, ensure_ascii=False)), whole
        assert not admits_whole(target.model, gbnf, '"' + whole + '"'), whole  # (raw, not JSON)


@pytest.mark.parametrize("pattern", [r"^.{3,12}$", r"^(\W|\w){8}$", None])
def test_sampled_text_under_a_pattern_is_json_that_matches(target, prompt, pattern):
    """None: a string of any text (up to 12 characters): the port of the converter admitted any character but a quote
    and a backslash in one, raw control characters among them (a line break inside a string: JSON that does not
    parse); llama.cpp's admits them escaped."""
    schema = {"type": "string"} | ({"pattern": pattern} if pattern else {"maxLength": 12})
    gbnf = from_json_schema(schema)
    for seed in range(4):  # (the tiny model's bytes: quotes, backslashes and control characters among them)
        out = record(speculative.generate(target, NoDrafter(), prompt,
                                          Sampling(temperature=1.5, seed=seed, grammar=gbnf), Speculation(),
                                          Limits(max_tokens=100)))
        assert out.finish_reason == "stop" and re.fullmatch(pattern or ".*", json.loads(out.text), re.DOTALL), \
            out.text
    if pattern is None:
        assert not admits_whole(target.model, gbnf, '"a\nb"') and admits_whole(target.model, gbnf, '"a\\nb"')


def test_what_a_grammar_cannot_hold_of_a_pattern_is_one_error_and_choices_are_held_as_given(target):
    for pattern, why in ((r"\bword", r"\\b has no equivalent"),
                         (r"a^b", "inside it"), (r"(a)\1", r"\\1 has no equivalent"), (r"(?=a)b", "Unsupported"),
                         # (what is no regular expression at all: the converter took some, and wrote a grammar)
                         ("(", "not a regular expression: missing"), ("a{2,1}", "min repeat greater")):
        with pytest.raises(InputError, match=why):
            from_json_schema({"type": "string", "pattern": pattern})
    assert converted_pattern(r"(?<year>\d{2})") == r"^(([0-9]{2}))$"  # (JavaScript's named group, which Python spells ?P)
    choices = from_choices(["yes", 'say "no"', "a\\b\n"])
    assert all(admits_whole(target.model, choices, whole) for whole in ("yes", 'say "no"', "a\\b\n"))
    assert not admits_whole(target.model, choices, "ye")
    with pytest.raises(InputError, match="no choices"):
        from_choices([])
