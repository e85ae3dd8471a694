"""A long text that begins as an earlier one reuses its tokens up to the last anchor both share (engine/prefixes.py):
the tokens are always llama.cpp's for the whole text, on vocabularies whose special tokens overlap each other."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.engine import model as model_module
from localspec.engine.model import Model
from localspec.engine.prefixes import anchors_of

from tinymodels import LOWERCASE, TinySpec, write_tiny_model

# control tokens that contain one another, begin where another ends, overlap themselves; user-defined ones beside
CONTROL = ("<|im_start|>", "<|im_end|>", "<a>", "<a><b>", "<c>", "<d>", "abab", "<e>")
USER_DEFINED = ("x<d", "e>z", "<think>")
PIECES = (*CONTROL, *USER_DEFINED, "<", ">", "|", "x", "z", "ab", "\n", " ", "  ", "hello", " world", "é", "user",
          "assistant")


def test_an_anchor_is_a_control_token_that_no_special_tokens_text_overlaps():
    texts = {1: b"<a>", 2: b"<a><b>", 3: b"<c>", 4: b"x<d", 5: b"<d>", 6: b"abab", 7: b"<e>", 8: b"e>z", 9: b" "}
    # <a> lies in <a><b>; x<d ends as <d> begins; abab ends as it begins; e>z begins as <e> ends; a space is no text
    assert anchors_of(texts, controls={1, 2, 3, 5, 6, 7, 9}) == {2: b"<a><b>", 3: b"<c>"}
    assert anchors_of(texts, controls={4}) == {}  # (a user-defined token is no anchor)


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("prefixes") / "overlapping.gguf",
                            TinySpec(seed=3, pieces=(*LOWERCASE, "\u2581hello"), control=CONTROL,
                                     user_defined=USER_DEFINED))
    model = Model(path, vocab_only=True)
    yield model
    model.close()


@given(st.lists(st.tuples(st.floats(0, 1), st.lists(st.sampled_from(PIECES), min_size=1, max_size=30)),
                min_size=1, max_size=8),
       st.booleans())
@settings(max_examples=150, deadline=None)
def test_each_text_gets_the_tokens_llama_cpp_gives_it_whole(overlapping, monkeypatch_module, requests, add_special):
    """Each text goes on from the one before, or from part of it (a conversation edited, a turn dropped), cut
    anywhere (inside a special token's text too)."""
    text = ""
    for kept, added in requests:
        text = text[: int(kept * len(text))] + "".join(added)
        assert overlapping.tokenize(text, add_special, True) == overlapping._tokenized_now(text.encode(), add_special,
                                                                                           True)


@pytest.fixture(scope="module")
def monkeypatch_module():
    """Every text long enough to be resumed."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model_module, "SHORTEST_KEPT", 0)
        patch.setattr(model_module, "SHORTEST_RESUMED", 0)
        yield patch


def test_a_conversation_that_grows_tokenizes_only_its_new_turn(overlapping, monkeypatch_module):
    tokenize, tails = overlapping._tokenized_now, []
    overlapping._tokenized_now = lambda data, *flags: tails.append(len(data)) or tokenize(data, *flags)
    rng, conversation = random.Random(0), ""
    try:
        for turn in range(12):
            conversation += f"<|im_start|>user\n{' '.join(rng.choice(PIECES[-8:]) for _ in range(40))}<|im_end|>\n"
            prompt = conversation + "<|im_start|>assistant\n"
            assert overlapping.tokenize(prompt, True, True) == tokenize(prompt.encode(), True, True)
            conversation += "<|im_start|>assistant\n" + "hello world " * 20 + "<|im_end|>\n"
    finally:
        del overlapping._tokenized_now
    assert max(tails[1:]) < 2 * len(prompt.encode()) / 12  # (each turn's last message and what follows, no more)


@pytest.mark.slow
@pytest.mark.parametrize("name, opening, closing", [("qwen2.5-coder-0.5b", "<|im_start|>", "<|im_end|>"),
                                                   ("gemma3-270m", "<start_of_turn>", "<end_of_turn>")])
def test_on_real_vocabularies_a_long_conversation_resumes_with_llama_cpps_tokens(real_model, name, opening, closing):
    model = Model(real_model(name), vocab_only=True)
    rng, words = random.Random(1), ["the", "of", "é", "\n", "  ", "def f(x):", "<", "|>", opening[:5], "1234"]
    conversation = ""
    try:
        for turn in range(30):
            for role in ("user", "model"):
                conversation += f"{opening}{role}\n{' '.join(rng.choice(words) for _ in range(300))}{closing}\n"
            prompt = (conversation + f"{opening}model\n").encode()
            assert model.tokenize(prompt, True, True) == model._tokenized_now(prompt, True, True), turn
        anchors = set(model.prefixes.anchors.values())
        assert {opening.encode(), closing.encode()} <= anchors
    finally:
        model.close()


def test_what_is_kept_stays_within_its_bound(overlapping, monkeypatch_module, monkeypatch):
    monkeypatch.setattr("localspec.engine.prefixes.MOST_BYTES", 10_000)
    prefixes = overlapping.prefixes
    for n in range(12):
        text = f"<c>{n}" + "hello world " * 60
        assert overlapping.tokenize(text, False, True) == overlapping._tokenized_now(text.encode(), False, True)
        assert sum(len(one.data) + one.tokens.nbytes for one in prefixes._kept) <= 10_000
    assert 0 < len(prefixes._kept) < 12
