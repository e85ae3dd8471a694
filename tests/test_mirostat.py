"""Mirostat (1 and 2) and top-n-sigma, llama.cpp's: mirostat's cut and the way its threshold moves equal
llama.cpp's own mirostat samplers' (tests/native_samplers.py) row after row, top-n-sigma is measured over the
whole row as llama.cpp's chain measures it, the settings' checks, and their ways in as their clients spell them
(llama-server's /completion and the openai client on serve, the ollama client's options and a Modelfile's
PARAMETER, batch's fields, llama.cpp's options). That speculation keeps their distributions is test_lossless.py's
and test_tree_drafters.py's."""

from dataclasses import replace

import httpx2 as httpx
import numpy as np
import ollama
import pytest

from localspec.config import Limits, Sampling, Speculation
from localspec.engine.chain import Chain
from localspec.engine.drafters import NoDrafter
from localspec.engine.sampling import Mirostat, chain_for, softmax
from localspec.engine.speculative import generate
from localspec.errors import UsageError
from localspec.events import Token

from native_samplers import chain_survivors, mirostat_walk
from test_server import batch_record, refused_on_both_completions, run_text

PROMPT = "the cat sat"
N_VOCAB = 2000
# (tau, eta): llama.cpp's defaults, a mu that moves fast, a low one that cuts to a token or two, a high one that
# climbs past float32's 2 ** 128 (mirostat 1 then keeps one token, as llama.cpp's conversion of inf does on x86)
WALKS = ((5.0, 0.1), (3.0, 1.0), (1.0, 0.5), (8.0, 0.3))


def language_like_row(rng: np.random.Generator) -> np.ndarray:
    """A row shaped as a language model's: Zipf-like logits (exponent 0.7 to 2) with some noise, shuffled."""
    logits = -rng.choice([0.7, 1.0, 1.3, 2.0]) * np.log(np.arange(1, N_VOCAB + 1)) + rng.normal(0, 0.3, N_VOCAB)
    return rng.permutation(logits).astype(np.float32)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("tau, eta", WALKS)
def test_mirostat_cuts_each_row_where_llama_cpps_own_does_as_its_mu_moves(version, tau, eta):
    """Row after row, each moving both mus by the token llama.cpp drew, so that the next row's cut tells whether
    they still agree. llama.cpp works in float32 and this in float64 but for mu: where a token's surprise is
    within rounding of mu (mirostat 2), or k = (...) ** (1 / s) within rounding of a whole number (mirostat 1),
    the cuts may differ by that one token, about a row in a hundred; such a row is allowed at the edge only (one
    cut holds the other and one token more). (On near-uniform rows over thousands of tokens, s is about 0.1 and
    k the seventh power of rounding: the cuts there part by more, as two float32 builds of llama.cpp's would.)"""
    rng = np.random.default_rng(version * 10 + int(tau))
    s = Sampling(temperature=1.0, mirostat=version, mirostat_tau=tau, mirostat_eta=eta)
    rows = [language_like_row(rng) for _ in range(300)]
    ours, sizes, same = Mirostat(s, N_VOCAB), set(), 0
    for row, (kept, chosen) in zip(rows, mirostat_walk(s, N_VOCAB, rows, seed=7)):
        p = ours.kept(softmax(np.arange(N_VOCAB), row))
        cut, theirs = set(p.ids.tolist()), set(kept)
        if cut == theirs:
            same += 1
            assert np.allclose(p.probs_of(np.array(list(kept))), list(kept.values()), atol=1e-5)
        else:
            assert (cut < theirs or theirs < cut) and abs(len(cut) - len(theirs)) == 1, (len(cut), len(theirs))
        ours.chose(chosen)
        sizes.add(len(kept))
    assert same >= 0.95 * len(rows)
    assert len(sizes) > 1  # the cut bit, and by varying amounts


def test_a_row_of_one_token_or_of_zeros_is_cut_as_llama_cpp_cuts_it():
    s = Sampling(temperature=1.0, mirostat=1)
    one = np.array([3.0], dtype=np.float32)
    steep = np.array([0.0, -200.0, -200.0, -300.0], dtype=np.float32)  # (probabilities underflow: 0 / 0 in its fit)
    for row in (one, steep):
        for version in (1, 2):
            walked = mirostat_walk(replace(s, mirostat=version), len(row), [row], seed=1)[0][0]
            p = Mirostat(replace(s, mirostat=version), len(row)).kept(softmax(np.arange(len(row)), row))
            assert sorted(p.ids.tolist()) == sorted(walked)


def test_greedy_decoding_takes_the_likeliest_token_whatever_mirostat_says(target, prompt):
    def text(sampling):
        events = generate(target, NoDrafter(), prompt, sampling, Speculation(), Limits(max_tokens=12))
        return [e.id for e in events if isinstance(e, Token)]

    assert text(Sampling(temperature=0, mirostat=2, mirostat_tau=0.5)) == text(Sampling(temperature=0))


def test_top_n_sigma_measures_the_whole_row_beside_top_k(target, prompt):
    """The host chain gives llama.cpp's samplers only the top-k candidates where top-k is on (chain.py's
    top_k_superset): top-n-sigma's standard deviation must still be the whole row's. (It sets what it drops to
    -inf rather than dropping it: those are candidates of probability 0.)"""
    s = Sampling(temperature=1.0, top_k=20, top_p=1.0, min_p=0.0, top_n_sigma=0.5)
    target.sample_with(Chain(top_k=20, top_n_sigma=0.5), host=True)
    target.prefill(prompt[:-1])
    target.decode(prompt[-1:], logits="all")
    ids, logits = target.candidates(0)
    kept = ids[np.isfinite(logits)]
    assert sorted(kept.tolist()) == sorted(token for token, p in chain_survivors(s, target.logits(0), 0.0).items()
                                           if p > 0)
    assert len(kept) < 20  # (top-n-sigma cut below top-k's twenty: it is what decided)


@pytest.mark.parametrize("asked, said", [
    ({"mirostat": 3}, "mirostat must be 0 (off), 1 or 2"),
    ({"mirostat_tau": -1.0, "mirostat": 2}, "mirostat tau (its target surprise, in bits) must be >= 0"),
    ({"mirostat_eta": float("inf")}, "mirostat eta (its learning rate) must be >= 0"),
    ({"top_n_sigma": float("nan")}, "top-n-sigma must be a number"),
])
def test_wrong_settings_are_refused_naming_the_setting(asked, said):
    with pytest.raises(UsageError, match=None) as refused:
        Sampling(**asked)
    assert said in str(refused.value) and refused.value.setting == next(iter(asked))


def test_mirostat_leaves_the_chain_to_the_temperature_alone():
    assert chain_for(Sampling(temperature=0.7, top_k=5, typical_p=0.5, top_n_sigma=1.0, mirostat=1)) == Chain(
        temperature=0.7)
    assert not Sampling(temperature=0.7, xtc_probability=0.5, mirostat=2).xtc


ASKED = {"temperature": 0.9, "mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.3}
PLAIN = {"speculative": {"mode": "off"}}


def test_every_api_takes_them_in_its_own_spelling(served):
    def completion(**asked) -> dict:
        answer = httpx.post(served.base + "/completion", timeout=60, json={"prompt": PROMPT, "n_predict": 12} | asked)
        assert answer.status_code == 200, answer.text
        return answer.json()

    answer = completion(seed=5, **ASKED, **PLAIN)
    assert {name: answer["generation_settings"][name] for name in ASKED} == ASKED
    assert answer["content"] == completion(seed=5, **ASKED, **PLAIN)["content"]
    sigma = completion(seed=5, temperature=0.9, top_n_sigma=1.5, **PLAIN)
    assert sigma["generation_settings"]["top_n_sigma"] == 1.5 and "top_n_sigma" in sigma["generation_settings"]["samplers"]
    chat = served.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=12, seed=5,
                                              temperature=ASKED["temperature"],
                                              extra_body={name: value for name, value in ASKED.items()
                                                          if name != "temperature"} | PLAIN)
    assert chat.choices[0].text == answer["content"]
    generated = ollama.Client(host=served.base).generate(
        model="tiny", prompt=PROMPT, raw=True,
        options={"mirostat": 2, "mirostat_tau": 3.0, "mirostat_eta": 0.3, "num_predict": 4, "seed": 2})
    assert generated.done and generated.eval_count == 4
    refused_on_both_completions(served, PROMPT, (
        ({"mirostat": 3}, "mirostat must be 0 (off), 1 or 2"),
        ({"mirostat": 1, "mirostat_eta": -0.1}, "mirostat eta (its learning rate) must be >= 0"),
        ({"min_keep": 5}, "min_keep is not supported")))
    assert "Traceback" not in served.log()


def test_a_modelfile_batch_and_the_command_line_take_them(localspec, cli, tiny, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {tiny['target']}\nPARAMETER mirostat 2\nPARAMETER mirostat_tau 3\n")
    assert cli("create", "focused", "-f", tmp_path / "Modelfile")[0] == 0
    code, stdout, _ = cli("show", "focused", "--modelfile")
    assert code == 0 and "PARAMETER mirostat 2" in stdout and "PARAMETER mirostat_tau 3" in stdout
    batched = batch_record(localspec, tiny["target"], tmp_path, {"id": "a", "prompt": PROMPT, "max_tokens": 12,
                                                                 "seed": 3, **ASKED}, "--raw", "--spec", "off")
    assert run_text(cli, tiny["target"], "-p", PROMPT, "--raw", "-n", "12", "-s", "3", "--temp", "0.9", "--mirostat",
                    "2", "--mirostat-ent", "3", "--mirostat-lr", "0.3", "--spec", "off") == batched["text"]
    code, _, stderr = cli("run", tiny["target"], "-p", PROMPT, "--raw", "-n", "4", "--top-n-sigma", "1.5",
                          "--mirostat", "3")
    assert code == 2 and "mirostat must be 0 (off), 1 or 2" in stderr
