"""A logit bias and ignore_eos through every way in, as their clients spell them: serve's OpenAI routes through
the openai client (OpenAI's logit_bias, vLLM's ignore_eos), llama-server's /completion in its own JSON (pairs,
texts, false), batch's fields, and the command line's -l/--ignore-eos (llama.cpp's). That speculation stays
lossless under them is test_lossless.py's; that the rows are biased as llama.cpp's chain biases them,
test_sampling.py's."""

import ast
import json

import httpx2 as httpx
import pytest

from localspec.engine.model import Model


PROMPT = "the cat sat"


@pytest.fixture(scope="module")
def eos(tiny) -> int:
    return Model(tiny["target"], vocab_only=True).eog_tokens[0]


def completion(server, **asked) -> dict:
    """llama-server's /completion of PROMPT, greedy, 6 tokens at most, each token's id in its probabilities."""
    answer = httpx.post(server.base + "/completion", timeout=60,
                        json={"prompt": PROMPT, "n_predict": 6, "temperature": 0, "n_probs": 1} | asked)
    assert answer.status_code == 200, answer.text
    return answer.json()


def ids(answer: dict) -> list[int]:
    return [token["id"] for token in answer["completion_probabilities"]]


def test_openais_logit_bias_and_vllms_ignore_eos_through_the_openai_client(served, eos):
    client = served.client()
    plain = ids(completion(served))
    asked = {"model": "tiny", "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    banned = client.completions.create(**asked, logit_bias={str(plain[0]): -100})
    assert banned.choices[0].text == completion(served, logit_bias={str(plain[0]): -100})["content"]
    assert ids(completion(served, logit_bias={str(plain[0]): -100}))[0] != plain[0]
    # the model asked to end at once ends, unless told to ignore its end: then it writes to the limit
    ending = client.completions.create(**asked, logit_bias={str(eos): 100})
    assert ending.choices[0].text == "" and ending.choices[0].finish_reason == "stop"
    onwards = client.completions.create(**asked, logit_bias={str(eos): 100}, extra_body={"ignore_eos": True})
    assert onwards.choices[0].finish_reason == "length" and onwards.usage.completion_tokens == 6
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=5,
                                          temperature=0, logit_bias={str(eos): 100}, extra_body={"ignore_eos": True})
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == 5
    assert "Traceback" not in served.log()


def test_llama_servers_logit_bias_spellings_and_its_settings_answer(served, eos):
    answer = completion(served)
    plain = ids(answer)
    for bias in ([[plain[0], False]], {str(plain[0]): False}):
        assert ids(completion(served, logit_bias=bias))[0] != plain[0], bias
    # a text stands for each token of its spelling, read as plain text is (SentencePiece's "x" is "▁x")
    spelled = httpx.post(served.base + "/tokenize", json={"content": answer["content"]}, timeout=60).json()["tokens"]
    assert set(plain) & set(spelled)
    for bias in ([[answer["content"], False]], {answer["content"]: False}):
        assert not set(ids(completion(served, logit_bias=bias))) & set(spelled), bias
    settings = completion(served, logit_bias=[[plain[0], False], [plain[1], 1.5]], ignore_eos=True)
    assert settings["generation_settings"]["logit_bias"] == [{"token": plain[0], "bias": False},
                                                             {"token": plain[1], "bias": 1.5}]
    assert settings["generation_settings"]["ignore_eos"] is True
    onwards = completion(served, logit_bias=[[eos, 100]], ignore_eos=True)
    assert onwards["tokens_predicted"] == 6 and onwards["stop_type"] == "limit"
    defaults = httpx.get(served.base + "/props", timeout=60).json()["default_generation_settings"]["params"]
    assert defaults["logit_bias"] == [] and defaults["ignore_eos"] is False
    for wrong, said in (({"logit_bias": {"99999999": 1}}, "not in this model's vocabulary"),
                        ({"logit_bias": {"3": True}}, "or false to ban the token"),
                        ({"logit_bias": [[3, 1, 2]]}, "(token id, bias) pairs"),
                        ({"logit_bias": 5}, "logit_bias"), ({"ignore_eos": "yes"}, "ignore_eos")):
        refused = httpx.post(served.base + "/completion", json={"prompt": PROMPT, "n_predict": 2} | wrong, timeout=60)
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
        openai_refused = httpx.post(served.url + "/completions", json={"prompt": PROMPT, "max_tokens": 2} | wrong,
                                    timeout=60)
        assert openai_refused.status_code == 400 and said in openai_refused.text, openai_refused.text
    assert "Traceback" not in served.log()


def test_batch_items_and_the_command_line_take_them_as_llama_cpp_spells_them(localspec, cli, tiny, eos, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "on", "prompt": PROMPT, "temperature": 0, "max_tokens": 5,
                                   "logit_bias": {str(eos): 100}, "ignore_eos": True}) + "\n"
                       + json.dumps({"id": "ends", "prompt": PROMPT, "temperature": 0, "max_tokens": 5,
                                     "logit_bias": [[eos, 100]]}) + "\n")
    done = localspec("batch", tiny["target"], prompts, "--raw")
    assert done.returncode == 0, done.stderr.decode()
    records = {record["id"]: record for record in map(json.loads, done.stdout.decode().splitlines())}
    assert records["on"]["stats"]["tokens"] == 5 and records["on"]["finish_reason"] == "length", records
    assert records["ends"]["text"] == "" and records["ends"]["finish_reason"] == "stop", records
    run = localspec("run", tiny["target"], "-p", PROMPT, "--temp", "0", "-n", "5", "-l", f"{eos}+100", "--ignore-eos",
                    "--json")
    assert run.returncode == 0, run.stderr.decode()
    assert json.loads(run.stdout)["stats"]["tokens"] == 5
    ends = localspec("run", tiny["target"], "-p", PROMPT, "--temp", "0", "-n", "5", "--logit-bias", f"{eos}+100",
                     "--json")
    assert json.loads(ends.stdout)["text"] == ""
    for wrong, said in ((f"{eos}", "--logit-bias takes TOKEN_ID(+/-)BIAS"), ("x+1", "--logit-bias takes"),
                        (f"{eos}+inf", "or -inf to ban it"), ("99999999-1", "not in this model's vocabulary")):
        code, stdout, stderr = cli("run", tiny["target"], "-p", PROMPT, "-n", "2", "-l", wrong)
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert code == 2 and stdout == "" and len(errors) == 1 and said in errors[0], stderr


def test_tokenize_shows_the_ids_a_bias_names(cli, tiny, tmp_path):
    model = Model(tiny["target"], vocab_only=True)
    code, stdout, _ = cli("tokenize", tiny["target"], PROMPT, "--ids")
    assert code == 0 and json.loads(stdout) == model.tokenize(PROMPT, add_special=True, parse_special=True)
    (tmp_path / "Modelfile").write_text(f"FROM {tiny['target']}\nPARAMETER temperature 0.1\n")
    assert cli("create", "made", "-f", tmp_path / "Modelfile")[0] == 0
    assert cli("tokenize", "made", PROMPT, "--ids")[1] == stdout  # a model made with create: its file's
    code, stdout, _ = cli("tokenize", tiny["target"], "-", "--no-special", stdin=PROMPT.encode())
    plain = model.tokenize(PROMPT, add_special=False, parse_special=False)
    assert code == 0 and [int(line.split(" -> ")[0]) for line in stdout.splitlines()] == plain
    # (SentencePiece spells a text with a space ahead)
    assert "".join(ast.literal_eval(line.split(" -> ")[1]) for line in stdout.splitlines()).lstrip() == PROMPT
    code, _, stderr = cli("tokenize", "qwen2.5-7b", "x")
    assert code == 2 and "qwen2.5-7b is not downloaded: `localspec pull qwen2.5-7b`" in stderr
