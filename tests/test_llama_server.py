"""llama-server's own API (/completion, /infill, /tokenize, /detokenize, /props), as tools written for
llama-server (llama.vim and llama.vscode's code completion, scripts reading /props) call it: raw HTTP and
server-sent events, there being no client package for it; and code completion through Ollama's and
OpenAI's `suffix`, through their clients. Its shapes follow llama.cpp's server README and
its own tests (tools/server/tests/unit/test_infill.py's Qwen2.5-Coder case among them)."""

import json
from pathlib import Path

import httpx2 as httpx
import ollama
import openai
import pytest

from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.model import Model
from localspec.errors import InputError, UsageError
from localspec.prompts import INFILL_BATCH, Prompts
from localspec.request import Request, from_wire, to_wire
from localspec.session import Session
from localspec.stats import record

from test_server import ServerProcess
from tinymodels import TinySpec, write_tiny_model

# Qwen2.5-Coder's fill-in-the-middle tokens, which llama.cpp finds by their text
FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")


@pytest.fixture(scope="module")
def coder(tmp_path_factory) -> Path:
    """A tiny model whose vocabulary has a code model's fill-in-the-middle tokens."""
    return write_tiny_model(tmp_path_factory.mktemp("coder") / "coder.gguf",
                            TinySpec(seed=1, sharpness=2.0, control=FIM))


@pytest.fixture(scope="module")
def server(coder, tmp_path_factory):
    running = ServerProcess(tmp_path_factory.mktemp("serve"), coder, "--alias", "coder", "-c", "512")
    yield running
    assert running.stop() == 0, running.log()


def events(response: httpx.Response) -> list[dict]:
    """The server-sent events of a stream, as llama.vscode reads them: a `data: ` line each."""
    return [json.loads(line.removeprefix("data: ")) for line in response.text.splitlines() if line.startswith("data: ")]


def test_an_infill_prompt_is_laid_out_as_llama_servers_and_cut_to_its_shares(coder, tiny):
    model = Model(coder, vocab_only=True)
    fim = model.fim

    def text(s: str) -> list[int]:
        return model.tokenize(s, add_special=False, parse_special=False)

    laid_out = Prompts(model, 4096).infill("def f(", "):\n", [("util.py", "x = 1\n")], "ab", None)
    assert laid_out == [fim["rep"], *text("myproject\n"), fim["sep"], *text("util.py\n"), *text("x = 1\n"),
                        fim["sep"], *text("filename\n"), model.bos, fim["pre"], *text("def f("), *text("ab"),
                        fim["suf"], *text("):\n"), fim["mid"]]
    # the prefix's last 3/4 of llama-server's batch, the suffix's first 1/4 less what is typed, and of the
    # other files what the context leaves beside the answer (one token a letter in this vocabulary)
    long = Prompts(model, 4096).infill("a" * 2000, "b" * 1000, [("big.py", "c" * 3000)], "d", 1000)
    middle = long.index(fim["pre"])
    assert long[middle + 1 : long.index(fim["suf"])] == text("a" * 2000)[-(3 * INFILL_BATCH // 4):] + text("d")
    assert long[long.index(fim["suf"]) + 1 : -1] == text("b" * 1000)[: INFILL_BATCH // 4 - 2 - len(text("d"))]
    files = [fim["rep"], *text("myproject\n"), fim["sep"], *text("big.py\n"), *text("c" * 3000), fim["sep"],
             *text("filename\n")]
    assert long[: middle - 1] == files[-(4096 - INFILL_BATCH - 2 * 1000):]
    with pytest.raises(InputError, match="cannot fill in the middle: its vocabulary has no FIM_PRE, FIM_SUF, FIM_MID"):
        Prompts(Model(tiny["target"], vocab_only=True), 512).infill("a", "b", [], "", None)


def test_completion_answers_and_streams_as_llama_server_with_the_text_openais_route_gives(server):
    openai_text = server.client().completions.create(model="coder", prompt="abc", max_tokens=8,
                                                     temperature=0).choices[0].text
    asked = {"prompt": "abc", "n_predict": 8, "temperature": 0, "cache_prompt": True, "samplers": ["top_k"]}
    whole = httpx.post(server.base + "/completion", json=asked, timeout=60).json()
    assert whole["content"] == openai_text and whole["stop"] is True and whole["model"] == "coder"
    assert whole["tokens_predicted"] == 8 and whole["stop_type"] == "limit" and whole["truncated"] is False
    assert whole["generation_settings"]["n_predict"] == 8 and whole["timings"]["predicted_n"] == 8
    assert whole["speculation"]["steps"] >= 1
    frames = events(httpx.post(server.base + "/completion", json=asked | {"stream": True}, timeout=60))
    assert [frame["stop"] for frame in frames] == [False] * (len(frames) - 1) + [True]
    assert "".join(frame["content"] for frame in frames) == openai_text
    assert frames[-1]["content"] == "" and frames[-1]["tokens_predicted"] == 8 and "timings" in frames[-1]
    # llama.vscode asks for a few fields, some inside timings (kept under their path), and reads ahead with
    # n_predict 0
    few = httpx.post(server.base + "/completion", json=asked | {"response_fields": ["content", "timings/predicted_n"]},
                     timeout=60).json()
    assert few == {"content": openai_text, "timings/predicted_n": 8}
    # n_predict 0 reads a prompt into the cache for the request that follows it, and answers no tokens
    longer = "abc" + "de" * 40
    ahead = httpx.post(server.base + "/completion", json={"prompt": longer, "n_predict": 0}, timeout=60).json()
    assert ahead["content"] == "" and ahead["tokens_predicted"] == 0 and ahead["stop"] is True
    assert ahead["tokens_evaluated"] > 40
    after = httpx.post(server.base + "/completion", json={"prompt": longer + "f", "n_predict": 1}, timeout=60).json()
    assert after["tokens_cached"] >= ahead["tokens_evaluated"] - 1
    probable = httpx.post(server.base + "/completion", json=asked | {"n_probs": 2}, timeout=60).json()
    first = probable["completion_probabilities"][0]
    assert len(probable["completion_probabilities"]) == 8 and len(first["top_logprobs"]) == 2
    assert first["token"] == first["top_logprobs"][0]["token"] and first["logprob"] <= 0  # (greedy: the likeliest)
    # post_sampling_probs: each token's probability in the distribution it was chosen from, and that
    # distribution's likeliest (top-k 3 at temperature 1: three, all of it), whole and streamed
    sampled = asked | {"temperature": 1.0, "top_k": 3, "top_p": 1.0, "min_p": 0.0, "seed": 4, "n_probs": 5,
                       "post_sampling_probs": True}
    for answer in (httpx.post(server.base + "/completion", json=sampled, timeout=60).json(),
                   {"completion_probabilities": [entry for frame in events(httpx.post(
                       server.base + "/completion", json=sampled | {"stream": True}, timeout=60))
                       for entry in frame.get("completion_probabilities", ())]}):
        assert len(answer["completion_probabilities"]) == 8
        for entry in answer["completion_probabilities"]:
            assert set(entry) == {"id", "token", "bytes", "prob", "top_probs"} and len(entry["top_probs"]) == 3
            assert abs(sum(candidate["prob"] for candidate in entry["top_probs"]) - 1) < 1e-6
            assert entry["prob"] == next(c["prob"] for c in entry["top_probs"] if c["id"] == entry["id"])
    assert httpx.post(server.base + "/completion", json=sampled, timeout=60).json()["generation_settings"][
        "post_sampling_probs"] is True
    refused = httpx.post(server.base + "/v1/completions", json={"prompt": "abc", "post_sampling_probs": True},
                         timeout=60)
    assert refused.status_code == 400 and "post_sampling_probs is not supported" in refused.text
    stopped = httpx.post(server.base + "/completion", json=asked | {"stop": [openai_text[2:4]]}, timeout=60).json()
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == openai_text[2:4]
    assert "Traceback" not in server.log()


def test_token_ids_whole_with_return_tokens_and_in_every_streamed_chunk_as_llama_server(server, coder):
    """llama-server's tokens: the whole answer's ids where return_tokens asks (the end-of-generation token's too),
    a stream's chunks each the ids of the tokens its text came of, those whose text a stop string held back too."""
    model = Model(coder, vocab_only=True)
    asked = {"prompt": "abc", "n_predict": 8, "temperature": 0}
    plain = httpx.post(server.base + "/completion", json=asked, timeout=60).json()
    assert plain["tokens"] == []
    whole = httpx.post(server.base + "/completion", json=asked | {"return_tokens": True}, timeout=60).json()
    assert whole["content"] == plain["content"] and len(whole["tokens"]) == 8
    with Session(coder, None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as alone:
        assert whole["tokens"] == record(alone.generate(Request(Sampling(temperature=0), Limits(8),
                                                                prompt="abc"))).ids
    frames = events(httpx.post(server.base + "/completion", json=asked | {"stream": True}, timeout=60))
    assert [token for frame in frames for token in frame["tokens"]] == whole["tokens"]
    assert all(frame["tokens"] for frame in frames[:-1]) and frames[-1]["tokens"] == []
    stop = plain["content"][3:5]
    stopped = asked | {"stop": [stop], "return_tokens": True}
    held = httpx.post(server.base + "/completion", json=stopped, timeout=60).json()
    frames = events(httpx.post(server.base + "/completion", json=stopped | {"stream": True}, timeout=60))
    assert held["stop_type"] == "word" and held["content"] == plain["content"][:3]
    # (the stop string's tokens among them, as llama-server's: all that was generated)
    assert held["tokens"] == whole["tokens"][:held["tokens_predicted"]] and len(held["tokens"]) == held["tokens_predicted"]
    assert [token for frame in frames for token in frame["tokens"]] == held["tokens"]
    # an answer that ends with the end-of-generation token lists it, streamed in a chunk of its own with no text
    eos = model.eog_tokens[0]
    ending = asked | {"logit_bias": [[eos, 100]], "return_tokens": True}
    ended = httpx.post(server.base + "/completion", json=ending, timeout=60).json()
    assert ended["stop_type"] == "eos" and ended["tokens"] == [eos] and ended["content"] == ""
    frames = events(httpx.post(server.base + "/completion", json=ending | {"stream": True}, timeout=60))
    assert [(frame["content"], frame["tokens"], frame["stop"]) for frame in frames] == [("", [eos], False),
                                                                                        ("", [], True)]
    assert "Traceback" not in server.log()


def test_several_prompts_and_n_cmpl_answer_as_llama_server_an_array_or_side_by_side_events(server):
    """A list of prompts (texts or token-id lists) and n_cmpl answers to each: a JSON array, each answer's index its
    prompt's times n_cmpl plus its own, each as that prompt alone is answered; streamed, their events side by side,
    each answer's ending with its own stop; a seed goes on by one an answer, as llama-server's children's seeds."""
    asked = {"n_predict": 6, "temperature": 0}
    ids = httpx.post(server.base + "/tokenize", json={"content": "xyz"}, timeout=60).json()["tokens"]
    prompts = ["abc", ids, "hello"]
    alone = [httpx.post(server.base + "/completion", json=asked | {"prompt": prompt}, timeout=60).json()["content"]
             for prompt in prompts]
    several = httpx.post(server.base + "/completion", json=asked | {"prompt": prompts, "n_cmpl": 2}, timeout=60).json()
    assert [answer["index"] for answer in several] == list(range(6))
    assert [answer["content"] for answer in several] == [text for text in alone for _ in range(2)]
    frames = events(httpx.post(server.base + "/completion", json=asked | {"prompt": prompts, "n_cmpl": 2,
                                                                          "stream": True}, timeout=60))
    for index in range(6):
        own = [frame for frame in frames if frame["index"] == index]
        assert "".join(frame["content"] for frame in own) == alone[index // 2]
        assert [frame["stop"] for frame in own] == [False] * (len(own) - 1) + [True]
    # (a seed repeats a sampled text where the drafts repeat too: here none, docs/serve.md)
    sampled = {"prompt": "abc", "n_predict": 6, "temperature": 1.0, "seed": 7, "n_cmpl": 3,
               "speculative": {"mode": "off"}}
    answers = httpx.post(server.base + "/completion", json=sampled, timeout=60).json()
    assert [answer["generation_settings"]["seed"] for answer in answers] == [7, 8, 9]
    assert answers[1]["content"] == httpx.post(server.base + "/completion", json=sampled | {"seed": 8, "n_cmpl": 1},
                                               timeout=60).json()["content"]
    one = httpx.post(server.base + "/completion", json=asked | {"prompt": ["abc"]}, timeout=60).json()
    assert isinstance(one, dict) and one["content"] == alone[0]  # (one answer: an object, as llama-server)
    many = httpx.post(server.base + "/completion", json=asked | {"prompt": ["a"] * 9, "n_cmpl": 2}, timeout=60)
    assert many.status_code == 400 and "at most 16 answers" in many.json()["error"]["message"]
    assert "Traceback" not in server.log()


def test_return_progress_streams_a_long_prompts_reading_as_llama_server(coder, tmp_path):
    """llama-server's return_progress (its web UI's progress bar; a 400 before): a streamed answer's chunks show the
    prompt's reading as it goes, a batch at a time (a quarter of one beside the other sequences' rows, -np 2),
    before its text; a prompt that fits one batch, and an answer not streamed, show none."""
    running = ServerProcess(tmp_path, coder, "--alias", "coder", "-c", "512", "-b", "32", "-np", "2")
    try:
        long = "abc de " * 30
        asked = {"prompt": long, "n_predict": 4, "temperature": 0, "stream": True, "return_progress": True}
        frames = events(httpx.post(running.base + "/completion", json=asked, timeout=60))
        progress = [frame["prompt_progress"] for frame in frames if "prompt_progress" in frame]
        total = frames[-1]["tokens_evaluated"]
        assert len(progress) > 3 and {(p["total"], p["cache"]) for p in progress} == {(total, 0)}
        assert [p["processed"] for p in progress] == [*range(8, total - 1, 8), total - 1]
        assert frames.index(next(f for f in frames if f["content"])) == len(progress)  # (the reading first)
        assert all(frame["content"] == "" and frame["tokens"] == [] for frame in frames if "prompt_progress" in frame)
        again = events(httpx.post(running.base + "/completion", json=asked | {"prompt": long + "xyz"}, timeout=60))
        assert not [frame for frame in again if "prompt_progress" in frame]  # (all but three tokens were cached)
        assert "".join(frame["content"] for frame in frames) == httpx.post(
            running.base + "/completion", json={"prompt": long, "n_predict": 4, "temperature": 0}, timeout=60
        ).json()["content"]
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_llama_servers_spellings_without_v1_answer_as_with_it(server):
    """A client given llama-server's address without /v1 (the openai package then calls /chat/completions,
    /models, /responses) is answered as on /v1; /completions is llama-server's own completion, as /completion."""
    bare, with_v1 = openai.OpenAI(base_url=server.base, api_key="unused", max_retries=0), server.client()
    assert [model.id for model in bare.models.list()] == [model.id for model in with_v1.models.list()]
    chat = {"model": "coder", "messages": [{"role": "user", "content": "abc"}], "max_tokens": 6, "temperature": 0}
    assert bare.chat.completions.create(**chat).choices[0].message.content \
        == with_v1.chat.completions.create(**chat).choices[0].message.content
    response = {"model": "coder", "input": "abc", "max_output_tokens": 6, "temperature": 0}
    assert bare.responses.create(**response).output_text == with_v1.responses.create(**response).output_text
    native = {"prompt": "abc", "n_predict": 8, "temperature": 0}
    plural = httpx.post(server.base + "/completions", json=native, timeout=60).json()
    assert plural["content"] == httpx.post(server.base + "/completion", json=native, timeout=60).json()["content"]
    assert plural["stop_type"] == "limit"


def test_infill_reads_the_prompt_llama_server_would_and_refuses_what_it_refuses(server, coder):
    asked = {"input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n", "prompt": "    return",
             "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
             "n_predict": 6, "temperature": 0}
    answer = httpx.post(server.base + "/infill", json=asked, timeout=60)
    assert answer.status_code == 200, answer.text
    expected = Prompts(Model(coder, vocab_only=True), 512).infill(
        asked["input_prefix"], asked["input_suffix"], [("util.py", asked["input_extra"][0]["text"])], asked["prompt"],
        None)  # (serve's default: no limit of its own)
    assert answer.json()["tokens_evaluated"] == len(expected) and answer.json()["tokens_predicted"] <= 6
    frames = events(httpx.post(server.base + "/infill", json=asked | {"stream": True}, timeout=60))
    assert "".join(frame["content"] for frame in frames) == answer.json()["content"]
    # llama.cpp's own test_invalid_input_extra_req cases, the fields it needs, and what localspec cannot honour
    for wrong, said in (({"input_extra": [{}]}, "input_extra.0.text"),
                        ({"input_extra": [{"filename": "ok"}]}, "input_extra.0.text"),
                        ({"input_extra": [{"filename": 123}]}, "input_extra.0"),
                        ({"input_extra": [{"filename": 123, "text": "abc"}]}, "input_extra.0.filename"),
                        ({"input_extra": [{"filename": 123, "text": 456}]}, "input_extra.0"),
                        ({"input_suffix": None}, "input_suffix"), ({"n_cmpl": 17}, "n_cmpl"),
                        ({"lora": [{"id": 0, "scale": 1}]}, "lora: no adapter 0 is loaded (none: give serve --lora FILE"),
                        ({"mirostat": 3}, "mirostat must be 0 (off), 1 or 2")):
        refused = httpx.post(server.base + "/infill", json={k: v for k, v in (asked | wrong).items() if v is not None},
                             timeout=60)
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
        assert set(refused.json()["error"]) == {"code", "message", "type"}
    assert "Traceback" not in server.log()


def test_a_suffix_fills_in_the_middle_through_ollamas_and_openais_clients(server, coder):
    """Ollama's /api/generate and /v1/completions take the code after the cursor as `suffix` (Continue's and
    twinny's Ollama autocomplete, `ollama.generate(suffix=...)`): the model reads prefix, suffix and middle
    with its FIM tokens, as Ollama's templates for code models spell them."""
    assert "insert" in ollama.Client(host=server.base).show("coder").capabilities  # (Ollama's word for it)
    prefix, suffix = "def add(a, b):\n", "\n\nprint(add(1, 2))\n"
    spelled = "<|fim_prefix|>" + prefix + "<|fim_suffix|>" + suffix + "<|fim_middle|>"
    laid_out = httpx.post(server.base + "/completion", timeout=60,
                          json={"prompt": spelled, "n_predict": 8, "temperature": 0}).json()
    assert laid_out["tokens_evaluated"] == len(Prompts(Model(coder, vocab_only=True), 512).fill_in(prefix, suffix))
    ollamas = ollama.Client(host=server.base).generate(model="coder", prompt=prefix, suffix=suffix,
                                                       options={"temperature": 0, "num_predict": 8})
    assert ollamas.response == laid_out["content"]
    openais = server.client().completions.create(model="coder", prompt=prefix, suffix=suffix, max_tokens=8,
                                                 temperature=0)
    assert openais.choices[0].text == laid_out["content"]
    assert openais.usage.prompt_tokens == laid_out["tokens_evaluated"]
    streamed = ollama.Client(host=server.base).generate(model="coder", prompt=prefix, suffix=suffix, stream=True,
                                                        options={"temperature": 0, "num_predict": 8})
    assert "".join(part.response for part in streamed) == laid_out["content"]
    # raw: the prompt is the client's own, suffix and all (as in Ollama); a chat has no suffix; token ids neither
    raw = ollama.Client(host=server.base).generate(model="coder", prompt=spelled, suffix=suffix, raw=True,
                                                   options={"temperature": 0, "num_predict": 8})
    assert raw.response == laid_out["content"]
    for path, body, said in (("/v1/completions", {"prompt": [1, 2, 3], "suffix": "x"}, "suffix goes with a text"),
                             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "suffix": "x"},
                              "suffix is not supported")):
        refused = httpx.post(server.base + path, json={"model": "coder", "max_tokens": 2} | body, timeout=60)
        assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
    assert "Traceback" not in server.log()


def test_show_says_a_model_that_fills_in_the_middle_takes_a_suffix(cli, coder):
    code, out, _ = cli("show", str(coder), "--json")
    assert code == 0 and json.loads(out)["capabilities"] == ["completion", "insert"]


def test_a_suffix_travels_on_serves_own_stream():
    asked = Request(prompt="def f(", suffix="):\n")
    assert from_wire(json.loads(json.dumps(to_wire(asked)))) == asked
    with pytest.raises(UsageError, match="suffix: text"):
        from_wire({"prompt": "def f(", "suffix": 3})


def test_a_model_without_fill_in_the_middle_tokens_is_refused_a_suffix(tiny, tmp_path):
    with Session(tiny["target"], None, Runtime(ctx_size=256), Speculation(DrafterKind.NGRAM)) as session:
        with pytest.raises(InputError, match="cannot fill in the middle: its vocabulary has no FIM_PRE, FIM_SUF, FIM_MID"):
            session.prompts.prepare(Request(prompt="def f(", suffix="):\n"))
    running = ServerProcess(tmp_path, tiny["target"], "--alias", "tiny", "-c", "256")
    try:
        with pytest.raises(ollama.ResponseError) as refused:
            ollama.Client(host=running.base).generate(model="tiny", prompt="def f(", suffix="):\n")
        assert refused.value.status_code == 400 and "cannot fill in the middle" in refused.value.error
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


# a chat template that reads variables of its own, as Llama 3.1's reads date_string and DeepSeek V3.1's thinking
DATED = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if date_string is defined %}today: {{ date_string }}\n{% endif %}{% if thinking %}<think>\n{% endif %}"
         "assistant:")


def test_chat_template_kwargs_reach_the_template_from_the_request_and_from_the_command_line(tmp_path):
    """llama-server's chat_template_kwargs (every key, not only enable_thinking and reasoning_effort: the rest
    were taken and dropped) and its --chat-template-kwargs, under each request's own, for every protocol."""
    model = write_tiny_model(tmp_path / "dated.gguf", TinySpec(seed=1, chat_template=DATED, control=FIM))
    server = ServerProcess(tmp_path, model, "--alias", "tiny", "-c", "512", "--chat-template-kwargs",
                           '{"date_string": "1 Jan 2026"}')
    chat = [{"role": "user", "content": "hi"}]
    try:
        # Ollama's chat has no such field: the command line's reach it as they reach every protocol (first: all
        # of its prompt is read, none found cached)
        by_ollama = ollama.Client(host=server.base).chat(model="tiny", messages=chat, options={"num_predict": 1})

        def rendered(**kwargs) -> str:
            return httpx.post(server.base + "/apply-template", json={"messages": chat} | kwargs, timeout=60).json()["prompt"]

        assert "today: 1 Jan 2026\nassistant:" in rendered()
        assert "today: 2 Feb 2026\n<think>\nassistant:" in rendered(
            chat_template_kwargs={"date_string": "2 Feb 2026", "thinking": True})
        client = server.client()

        def read(**kwargs) -> int:
            return client.chat.completions.create(model="tiny", messages=chat, max_tokens=1, **kwargs).usage.prompt_tokens

        plain, thinking = read(), read(extra_body={"chat_template_kwargs": {"thinking": True}})
        assert thinking > plain == by_ollama.prompt_eval_count
        for wrong, words in (({"messages": []}, "messages is the request's own"),
                             ({"date_string": FIM[0]}, "contains the text of a control token")):
            with pytest.raises(openai.BadRequestError, match=words):
                read(extra_body={"chat_template_kwargs": wrong})
        assert httpx.get(server.base + "/health").json()["status"] == "ok"
    finally:
        assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()


def test_run_chat_and_the_library_hand_the_template_their_variables(localspec, tmp_path):
    model = write_tiny_model(tmp_path / "dated.gguf", TinySpec(seed=1, chat_template=DATED))

    def read(*more) -> int:
        done = localspec("run", model, "-p", "hi", "-n", "1", "--json", *more)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["stats"]["prompt_tokens"]

    assert read("--chat-template-kwargs", '{"thinking": true}') > read()
    with Session(model, None, Runtime(ctx_size=256), Speculation()) as session:
        chat = [{"role": "user", "content": "hi"}]
        # (longer than today's date, which the template is given where no variable says otherwise, as by llama.cpp)
        day = {"date_string": "the first of January, 2026"}
        dated = session.count_tokens(Request(messages=chat, template_variables=day))
        assert dated > session.count_tokens(Request(messages=chat))
        conversation = session.chat(template_variables=day)
        assert conversation.send("hi", max_tokens=1).summary.prompt_tokens == dated


@pytest.mark.slow
def test_apply_template_gives_the_prompt_a_chat_is_read_as_for_completion_to_go_on_from(real_model, tmp_path):
    """llama-server's /apply-template: the chat's prompt as text, which /completion reads back into the same
    tokens (a BPE vocabulary's; a SentencePiece one splits a text otherwise than its pieces) and so answers
    as the chat does."""
    server = ServerProcess(tmp_path, real_model("qwen2.5-coder-1.5b"), "--alias", "coder", "-c", "1024", "--offline")
    try:
        chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime number."}]
        prompt = httpx.post(server.base + "/apply-template", json={"messages": chat}).json()["prompt"]
        assert prompt.startswith("<|im_start|>system\nBe brief.") and prompt.endswith("<|im_start|>assistant\n")
        as_chat = server.client().chat.completions.create(model="coder", messages=chat, max_tokens=8, temperature=0)
        as_text = httpx.post(server.base + "/completion", json={"prompt": prompt, "n_predict": 8, "temperature": 0},
                             timeout=60).json()
        assert as_text["content"] == as_chat.choices[0].message.content
        assert as_text["tokens_evaluated"] == as_chat.usage.prompt_tokens
        assert "Traceback" not in server.log()
    finally:
        assert server.stop() == 0, server.log()


def test_tokenize_detokenize_and_props_answer_as_llama_server(server, coder):
    tokens = httpx.post(server.base + "/tokenize", json={"content": "abc"}).json()["tokens"]
    with_bos = httpx.post(server.base + "/tokenize", json={"content": "abc", "add_special": True}).json()["tokens"]
    pieces = httpx.post(server.base + "/tokenize", json={"content": "abc", "with_pieces": True}).json()["tokens"]
    model = Model(coder, vocab_only=True)
    assert with_bos == [model.bos, *tokens] and [piece["id"] for piece in pieces] == tokens
    assert "".join(piece["piece"] for piece in pieces).strip() == "abc"
    special = httpx.post(server.base + "/tokenize", json={"content": "<|fim_prefix|>a"}).json()["tokens"]
    assert special[0] == model.fim["pre"]  # (parse_special, llama-server's default)
    assert httpx.post(server.base + "/detokenize", json={"tokens": tokens}).json()["content"].strip() == "abc"
    wrong = httpx.post(server.base + "/detokenize", json={"tokens": [10**9]})
    assert wrong.status_code == 400 and "vocabulary" in wrong.json()["error"]["message"]
    props = httpx.get(server.base + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512 and props["total_slots"] >= 1
    assert Path(props["model_path"]) == coder.resolve() and props["modalities"] == {"vision": False, "audio": False}
    assert props["default_generation_settings"]["params"]["temperature"] == 0.8


@pytest.mark.slow
def test_qwen_coder_infills_as_in_llama_cpps_own_test(real_model):
    """llama.cpp's test_infill.py asks Qwen2.5-Coder 1.5B (its base model, IQ3_XXS) to infill this and
    expects the three lines below; the instruct model the registry carries (Q4_K_M) writes them too."""
    target = real_model("qwen2.5-coder-1.5b")
    with Session(target, None, Runtime(ctx_size=4096), Speculation(DrafterKind.NGRAM)) as session:
        prompt = session.prompts.infill("#include <cstdio>\n#include \"llama.h\"\n\nint main() {\n", "}\n",
                                        [("llama.h", "LLAMA_API int32_t llama_n_threads();\n")],
                                        "    int n_threads = llama_", 32)
        reply = session.complete(prompt, temperature=0, max_tokens=32)
    assert reply.text.startswith('n_threads();\n    printf("Number of threads: %d\\n", n_threads);\n    return 0;\n')


@pytest.mark.slow
def test_a_code_completion_ends_at_a_line_less_indented_or_at_a_newline_past_its_time(real_model):
    """llama-server's n_indent and t_max_predict_ms, by which llama.vim and llama.vscode end a suggestion
    where its block ends or once it has taken its time (they were taken and left alone: every suggestion
    ran to n_predict)."""
    prompt = "def fizzbuzz(n):\n    for i in range(1, n + 1):\n"
    with Session(real_model("qwen2.5-coder-1.5b"), None, Runtime(ctx_size=1024), Speculation(DrafterKind.NGRAM)) as session:
        def complete(**limits) -> tuple[str, str]:
            events = list(session.generate(Request(Sampling(temperature=0), Limits(max_tokens=160, **limits),
                                                   prompt=prompt)))
            return record(events).text, events[-1].finish_reason

        whole, _ = complete()
        block, why = complete(indent=8)
        assert why == "length" and whole.startswith(block) and len(block) < len(whole)
        later_lines = block.split("\n")[1:]
        assert all(line.startswith(" " * 8) for line in later_lines[:-1]) and not later_lines[-1].strip()
        line, why = complete(seconds=1e-9)
        assert why == "length" and whole.startswith(line) and line.count("\n") >= 1
        assert "\n" not in line[line.index("\n") + 1:]  # (the first newline, its token's trailing spaces kept)


def test_slots_show_each_sequence_and_save_restore_and_erase_its_cache_as_llama_server(coder, tmp_path):
    """llama-server's GET /slots and POST /slots/ID?action=save|restore|erase (--slot-save-path): were a 404. A saved
    slot is a file of llama.cpp's sequence-state format; read back into a slot, a prompt that begins alike is read
    from it."""
    folder = tmp_path / "slots"
    running = ServerProcess(tmp_path, coder, "--alias", "coder", "-c", "512", "-np", "2", "--slot-save-path", folder)
    try:
        base = running.base
        shown = httpx.get(base + "/slots", timeout=30).json()
        assert [slot["id"] for slot in shown] == [0, 1] and not any(slot["is_processing"] for slot in shown)
        assert shown[0]["n_ctx"] == 512 and shown[0]["params"]["temperature"] == 0.8
        prompt = "abc de " * 12
        asked = {"prompt": prompt, "n_predict": 4, "temperature": 0}
        first = httpx.post(base + "/completion", json=asked, timeout=60).json()
        saved = httpx.post(base + "/slots/0?action=save", json={"filename": "warm.bin"}, timeout=60).json()
        assert saved["id_slot"] == 0 and saved["filename"] == "warm.bin"
        assert saved["n_saved"] >= first["tokens_evaluated"] and saved["n_written"] == (folder / "warm.bin").stat().st_size
        assert (folder / "warm.bin").read_bytes()[:4] == b"qsgg"  # (llama.cpp's 'ggsq', little-endian)
        assert "save_ms" in saved["timings"]
        erased = httpx.post(base + "/slots/0?action=erase", timeout=60).json()
        assert erased == {"id_slot": 0, "n_erased": saved["n_saved"]}
        cold = httpx.post(base + "/completion", json=asked, timeout=60).json()
        assert cold["tokens_cached"] == 0 and cold["content"] == first["content"]
        httpx.post(base + "/slots/0?action=erase", timeout=60)
        restored = httpx.post(base + "/slots/0?action=restore", json={"filename": "warm.bin"}, timeout=60).json()
        assert restored["n_restored"] == saved["n_saved"] and restored["n_read"] == saved["n_written"]
        again = httpx.post(base + "/completion", json=asked, timeout=60).json()
        assert again["tokens_cached"] == first["tokens_evaluated"] - 1 and again["content"] == first["content"]
        for path, body, said in (("/slots/0?action=save", {"filename": "../out.bin"}, "Invalid filename"),
                                 ("/slots/0?action=save", {"filename": ".hidden"}, "Invalid filename"),
                                 ("/slots/7?action=save", {"filename": "x.bin"}, "Invalid slot ID"),
                                 ("/slots/0?action=copy", {"filename": "x.bin"}, "Invalid action"),
                                 ("/slots/0?action=restore", {"filename": "none.bin"}, "no file none.bin")):
            refused = httpx.post(base + path, json=body, timeout=30)
            assert refused.status_code == 400 and said in refused.json()["error"]["message"], refused.text
        (folder / "junk.bin").write_bytes(b"qsgg" + b"\0" * 40)
        refused = httpx.post(base + "/slots/1?action=restore", json={"filename": "junk.bin"}, timeout=30)
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "invalid_request_error"
        assert not (tmp_path / "out.bin").exists()
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_slot_actions_without_a_save_path_and_slots_turned_off_are_llama_servers_501(server, coder, tmp_path):
    refused = httpx.post(server.base + "/slots/0?action=save", json={"filename": "a.bin"}, timeout=30)
    assert refused.status_code == 501 and "--slot-save-path" in refused.json()["error"]["message"]
    assert refused.json()["error"]["type"] == "not_supported_error"
    running = ServerProcess(tmp_path, coder, "--alias", "coder", "-c", "256", "--no-slots")
    try:
        refused = httpx.get(running.base + "/slots", timeout=30)
        assert refused.status_code == 501 and "--slots" in refused.json()["error"]["message"]
    finally:
        assert running.stop() == 0, running.log()
