"""XTC (llama.cpp's "exclude top choices") over a row's candidates: the tokens it leaves out are those
llama.cpp's own chain leaves out when its chance falls (tests/native_samplers.py), it falls as often as asked,
the settings' checks, and its ways in as their clients spell them (llama-server's /completion and the openai
client on serve, batch's fields, llama.cpp's options). That speculation keeps XTC's distribution is
test_lossless.py's."""


import httpx2 as httpx
import numpy as np
import pytest

from localspec.config import Sampling
from localspec.engine.sampling import excluded, transform
from localspec.errors import UsageError

from native_samplers import chain_survivors
from test_server import batch_record, refused_on_both_completions, run_text

SETTINGS = (
    Sampling(temperature=1.0, top_k=40, top_p=0.95, min_p=0.05, xtc_probability=1.0, xtc_threshold=0.1),
    Sampling(temperature=0.7, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.05),
    Sampling(temperature=1.5, top_k=10, top_p=0.9, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.2),
    Sampling(temperature=0.3, top_k=0, top_p=1.0, min_p=0.02, xtc_probability=1.0, xtc_threshold=0.0),
    Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=1.0, xtc_threshold=0.5),
)


@pytest.mark.parametrize("s", SETTINGS)
def test_xtc_leaves_out_what_llama_cpps_chain_leaves_out_when_its_chance_falls(s):
    rng = np.random.default_rng(5)
    removed = 0
    for sharpness in (0.5, 1.0, 2.0, 4.0):
        row = (rng.normal(0, sharpness, 300)).astype(np.float32)
        p = excluded(transform(row, s), s, rng)
        expected = chain_survivors(s, row)
        assert sorted(p.ids.tolist()) == sorted(expected)
        assert np.allclose(p.probs_of(np.array(list(expected))), list(expected.values()), atol=1e-6)
        removed += len(transform(row, s).ids) - len(p.ids)
    assert removed > 0 or s.xtc_threshold == 0.5  # (at 0.5 at most one token is that likely: nothing to leave out)


def test_xtcs_chance_falls_as_often_as_asked_and_only_where_two_tokens_are_likely():
    s = Sampling(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, xtc_probability=0.3, xtc_threshold=0.2)
    rng = np.random.default_rng(0)
    row = np.log(np.array([0.4, 0.3, 0.2, 0.1], np.float32))
    fell = sum(len(excluded(transform(row, s), s, rng).ids) < 4 for _ in range(4000))
    assert abs(fell / 4000 - 0.3) < 0.03
    peaked = np.log(np.array([0.7, 0.15, 0.1, 0.05], np.float32))  # one token above 0.2: nothing to exclude
    assert all(len(excluded(transform(peaked, s), s, rng).ids) == 4 for _ in range(200))


def test_xtc_settings_are_checked_and_count_only_where_they_leave_something_out():
    assert not Sampling().xtc and not Sampling(xtc_probability=0.5, xtc_threshold=0.6).xtc
    assert Sampling(xtc_probability=0.5).xtc
    for wrong, setting in (({"xtc_probability": 1.5}, "xtc_probability"), ({"xtc_threshold": -0.1}, "xtc_threshold"),
                           ({"xtc_probability": 0.5, "temperature": 0}, "xtc_probability")):
        with pytest.raises(UsageError) as refused:
            Sampling(**wrong)
        assert refused.value.setting == setting
    Sampling(temperature=0, xtc_probability=0.5, xtc_threshold=0.9)  # (XTC off: greedy is fine)


PROMPT = "the cat sat"
# XTC always, leaving out every candidate but the least likely: of top-k 2's, each token is its row's second
SECOND = {"temperature": 1.0, "top_k": 2, "top_p": 1.0, "min_p": 0.0, "xtc_probability": 1.0, "xtc_threshold": 0.0}


def test_llama_servers_xtc_through_completion_and_the_openai_client(served):
    answer = httpx.post(served.base + "/completion", json={"prompt": PROMPT, "n_predict": 12, "n_probs": 2, "seed": 1}
                        | SECOND, timeout=60).json()
    for token in answer["completion_probabilities"]:
        assert token["id"] == token["top_logprobs"][1]["id"], token  # the row's second choice, every time
    assert {name: answer["generation_settings"][name] for name in ("xtc_probability", "xtc_threshold")} == {
        "xtc_probability": 1.0, "xtc_threshold": 0.0} and "xtc" in answer["generation_settings"]["samplers"]
    chat = served.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=12, logprobs=2, seed=2,
                                              temperature=1.0, extra_body={name: value for name, value in SECOND.items()
                                                                           if name != "temperature"})
    for token, top in zip(chat.choices[0].logprobs.tokens, chat.choices[0].logprobs.top_logprobs):
        assert token == sorted(top, key=top.get)[0], (token, top)
    refused_on_both_completions(served, PROMPT, (
        ({"xtc_probability": 1.5}, "xtc probability must be from 0 to 1"),
        ({"xtc_probability": 0.5, "temperature": 0}, "greedy decoding (temperature 0)"),
        ({"xtc_threshold": "high"}, "xtc_threshold"),
    ))
    assert "Traceback" not in served.log()


def test_batch_items_and_the_command_line_take_xtc_as_llama_cpp_spells_it(localspec, cli, tiny, tmp_path):
    record = batch_record(localspec, tiny["target"], tmp_path, {"id": "second", "prompt": PROMPT, "max_tokens": 12,
                                                                "seed": 3, **SECOND}, "--raw")
    # XTC leaves one candidate a token here, whatever the seed: the command line's run writes the same text
    assert run_text(cli, tiny["target"], "-p", PROMPT, "--raw", "-n", "12", "--temp", "1", "--top-k", "2", "--top-p",
                    "1", "--min-p", "0", "--xtc-probability", "1", "--xtc-threshold", "0", "--seed", "4"
                    ) == record["text"]
    code, stdout, stderr = cli("run", tiny["target"], "-p", PROMPT, "-n", "2", "--temp", "0",
                               "--xtc-probability", "0.5")
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert code == 2 and stdout == "" and len(errors) == 1 and "greedy decoding" in errors[0], stderr
