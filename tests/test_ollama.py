"""Ollama's API on serve's port, through the `ollama` package as Open WebUI and agent frameworks call it."""

import json
import math

import httpx2 as httpx
import numpy as np
import ollama
import pytest

from localspec.protocols.ollama import keep_alive, running
from localspec.protocols.shared import ApiError
from localspec.config import DrafterKind, Limits, Runtime, Sampling, Speculation
from localspec.engine.model import Model
from localspec.prompts import Prompts
from localspec.request import Request
from localspec.session import Session, without_oldest_turns
from localspec.stats import record
from localspec.store import gguf_meta
from test_server import PENALTIES, PROMPT, WRONG_VALUES, _paths, _replaced, drafting_server, plain_text


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    running = drafting_server(tmp_path_factory.mktemp("serve"), tiny)
    yield running
    assert running.stop() == 0, running.log()


def client(server) -> ollama.Client:
    return ollama.Client(host=server.base)


def test_ps_says_the_share_of_a_models_layers_on_gpus_as_ollama_does(tiny):
    """/api/ps's size_vram was 0 wherever the layers ran (`ollama ps` showed 100% CPU on a GPU): now the
    file's bytes times the share of its layers offloaded, as `ollama ps` reads it (48%/52% CPU/GPU)."""
    size = tiny["target"].stat().st_size
    info = gguf_meta.read(tiny["target"])
    shares = [m["size_vram"] for m in running([("a", info, None, 0.0), ("b", info, None, 2 / 3), ("c", info, 0, 1.0)])
              ["models"]]
    assert shares == [0, round(size * 2 / 3), size]


def test_the_model_is_listed_shown_and_running(server, tiny):
    listed = client(server).list().models
    assert [m.model for m in listed] == ["tiny"] and listed[0].size == tiny["target"].stat().st_size
    assert listed[0].details.format == "gguf" and listed[0].details.family == "llama"
    [loaded] = client(server).ps().models
    assert loaded.model == "tiny" and loaded.size_vram == 0  # `ollama ps`: 100% CPU, as on this CPU build
    shown = client(server).show("tiny")
    assert shown.details.family == "llama" and shown.modelinfo["general.architecture"] == "llama"
    # one parameter size everywhere (tags said 1.8B where show said 1.5B): the file's, as `localspec show` says it
    from localspec.store import catalog
    assert listed[0].details.parameter_size == shown.details.parameter_size \
        == catalog.model_card(str(tiny["target"])).parameters
    assert shown.capabilities == ["completion"]  # its template offers no tools
    assert httpx.get(server.base + "/api/version").json()["version"]


def test_a_streamed_chat_says_what_plain_decoding_says_and_ends_with_its_record(server, tiny):
    messages = [{"role": "user", "content": PROMPT}]
    parts = list(client(server).chat("tiny", messages=messages, stream=True, options={"num_predict": 12}))
    assert all(not part.done for part in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(part.message.content for part in parts) == plain_text(tiny, messages, max_tokens=12)
    assert parts[-1].eval_count == 12 and parts[-1].eval_duration > 0 and parts[-1].prompt_eval_count > 0
    raw = httpx.post(server.base + "/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                                       "options": {"num_predict": 12}}).json()
    assert raw["speculation"]["draft_tokens"] > 0 and raw["message"]["content"] == parts[0].message.content + "".join(
        part.message.content for part in parts[1:])


def test_generate_whole_or_streamed_and_an_empty_prompt_loads_the_model(server, tiny):
    whole = client(server).generate("tiny", prompt=PROMPT, options={"num_predict": 8, "temperature": 0})
    assert whole.done and whole.response == plain_text(tiny, [{"role": "user", "content": PROMPT}], max_tokens=8)
    streamed = "".join(part.response for part in client(server).generate("tiny", prompt=PROMPT, stream=True,
                                                                           options={"num_predict": 8}))
    assert streamed == whole.response
    raw = client(server).generate("tiny", prompt=PROMPT, raw=True, options={"num_predict": 8})
    assert raw.response == plain_text(tiny, prompt=PROMPT, max_tokens=8)
    loaded = client(server).generate("tiny", prompt="")
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""


def test_format_json_or_a_schema_shapes_the_answer(server):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    answer = client(server).chat("tiny", messages=[{"role": "user", "content": "hi"}], format=schema,
                                 options={"num_predict": 64})
    assert json.loads(answer.message.content) in ({"ok": True}, {"ok": False})
    assert client(server).generate("tiny", prompt="hi", format="json", options={"num_predict": 4}).response.startswith("{")
    yaml = httpx.post(server.base + "/api/generate", json={"model": "tiny", "prompt": "hi", "format": "yaml"})
    assert yaml.status_code == 400 and "format must be" in yaml.json()["error"]


def test_embed_gives_the_vectors_the_openai_endpoint_gives(server):
    vectors = client(server).embed("tiny", input=["the cat", "the dog"]).embeddings
    openai_side = httpx.post(server.url + "/embeddings", json={"input": ["the cat", "the dog"],
                                                               "encoding_format": "float"}).json()["data"]
    assert len(vectors) == 2 and all(len(v) == 64 for v in vectors)
    assert all(abs(a - b) < 1e-6 for v, o in zip(vectors, openai_side) for a, b in zip(v, o["embedding"]))


def test_embed_cuts_what_is_longer_than_the_context_as_ollama_does_and_keeps_the_dimensions_asked(server):
    """Ollama's truncate (its default) cuts an input to the context (it was a 400); false refuses it. Its dimensions
    keeps the vector's first that many, normalized again (it was taken and ignored)."""
    long = "abc " * 400  # (more tokens than the server's 512)
    [cut] = client(server).embed("tiny", input=long).embeddings
    assert len(cut) == 64
    with pytest.raises(ollama.ResponseError, match="raise --ctx-size or shorten it"):
        client(server).embed("tiny", input=long, truncate=False)
    [whole] = client(server).embed("tiny", input="the cat").embeddings
    raw = httpx.post(server.base + "/embedding", json={"content": "the cat", "embd_normalize": -1}).json()
    first = np.array(raw[0]["embedding"][0][:8])
    [short] = client(server).embed("tiny", input="the cat", dimensions=8).embeddings
    assert np.allclose(short, first / np.linalg.norm(first), atol=1e-6) and not np.allclose(short, whole[:8])
    with pytest.raises(ollama.ResponseError, match="from 1 to 64"):
        client(server).embed("tiny", input="the cat", dimensions=65)


@pytest.mark.parametrize("options, message", [
    ({"tfs_z": 0.5}, "options.tfs_z is not supported"),
    ({"mirostat": 3}, "mirostat must be 0 (off), 1 or 2"),
    ({"repeat_penalty": 0}, "repeat penalty must be > 0"),
    ({"num_predict": 0}, "num_predict must be"),
    ({"temperature": -1}, "temperature must be >= 0"),
    ({"made_up": 1}, "not an option localspec knows"),
])
def test_options_that_cannot_be_honoured_are_one_error_in_ollamas_shape(server, options, message):
    with pytest.raises(ollama.ResponseError) as raised:
        client(server).chat("tiny", messages=[{"role": "user", "content": "hi"}], options=options)
    assert raised.value.status_code == 400 and message in raised.value.error
    # resource options are fixed when serve starts: taken and ignored
    assert client(server).chat("tiny", messages=[{"role": "user", "content": "hi"}],
                               options={"num_ctx": 8192, "num_predict": 2}).done
    # no messages is Ollama's "load the model" (it was a 400, where an empty prompt to /api/generate loaded it)
    loading = httpx.post(server.base + "/api/chat", json={"model": "tiny", "messages": []}, timeout=60)
    assert loading.status_code == 200 and loading.json()["done_reason"] == "load", loading.text
    assert loading.json()["message"] == {"role": "assistant", "content": ""} and loading.json()["done"]
    # options a client leaves unset and writes as null are not set (a 400 before, "not supported (only 1)")
    unset = httpx.post(server.base + "/api/generate", json={"model": "tiny", "prompt": "hi", "stream": False, "options": {
        "tfs_z": None, "penalize_newline": None, "made_up": None, "num_predict": 2}}, timeout=60)
    assert unset.status_code == 200 and unset.json()["eval_count"] <= 2, unset.text


def test_a_context_larger_than_serve_loaded_is_said_once_in_the_log(server):
    """Continue sends its context length as options.num_ctx with every request: it was passed over in silence (the
    model keeps the context serve loaded it with); a larger one is said once a size."""
    for num_ctx in (8192, 8192, 100_000, 64):
        assert client(server).chat("tiny", messages=[{"role": "user", "content": "hi"}],
                                   options={"num_ctx": num_ctx, "num_predict": 2}).done
    assert client(server).embed("tiny", "hi", options={"num_ctx": 8192}).embeddings
    said = [line for line in server.log().splitlines() if "options.num_ctx" in line]
    assert sorted(int(line.split("options.num_ctx ")[1].split()[0]) for line in said) == [8192, 100_000], said
    assert "tiny is loaded with a context of 512 tokens (serve's -c sets it)" in said[0]


def test_ollamas_penalties_are_honoured_and_the_drafted_text_stays_plain_decodings(server, tiny):
    """Ollama's own defaults (repeat_penalty 1.1 over the last 64 tokens), as its clients send them, and more."""
    messages = [{"role": "user", "content": PROMPT}]
    for options in ({"repeat_penalty": 1.1, "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0},
                    PENALTIES):
        answer = client(server).chat("tiny", messages=messages, options={**options, "num_predict": 24})
        sampling = Sampling(temperature=0, **options)
        assert answer.message.content == plain_text(tiny, messages, max_tokens=24, sampling=sampling)
    assert answer.message.content != plain_text(tiny, messages, max_tokens=24)
    raw = httpx.post(server.base + "/api/chat", json={"model": "tiny", "messages": messages, "stream": False,
                                                       "options": {**PENALTIES, "num_predict": 24}}).json()
    assert raw["speculation"]["accepted_tokens"] > 0


def test_logprobs_whole_and_streamed_through_the_ollama_client(server):
    messages = [{"role": "user", "content": PROMPT}]
    answer = client(server).chat("tiny", messages=messages, logprobs=True, top_logprobs=2, options={"num_predict": 12})
    assert len(answer.logprobs) == answer.eval_count == 12
    assert all(entry.logprob <= 0 and len(entry.top_logprobs) == 2 and entry.top_logprobs[0].token == entry.token
               for entry in answer.logprobs)
    parts = list(client(server).chat("tiny", messages=messages, logprobs=True, top_logprobs=2, stream=True,
                                     options={"num_predict": 12}))
    assert [e.token for part in parts for e in part.logprobs or ()] == [e.token for e in answer.logprobs]
    assert client(server).chat("tiny", messages=messages, options={"num_predict": 2}).logprobs is None


def test_generate_hands_back_its_context_and_goes_on_from_one(server, tiny):
    """Ollama's deprecated context, as scripts and older clients still keep a conversation with it: the answer hands
    back the tokens read and written, and a request that sends them goes on from them, read again from the cache."""
    model = Model(tiny["target"], vocab_only=True)
    options = {"num_predict": 8, "temperature": 0}
    first = client(server).generate("tiny", prompt=PROMPT, options=options)
    read = Prompts(model, 512).chat_tokens([{"role": "user", "content": PROMPT}])
    assert first.context[:len(read)] == read and len(first.context) == len(read) + first.eval_count
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as alone:
        assert first.context[len(read):] == record(alone.generate(Request(Sampling(temperature=0), Limits(8),
                                                                          prompt=read))).ids
    second = client(server).generate("tiny", prompt="and then?", context=first.context, options=options)
    after = Prompts(model, 512).chat_tokens([{"role": "user", "content": "and then?"}])
    assert after[0] == model.bos  # (read on from the earlier tokens without it)
    assert second.response == plain_text(tiny, prompt=first.context + after[1:], max_tokens=8)
    assert second.context[:len(first.context)] == first.context
    # the whole prompt, as Ollama's runner counts it (the part its cache held included: it was the rest alone)
    assert second.prompt_eval_count == len(first.context) + len(after[1:])
    streamed = list(client(server).generate("tiny", prompt="and then?", context=first.context, options=options,
                                            stream=True))
    assert [part.context is not None for part in streamed] == [False] * (len(streamed) - 1) + [True]
    assert streamed[-1].context == second.context
    # raw: read on from the context as well (Ollama leaves it out there), and no context handed back, as Ollama
    raw = client(server).generate("tiny", prompt="xyz", raw=True, context=first.context, options=options)
    assert raw.context is None and raw.response == plain_text(
        tiny, prompt=first.context + model.tokenize("xyz", add_special=False, parse_special=True), max_tokens=8)
    wrong = httpx.post(server.base + "/api/generate", json={"model": "tiny", "prompt": "hi", "context": [10**9],
                                                          "stream": False})
    assert wrong.status_code == 400 and "context" in wrong.json()["error"]
    truth = httpx.post(server.base + "/api/generate", json={"model": "tiny", "prompt": "hi", "context": [True],
                                                          "stream": False})  # (read as token 1)
    assert truth.status_code == 400 and "context" in truth.json()["error"]
    chat = httpx.post(server.base + "/api/chat", json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                                                       "stream": False, "options": options}).json()
    assert "context" not in chat  # (a chat has none)
    # a stop string's tokens are no part of it: the context handed back read the stop the client never saw
    stop = first.response[5:8]
    stopped = client(server).generate("tiny", prompt=PROMPT, options=options | {"stop": [stop]})
    handed = b"".join(model.piece(token) for token in stopped.context[len(read):]).decode(errors="replace")
    assert stopped.done_reason == "stop" and handed.startswith(stopped.response) and stop not in handed, handed


def test_a_chat_too_long_for_the_context_drops_its_oldest_turns_unless_truncate_is_false(server, tiny):
    """Ollama's truncate (its default): a long chat (Open WebUI's, at serve's context) was a 400; its oldest turns
    are dropped, never the system prompt or the latest message, leaving room for the answer, and the answer is the
    one the turns kept give."""
    history = [{"role": "system", "content": "be brief"}]
    for turn in range(30):
        history += [{"role": "user", "content": f"question {turn} about the cat and the mat"},
                    {"role": "assistant", "content": f"answer {turn}: the cat sat on the mat"}]
    history.append({"role": "user", "content": PROMPT})
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation(drafting=DrafterKind.PLAIN)) as alone:
        kept = without_oldest_turns(alone, history, 512 - 12)
        assert kept[0] == history[0] and kept[-1] == history[-1] and kept[1]["role"] == "user"
        assert len(kept) < len(history) and alone.count_tokens(Request(messages=kept)) <= 500
        assert alone.count_tokens(Request(messages=[kept[0], *kept[3:]])) < alone.count_tokens(Request(messages=kept))
        assert alone.count_tokens(Request(messages=[kept[0], *history[len(history) - len(kept) - 1:]])) > 500
    answer = client(server).chat("tiny", messages=history, options={"num_predict": 12})
    assert answer.message.content == plain_text(tiny, kept, max_tokens=12)
    assert answer.prompt_eval_count <= 500
    refused = httpx.post(server.base + "/api/chat", json={"model": "tiny", "messages": history, "stream": False,
                                                          "truncate": False, "options": {"num_predict": 12}})
    assert refused.status_code == 400 and "context" in refused.json()["error"]
    short = client(server).chat("tiny", messages=history[-3:], options={"num_predict": 4})
    assert short.message.content == plain_text(tiny, history[-3:], max_tokens=4)  # (nothing to drop)
    assert "dropped the oldest" in server.log() and "Traceback" not in server.log()


def test_debug_render_only_answers_the_prompt_as_read_and_a_go_template_is_refused(server, tiny):
    """Ollama's _debug_render_only (the prompt its template renders, nothing generated) and a request's own Go
    template: both taken and silently ignored before (a generation answered in their place)."""
    model = Model(tiny["target"], vocab_only=True)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    read = Prompts(model, 512).chat_tokens(messages)
    expected = model.spell_of(read[1:] if read[:1] == [model.bos] else read, special=True).decode()
    for route, body in (("/api/chat", {"messages": messages}), ("/api/generate", {"system": "be brief", "prompt": PROMPT})):
        answer = httpx.post(server.base + route, json={"model": "tiny", "_debug_render_only": True, **body}).json()
        assert answer["debug_info"] == {"rendered_template": expected, "image_count": 0} and not answer["done"]
    refused = httpx.post(server.base + "/api/generate", json={"model": "tiny", "prompt": "hi",
                                                            "template": "{{ .Prompt }}"})
    assert refused.status_code == 400 and "Go templates" in refused.json()["error"]
    wrong = httpx.post(server.base + "/api/chat", json={"model": "tiny", "messages": messages, "_debug_render_only": "x"})
    assert wrong.status_code == 400 and "_debug_render_only" in wrong.json()["error"]
    assert "Traceback" not in server.log()


OLLAMA_CHAT_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False, "logprobs": True,
                    "top_logprobs": 2, "options": {"num_predict": 1, "temperature": 0.5, "repeat_penalty": 1.1,
                                                   "repeat_last_n": 8, "presence_penalty": 0.5,
                                                   "frequency_penalty": 0.5, "mirostat_tau": 5.0}}


def test_a_wrongly_typed_value_anywhere_in_an_ollama_request_is_a_400_never_a_500(server):
    statuses = {}
    with httpx.Client(timeout=60) as http:
        for path in list(_paths(OLLAMA_CHAT_BODY))[1:]:
            for wrong in WRONG_VALUES:
                response = http.post(server.base + "/api/chat", json=_replaced(OLLAMA_CHAT_BODY, path, wrong))
                statuses[(path, json.dumps(wrong))] = response.status_code
                if response.status_code != 200:
                    assert set(response.json()) == {"error"}
    assert {where: status for where, status in statuses.items()
            if status not in (200, 400) and not (where[0] == ("model",) and status == 404)} == {}
    assert "Traceback" not in server.log()


UNIT = {"type": "object", "properties": {"length": {"type": "integer"}, "unit": {"enum": ["millimetres", "metres"]}},
        "required": ["length", "unit"], "additionalProperties": False}


@pytest.mark.slow
def test_both_clients_unchanged_on_a_real_model_schema_embeddings_chat_and_generate(real_model, tmp_path):
    """The openai package (a strict json_schema, embeddings) and the ollama package (list, a streamed
    chat, generate, embed) against SmolLM2 as editors and web UIs call it."""
    import openai
    from test_server import ServerProcess

    running = ServerProcess(tmp_path, real_model("smollm2-135m"), "--temp", "0", "-c", "1024", "--alias", "smol")
    try:
        ask = [{"role": "user", "content": "How long is a pencil? Answer in JSON."}]
        reply = running.client().chat.completions.create(
            model="smol", messages=ask, max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "length", "schema": UNIT, "strict": True}})
        value = json.loads(reply.choices[0].message.content)
        assert set(value) == {"length", "unit"} and isinstance(value["length"], int)
        assert value["unit"] in ("millimetres", "metres") and reply.choices[0].finish_reason == "stop"
        assert reply.model_extra["speculation"]["drafters"]["forced"]["accepted_tokens"] >= 2  # the keys, drafted
        vectors = running.client().embeddings.create(model="smol", input=["a pencil", "a pen"]).data
        assert len(vectors) == 2 and len(vectors[0].embedding) == 576  # SmolLM2-135M's width

        local = ollama.Client(host=running.base)
        assert [m.model for m in local.list().models] == ["smol"]
        parts = list(local.chat("smol", messages=ask, stream=True, options={"num_predict": 16}))
        last = parts[-1]  # (SmolLM2's answer went past 16 tokens on an Intel Xeon; on an AMD EPYC it ends at 13)
        assert len(parts) > 2 and last.done
        assert (last.done_reason, last.eval_count) == ("length", 16) or last.done_reason == "stop" and last.eval_count < 16
        said = local.generate("smol", prompt="The capital of France is", options={"num_predict": 8})
        assert said.done and said.response.strip()
        embedded = local.embed("smol", input=["a pencil", "a pen"]).embeddings
        assert len(embedded) == 2 and embedded[0] == pytest.approx(vectors[0].embedding, abs=1e-5)
        assert "Traceback" not in running.log()
    finally:
        assert running.stop() == 0, running.log()


@pytest.mark.parametrize("value, seconds", [(300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("-1", math.inf), (-5, math.inf),
                                            (0, 0.0)])
def test_keep_alive_is_seconds_or_a_duration(value, seconds):
    assert keep_alive(value) == seconds


@pytest.mark.parametrize("value", [math.nan, "nan", "soon", "", True, [5]])
def test_a_keep_alive_that_is_no_duration_is_one_400(value):
    # NaN (JSON allows it) was taken: compared with anything it is never past, so the model was never unloaded
    with pytest.raises(ApiError, match="keep_alive") as raised:
        keep_alive(value)
    assert raised.value.status == 400


@pytest.mark.parametrize("route, body", [
    ("/api/show", {"model": 5}),
    ("/api/show", {"name": ["tiny"]}),
    ("/api/generate", {"model": {"a": 1}, "keep_alive": 0}),
    ("/api/show", {"model": "x" * 5_000}),  # a name no file system takes
    ("/api/show", {"model": "~nobody/x"}),
    ("/api/generate", {"model": "a/" * 3_000, "prompt": "hi"}),
    ("/api/pull", {"model": "/etc/passwd", "stream": False}),  # a local path, not a model to pull
    ("/api/pull", {"model": "owner/repo:Q4\nforged log line", "stream": False}),
])
def test_names_of_the_wrong_type_or_that_no_file_can_have_are_one_4xx(server, route, body):
    # each was a 500 (a traceback in the log), and a local path "pulled" successfully (issue 46)
    answer = httpx.post(server.base + route, json=body, timeout=30)
    assert 400 <= answer.status_code < 500 and "error" in answer.json(), answer.text
    assert httpx.get(server.base + "/health").status_code == 200
