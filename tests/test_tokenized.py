"""Long texts kept tokenized (engine/model.py): the tokens llama.cpp gives, whichever thread asks and however often,
within a bound of memory."""

import random
import threading

import pytest

from localspec.engine import model as model_module
from localspec.engine.model import Model

WORDS = ("the", "cat", "sat", "on", "<s>", "</s>", "mat", "\n", "  ", "é", "def", "(x):")


def texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(60, 400))) for _ in range(count)]


@pytest.fixture
def vocabulary(tiny):
    model = Model(tiny["target"], vocab_only=True)
    yield model
    model.close()


def test_a_text_kept_tokenized_gives_the_tokens_llama_cpp_gives_every_time(vocabulary):
    for text in texts(20, seed=1):
        for add_special, parse_special in ((False, False), (True, False), (False, True), (True, True)):
            wanted = vocabulary._tokenized_now(text.encode(), add_special, parse_special)
            first = vocabulary.tokenize(text, add_special, parse_special)
            first.append(-1)  # (a caller's list is its own)
            assert vocabulary.tokenize(text, add_special, parse_special) == wanted
            assert vocabulary.tokenize(text.encode(), add_special, parse_special) == wanted


def test_threads_tokenizing_at_once_each_get_their_texts_tokens(vocabulary):
    shared = texts(40, seed=2)
    wanted = {text: vocabulary._tokenized_now(text.encode(), False, True) for text in shared}
    wrong = []

    def tokenize(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(300):
            text = rng.choice(shared)
            if vocabulary.tokenize(text, False, True) != wanted[text]:
                wrong.append(text)

    threads = [threading.Thread(target=tokenize, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert wrong == [] and not any(thread.is_alive() for thread in threads)


def test_what_is_kept_stays_within_its_bound(tiny, monkeypatch):
    monkeypatch.setattr(model_module, "TOKENIZED_BYTES", 20_000)
    model = Model(tiny["target"], vocab_only=True)
    try:
        for text in texts(200, seed=3):
            model.tokenize(text, False, False)
        assert 0 < model._tokenized.currsize <= 20_000
        huge = "the cat sat " * 2_000  # (more than a quarter of the bound: tokenized, not kept)
        assert model.tokenize(huge, False, False) == model._tokenized_now(huge.encode(), False, False)
        assert (huge.encode(), False, False) not in model._tokenized
    finally:
        model.close()


def special_texts(model: Model) -> list[str]:
    """The texts of a vocabulary's control, user-defined and unknown tokens: what llama.cpp splits a text at."""
    from localspec.engine.library import llama

    kinds = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_USER_DEFINED | llama.LLAMA_TOKEN_ATTR_UNKNOWN
    return [model.special_piece(token).decode("utf-8", "replace") for token in range(model.n_vocab)
            if llama.llama_vocab_get_attr(model.vocab, token) & kinds]


def spelled_both_ways(model: Model, rng: random.Random, specials: list[str], count: int) -> None:
    for _ in range(count):
        text = "".join(rng.choice([*WORDS, *specials, " ", "\U0001F600", "x"]) for _ in range(rng.randrange(1, 12)))
        read = model.tokenize(text, False, True)
        if read != model.tokenize(text, False, False):  # (a text that spells a control token)
            assert model.reads_control(read), text


# A message that spells a control token is found by its tokens read once (those hold a control token, or the unknown
# one, wherever reading special tokens changes the text's tokens): the check never passes one that spells one.
def test_a_text_whose_tokens_change_with_special_tokens_read_holds_a_control_token(tiny):
    for name in ("target", "other_tokenizer", "mtp"):
        model = Model(tiny[name], vocab_only=True)
        try:
            spelled_both_ways(model, random.Random(4), special_texts(model), 400)
        finally:
            model.close()


@pytest.mark.slow
def test_on_a_real_152k_vocabulary_too(real_model):
    model = Model(real_model("qwen2.5-coder-0.5b"), vocab_only=True)
    try:
        specials = special_texts(model)
        assert "<|im_start|>" in specials
        spelled_both_ways(model, random.Random(5), specials, 400)
    finally:
        model.close()
