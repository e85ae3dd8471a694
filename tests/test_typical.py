"""llama.cpp's locally typical sampling and dynamic temperature through their ways in, as their clients spell
them: llama-server's /completion (typical_p, dynatemp_range, dynatemp_exponent), the openai client's extra body,
the ollama client's options and a Modelfile's PARAMETER (typical_p), batch's fields and llama.cpp's options
(--typical, --dynatemp-range, --dynatemp-exp). Both are llama.cpp's own samplers in the chain, which target and
draft both run; that the target's choices keep their distribution is test_lossless.py's."""


import httpx2 as httpx
import ollama

from test_server import batch_record, refused_on_both_completions, run_text

PROMPT = "the cat sat"
ASKED = {"temperature": 0.9, "top_k": 8, "typical_p": 0.5, "dynatemp_range": 0.4, "dynatemp_exponent": 1.5}
# a seed repeats a text where the drafting repeats too: serve's second request drafts from the first's answer
PLAIN = {"speculative": {"mode": "off"}}


def completion(server, **asked) -> dict:
    answer = httpx.post(server.base + "/completion", timeout=60, json={"prompt": PROMPT, "n_predict": 12} | asked)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_every_api_takes_them_in_its_own_spelling(served):
    answer = completion(served, seed=5, **ASKED, **PLAIN)
    assert {name: answer["generation_settings"][name] for name in ASKED} == ASKED
    assert "typ_p" in answer["generation_settings"]["samplers"]
    assert answer["content"] == completion(served, seed=5, **ASKED, **PLAIN)["content"]
    chat = served.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=12, seed=5,
                                              temperature=ASKED["temperature"],
                                              extra_body={name: value for name, value in ASKED.items()
                                                          if name != "temperature"} | PLAIN)
    assert chat.choices[0].text == answer["content"]
    generated = ollama.Client(host=served.base).generate(model="tiny", prompt=PROMPT, raw=True,
                                                         options={"typical_p": 0.5, "num_predict": 4, "seed": 2})
    assert generated.done and generated.eval_count == 4
    refused_on_both_completions(served, PROMPT, (
        ({"typical_p": 0}, "typical p must be in (0, 1]"),
        ({"dynatemp_range": -1}, "dynamic temperature's range and exponent must be >= 0"),
        ({"dynatemp_range": 0.5, "xtc_probability": 0.5}, "XTC and a dynamic temperature"),
    ))
    assert "Traceback" not in served.log()


def test_a_modelfile_batch_and_the_command_line_take_them(localspec, cli, tiny, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {tiny['target']}\nPARAMETER typical_p 0.5\n")
    assert cli("create", "typical", "-f", tmp_path / "Modelfile")[0] == 0
    code, stdout, _ = cli("show", "typical", "--modelfile")
    assert code == 0 and "PARAMETER typical_p 0.5" in stdout
    batched = batch_record(localspec, tiny["target"], tmp_path, {"id": "a", "prompt": PROMPT, "max_tokens": 12,
                                                                 "seed": 3, **ASKED}, "--raw", "--spec", "off")
    assert run_text(cli, tiny["target"], "-p", PROMPT, "--raw", "-n", "12", "-s", "3", "--temp", "0.9", "--top-k", "8",
                    "--typical", "0.5", "--dynatemp-range", "0.4", "--dynatemp-exp", "1.5", "--spec", "off"
                    ) == batched["text"]
