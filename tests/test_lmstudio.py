"""LM Studio's own REST API (/api/v0) on serve, as clients set up for LM Studio call it: Zed's and Cline's model list
(each model's state, context lengths, capabilities), chats and completions through the openai package pointed at
/api/v0 (as Cline's was), with LM Studio's stats, model_info and runtime beside a whole answer; `max_tokens: -1`
and `ttl` as LM Studio's examples send them. Its v1 REST API, and its SDK's websockets through the real `lmstudio`
package."""

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx2 as httpx
import lmstudio as lms
import openai
import pytest
import websocket

from localspec.store import gguf_meta

from test_pool import downloaded_home
from test_server import PROMPT, ServerProcess, _paths, _replaced, drafting_server, plain_text, raw_socket
from test_tools import hermes_server

# What Zed reads of every model in the list, without which it refuses the whole list
ZEDS_FIELDS = {"id", "object", "type", "publisher", "compatibility_type", "state"}


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    running = drafting_server(tmp_path_factory.mktemp("serve"), tiny)
    yield running
    assert running.stop() == 0, running.log()


def lmstudio(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/api/v0", api_key="lm-studio", max_retries=0, timeout=120)


def test_the_model_list_says_each_models_state_context_and_capabilities_as_lm_studio_does(server, tiny):
    listed = httpx.get(server.base + "/api/v0/models").json()
    assert listed["object"] == "list"
    [model] = listed["data"]
    assert ZEDS_FIELDS <= set(model)
    header = gguf_meta.read(tiny["target"])
    assert model | {"capabilities": None} == {
        "id": "tiny", "object": "model", "type": "llm", "publisher": "local", "arch": header.architecture,
        "compatibility_type": "gguf", "quantization": header.quantization, "state": "loaded",
        "max_context_length": header.context_length, "loaded_context_length": 512, "capabilities": None}
    assert httpx.get(server.base + "/api/v0/models/tiny").json() == model
    missing = httpx.get(server.base + "/api/v0/models/no-such-model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_a_chat_through_api_v0_is_openais_with_lm_studios_stats_beside_it(server, tiny):
    messages = [{"role": "user", "content": PROMPT}]
    reply = lmstudio(server).chat.completions.create(model="tiny", messages=messages, max_tokens=16)
    assert reply.choices[0].message.content == plain_text(tiny, messages)
    stats = reply.model_extra["stats"]
    assert stats["stop_reason"] == "maxPredictedTokensReached" and stats["tokens_per_second"] > 0
    assert stats["generation_time"] > 0 and stats["time_to_first_token"] >= 0
    # the speculative decoding counts LM Studio gives, from the same record as localspec's own
    assert stats["draft_model"] == tiny["same"].name
    assert stats["total_draft_tokens_count"] == reply.model_extra["speculation"]["draft_tokens"] > 0
    assert stats["accepted_draft_tokens_count"] + stats["rejected_draft_tokens_count"] == stats["total_draft_tokens_count"]
    assert reply.model_extra["model_info"] == {"arch": gguf_meta.read(tiny["target"]).architecture,
                                               "quant": gguf_meta.read(tiny["target"]).quantization,
                                               "format": "gguf", "context_length": 512}
    assert reply.model_extra["runtime"]["name"] == "localspec-llama.cpp-cpu"

    streamed = list(lmstudio(server).chat.completions.create(model="tiny", messages=messages, max_tokens=16,
                                                             stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == reply.choices[0].message.content
    assert all(c.choices for c in streamed)  # (Zed takes a chunk without choices for a failure)


def test_a_completion_ends_by_its_stop_string_and_says_so(server, tiny):
    full = lmstudio(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=12)
    stop = full.choices[0].text[3:6]
    stopped = lmstudio(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=12, stop=[stop])
    assert stopped.choices[0].text == full.choices[0].text[:3] and stopped.choices[0].finish_reason == "stop"
    assert stopped.model_extra["stats"]["stop_reason"] == "stopStringFound"
    embedded = lmstudio(server).embeddings.create(model="tiny", input="a text")
    assert len(embedded.data[0].embedding) > 0


def test_max_tokens_minus_one_is_no_limit_and_a_ttl_that_is_no_duration_is_one_400(server):
    """LM Studio's examples send max_tokens -1 (Zed sends it with every chat): it was a 400."""
    for path in ("/v1/chat/completions", "/api/v0/chat/completions"):
        answered = httpx.post(server.base + path, json={"messages": [{"role": "user", "content": PROMPT}],
                                                        "max_tokens": -1}, timeout=120)
        assert answered.status_code == 200, answered.text  # (a 400 before: max_tokens was at least 1)
    for ttl in (-2, "5m", True):
        refused = httpx.post(server.base + "/api/v0/chat/completions", json={
            "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "ttl": ttl}, timeout=60)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "ttl", refused.text
    zero = httpx.post(server.base + "/api/v0/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                                      "max_tokens": 0}, timeout=60)
    assert zero.status_code == 400 and zero.json()["error"]["param"] == "max_tokens"


def test_a_draft_model_asked_for_is_the_one_serve_drafts_with_and_another_is_said_once(server, tiny):
    """Roo Code sends LM Studio's `draft_model` with every request where its user chose one: it was passed over in
    silence. The draft serve loaded drafts (the answer is the target's own whichever drafts); another is said once."""
    messages = [{"role": "user", "content": PROMPT}]
    for draft in (tiny["same"].name, str(tiny["same"]), "qwen2.5-0.5b-instruct", "qwen2.5-0.5b-instruct",
                  "lmstudio-community/Qwen2.5-0.5B-Instruct-GGUF:Q8_0"):
        reply = server.client().chat.completions.create(model="tiny", messages=messages, max_tokens=4,
                                                        extra_body={"draft_model": draft})
        assert reply.choices[0].message.content == plain_text(tiny, messages, max_tokens=4)
    said = [line for line in server.log().splitlines() if "draft_model" in line]
    assert len(said) == 2 and "'qwen2.5-0.5b-instruct' asked: tiny drafts with same.gguf" in said[0], said
    refused = httpx.post(server.url + "/chat/completions", json={"messages": messages, "draft_model": 5}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "draft_model"


def v1_chat(server, **body) -> httpx.Response:
    return httpx.post(server.base + "/api/v1/chat", json={"model": "tiny", "max_output_tokens": 8} | body, timeout=120)


def events(server, **body) -> list[tuple[str, dict]]:
    """A streamed v1 chat's events: (name, payload) each, the payload's type its name."""
    with httpx.stream("POST", server.base + "/api/v1/chat", json={"model": "tiny", "max_output_tokens": 8,
                                                                  "stream": True} | body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        text = "".join(response.iter_text())
    out = []
    for block in filter(None, text.split("\n\n")):
        kind, data = block.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {payload['type']}"
        out.append((payload["type"], payload))
    return out


def test_lm_studios_v1_chat_answers_its_input_and_goes_on_from_a_response_it_kept(server, tiny):
    """LM Studio 0.4's own chat: `input` and `system_prompt`, answered as output items with its stats and a
    response_id, which a later chat's previous_response_id goes on from."""
    first = v1_chat(server, input=PROMPT, system_prompt="be brief").json()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}]
    assert first["model_instance_id"] == "tiny" and first["response_id"].startswith("resp_")
    assert first["output"] == [{"type": "message", "content": plain_text(tiny, messages, max_tokens=8)}]
    stats = first["stats"]
    assert stats["total_output_tokens"] == 8 and stats["reasoning_output_tokens"] == 0 and stats["input_tokens"] > 0
    assert stats["tokens_per_second"] > 0 and "model_load_time_seconds" not in stats  # (it was loaded)
    assert first["speculation"]["draft_tokens"] > 0

    later = v1_chat(server, input="and the dog?", previous_response_id=first["response_id"]).json()
    conversation = messages[1:] + [{"role": "assistant", "content": first["output"][0]["content"]},
                                   {"role": "user", "content": "and the dog?"}]  # (a system prompt is each chat's own)
    assert later["output"][0]["content"] == plain_text(tiny, conversation, max_tokens=8)
    # a name no model has (a script written for LM Studio's own) is answered by serve's, as on /v1
    assert v1_chat(server, input=PROMPT, model="qwen/qwen3-4b").json()["model_instance_id"] == "tiny"
    unkept = v1_chat(server, input=PROMPT, store=False).json()
    assert "response_id" not in unkept and unkept["output"] == v1_chat(server, input=PROMPT).json()["output"]
    as_items = v1_chat(server, input=[{"type": "message", "content": PROMPT}]).json()
    assert as_items["output"] == unkept["output"]


def test_a_streamed_v1_chat_is_lm_studios_named_events_ending_with_the_whole_answer(server):
    streamed = events(server, input=PROMPT)
    names = [name for name, _ in streamed]
    assert names[:3] == ["chat.start", "prompt_processing.start", "prompt_processing.end"]
    assert names[3] == "message.start" and names[-2:] == ["message.end", "chat.end"]
    assert set(names[4:-2]) == {"message.delta"}
    result = streamed[-1][1]["result"]
    assert "".join(payload["content"] for name, payload in streamed if name == "message.delta") == \
        result["output"][0]["content"] == v1_chat(server, input=PROMPT).json()["output"][0]["content"]
    assert streamed[0][1]["model_instance_id"] == "tiny" and result["stats"]["total_output_tokens"] == 8


@pytest.mark.parametrize("body, status, kind, param", [
    ({"input": PROMPT, "integrations": ["mcp/playwright"]}, 400, "invalid_request", "integrations"),
    ({"input": PROMPT, "previous_response_id": "resp_gone"}, 404, "invalid_request", "previous_response_id"),
    ({"input": PROMPT, "previous_response_id": "chatcmpl-1"}, 400, "invalid_request", "previous_response_id"),
    ({"input": []}, 400, "invalid_request", "input"),
    ({"input": [{"type": "image"}]}, 400, "invalid_request", "input.0.data_url"),
    ({"input": PROMPT, "context_length": 100_000}, 400, "invalid_request", "context_length"),
    ({"input": PROMPT, "reasoning": "maybe"}, 400, "invalid_request", "reasoning"),
])
def test_a_v1_chat_that_cannot_be_answered_is_one_error_in_lm_studios_shape(server, body, status, kind, param):
    refused = v1_chat(server, **body)
    assert refused.status_code == status, refused.text
    assert refused.json()["error"]["type"] == kind and refused.json()["error"]["param"] == param, refused.text


def test_the_v1_model_list_loads_and_unloads_as_lm_studio_says_them(server, tiny):
    [model] = httpx.get(server.base + "/api/v1/models").json()["models"]
    assert model["key"] == "tiny" and model["type"] == "llm" and model["format"] == "gguf"
    slots = httpx.get(server.base + "/props").json()["total_slots"]
    assert model["loaded_instances"] == [{"id": "tiny", "config": {"context_length": 512, "parallel": slots}}]
    assert model["capabilities"] == {"vision": False, "trained_for_tool_use": False}
    assert model["size_bytes"] == tiny["target"].stat().st_size
    loaded = httpx.post(server.base + "/api/v1/models/load", json={"model": "tiny", "echo_load_config": True}).json()
    assert loaded["status"] == "loaded" and loaded["instance_id"] == "tiny" and loaded["load_config"] == {
        "context_length": 512, "eval_batch_size": 512}
    other = httpx.post(server.base + "/api/v1/models/load", json={"model": "tiny", "context_length": 4096})
    assert other.status_code == 400 and "serve's -c" in other.json()["error"]["message"]
    kept = httpx.post(server.base + "/api/v1/models/unload", json={"instance_id": "tiny"})
    assert kept.status_code == 400 and "serve started with" in kept.json()["error"]["message"]
    missing = httpx.get(server.base + "/api/v1/models/download/status/job_none")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "job_not_found"


def test_a_reasoning_models_thinking_is_its_own_output_item_and_reasoning_off_turns_it_off(thinkers, tmp_path):
    """Qwen 3.5's template opens the thinking for the model: what it writes is thinking, its own item and events,
    until `reasoning: "off"` has the template close it first."""
    running = ServerProcess(tmp_path, thinkers["qwen3.5"], "-c", "2048", "--alias", "tiny", "--temp", "0")
    try:
        thought = v1_chat(running, input=PROMPT).json()  # (its 8 tokens all thinking: no message item)
        assert [item["type"] for item in thought["output"]] == ["reasoning"]
        assert thought["output"][0]["content"] and thought["stats"]["reasoning_output_tokens"] > 0
        names = [name for name, _ in events(running, input=PROMPT)]
        assert names[3:5] == ["reasoning.start", "reasoning.delta"] and "reasoning.end" in names
        plain = v1_chat(running, input=PROMPT, reasoning="off").json()
        assert [item["type"] for item in plain["output"]] == ["message"] and plain["output"][0]["content"]
        [model] = httpx.get(running.base + "/api/v1/models").json()["models"]
        assert model["capabilities"]["reasoning"] == {"allowed_options": ["off", "on"], "default": "on"}
    finally:
        assert running.stop() == 0, running.log()


def test_a_long_prompts_reading_is_streamed_as_its_progress(tiny, tmp_path):
    running = ServerProcess(tmp_path, tiny["target"], "-c", "512", "-b", "32", "--alias", "tiny", "--temp", "0")
    try:
        streamed = events(running, input="tell me " * 60)
        progress = [payload["progress"] for name, payload in streamed if name == "prompt_processing.progress"]
        assert len(progress) >= 3 and progress == sorted(progress) and 0 < progress[0] and progress[-1] < 1
        names = [name for name, _ in streamed]
        assert names.index("prompt_processing.end") > names.index("prompt_processing.progress")
    finally:
        assert running.stop() == 0, running.log()


# LM Studio's SDKs (lmstudio for Python, @lmstudio/sdk): a greeting, then websockets a namespace each

def sdk(server) -> lms.Client:
    """LM Studio's Python SDK pointed at serve (it looks for LM Studio on ports of its own else)."""
    return lms.Client(server.base.removeprefix("http://"))


def test_lm_studios_sdk_lists_loads_counts_and_answers_as_the_openai_api_does(server, tiny):
    messages = [{"role": "user", "content": PROMPT}]
    with sdk(server) as client:  # (its greeting looked for first)
        assert [model.identifier for model in client.llm.list_loaded()] == ["tiny"]
        assert client.embedding.list_loaded() == []
        model = client.llm.model("tiny")
        info, header = model.get_info(), gguf_meta.read(tiny["target"])
        assert (info.model_key, info.format, info.context_length, info.max_context_length, info.size_bytes) == (
            "tiny", "gguf", 512, header.context_length, tiny["target"].stat().st_size)
        assert model.get_context_length() == 512 and client.llm.model().identifier == "tiny"
        assert model.get_load_config().context_length == 512
        ids = httpx.post(server.base + "/tokenize", json={"content": PROMPT}).json()["tokens"]
        assert model.tokenize(PROMPT) == ids and model.count_tokens(PROMPT) == len(ids)

        result = model.respond(PROMPT, config={"maxTokens": 16})
        assert result.content == plain_text(tiny, messages)
        stats = result.stats
        assert stats.stop_reason == "maxPredictedTokensReached" and stats.predicted_tokens_count == 16
        # the speculative decoding counts LM Studio gives, the draft model named
        assert stats.used_draft_model_key == tiny["same"].name and stats.total_draft_tokens_count > 0
        assert stats.accepted_draft_tokens_count + stats.rejected_draft_tokens_count == stats.total_draft_tokens_count
        fragments = list(model.respond_stream(PROMPT, config={"maxTokens": 16}))
        assert "".join(fragment.content for fragment in fragments) == result.content
        assert sum(f.tokens_count for f in fragments) == 16 and any(f.contains_drafted for f in fragments)

        completion = server.client().completions.create(model="tiny", prompt=PROMPT, max_tokens=8)
        assert model.complete(PROMPT, config={"maxTokens": 8}).content == completion.choices[0].text
        chat = lms.Chat()
        chat.add_user_message(PROMPT)
        applied = httpx.post(server.base + "/apply-template", json={"messages": messages}, timeout=60).json()
        assert model.apply_prompt_template(chat) == applied["prompt"]


def test_the_sdks_schema_a_cancel_and_what_cannot_be_answered(server):
    with sdk(server) as client:
        model = client.llm.model("tiny")
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
        shaped = model.respond(PROMPT, response_format=schema, config={"maxTokens": 64})
        assert set(shaped.parsed) == {"name"}, shaped.content
        whole = model.respond(PROMPT, config={"maxTokens": 12}).content
        stopped = model.respond(PROMPT, config={"maxTokens": 12, "stopStrings": [whole[3:6]]})
        assert stopped.content == whole[:3] and stopped.stats.stop_reason == "stopStringFound"
        long_ago = lms.Chat()
        for _ in range(6):
            long_ago.add_user_message("word " * 60)
            long_ago.add_assistant_response("noted")
        long_ago.add_user_message(PROMPT)
        with pytest.raises(lms.LMStudioServerError, match="context"):
            model.respond(long_ago, config={"maxTokens": 8})
        rolled = model.respond(long_ago, config={"maxTokens": 8, "contextOverflowPolicy": "rollingWindow"})
        assert rolled.stats.predicted_tokens_count == 8 and rolled.stats.prompt_tokens_count < 512
        with model.respond_stream(PROMPT, config={"maxTokens": 400}) as stream:  # (the channel opened)
            stream.cancel()  # (before its generation began: it was passed over, and the SDK waited for the answer)
            assert list(stream) == [] and stream.result().stats.stop_reason == "userStopped"
        with pytest.raises(lms.LMStudioModelNotFoundError, match="not served here"):
            client.llm.model("no-such-model")
        with pytest.raises(lms.LMStudioServerError, match="context"):
            model.respond("word " * 2000)
    assert "Traceback" not in server.log()


def test_a_socket_stays_open_idle_and_one_a_web_page_or_a_missing_key_would_open_is_refused(tiny, tmp_path):
    """The SDK holds its sockets open while its client lives: serve's --timeout for a request's headers closed them.
    A web page's socket is asked no CORS, so another site's is refused; so is a client without serve's API key."""
    running = ServerProcess(tmp_path, tiny["target"], "--alias", "tiny", "--timeout", "1", "--api-key", "k")
    try:
        with pytest.raises(lms.LMStudioServerError, match="API key"):
            sdk(running).llm.list_loaded()
        socket = raw_socket(running, Authorization="Bearer k")
        assert json.loads(socket.recv()) == {"success": True}
        time.sleep(2.5)
        socket.send(json.dumps({"type": "rpcCall", "endpoint": "countTokens", "callId": 1,
                                "parameter": {"specifier": {"type": "query", "query": {}}, "inputString": "a b"}}))
        assert json.loads(socket.recv())["result"] == {"tokenCount": len(
            httpx.post(running.base + "/tokenize", json={"content": "a b"}, headers={"Authorization": "Bearer k"}
                       ).json()["tokens"])}
        socket.close()
        with pytest.raises(websocket.WebSocketBadStatusException, match="403"):
            raw_socket(running, origin="https://example.com", Authorization="Bearer k")
    finally:
        assert running.stop() == 0, running.log()


SDK_JS = "@lmstudio/sdk@1.5.0"


@pytest.fixture(scope="session")
def lmstudio_js(tmp_path_factory) -> Path:
    """LM Studio's TypeScript SDK from the npm registry, beside tests/clients/lmstudio_sdk.mjs's copy."""
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed (the TypeScript SDK's test needs Node.js)")
    folder = tmp_path_factory.mktemp("lmstudio-js")
    installed = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(folder), SDK_JS],
                               capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    shutil.copy(Path(__file__).parent / "clients" / "lmstudio_sdk.mjs", folder)
    return folder / "lmstudio_sdk.mjs"


def test_lm_studios_typescript_sdk_reads_every_answer_as_its_schemas_say(server, tiny, lmstudio_js):
    """The TypeScript SDK checks each message against its schemas (a fragment without isStructural was dropped with a
    warning, and the answer came out empty) and warns back about what it cannot read (serve answered each warning
    with one of its own, and the two went on warning each other)."""
    ran = subprocess.run(["node", str(lmstudio_js), server.base.replace("http://", "ws://"), PROMPT],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and "warning" not in ran.stderr.lower(), ran.stderr
    said = json.loads(ran.stdout)
    assert said["loaded"] == ["tiny"] and "tiny" in said["downloaded"]
    assert said["info"] == {"modelKey": "tiny", "contextLength": 512, "format": "gguf"}
    assert said["tokens"] == httpx.post(server.base + "/tokenize", json={"content": PROMPT}).json()["tokens"]
    assert said["content"] == plain_text(tiny, [{"role": "user", "content": PROMPT}])
    assert said["stats"]["stopReason"] == "maxPredictedTokensReached" and said["stats"]["predictedTokensCount"] == 16
    assert said["stats"]["usedDraftModelKey"] == tiny["same"].name
    assert "".join(f["content"] for f in said["fragments"]) == said["content"]
    assert any(f["containsDrafted"] for f in said["fragments"])
    assert said["completion"] == server.client().completions.create(model="tiny", prompt=PROMPT,
                                                                     max_tokens=8).choices[0].text


# Each message the SDKs send, every value in it a place a client (or a page's script) may fill wrongly.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
TINY_SPECIFIER = {"type": "query", "query": {"identifier": "tiny"}}
SDK_MESSAGES = [
    ("system", {"type": "rpcCall", "endpoint": "version", "callId": 1}),
    ("system", {"type": "rpcCall", "endpoint": "listDownloadedModels", "callId": 1}),
    ("files", {"type": "rpcCall", "endpoint": "uploadFileBase64", "callId": 1,
               "parameter": {"name": "dot.png", "contentBase64": PNG}}),
    ("llm", {"type": "rpcCall", "endpoint": "getModelInfo", "callId": 1,
             "parameter": {"specifier": TINY_SPECIFIER, "throwIfNotFound": True}}),
    ("llm", {"type": "rpcCall", "endpoint": "countTokens", "callId": 1,
             "parameter": {"specifier": {"type": "instanceReference", "instanceReference": "tiny"},
                           "inputString": "a b"}}),
    ("llm", {"type": "rpcCall", "endpoint": "applyPromptTemplate", "callId": 1, "parameter": {
        "specifier": TINY_SPECIFIER, "history": {"messages": [{"role": "user", "content": [{"type": "text", "text":
                                                                                              "hi"}]}]},
        "predictionConfigStack": {"layers": []}, "opts": {"toolDefinitions": [
            {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]}}}),
    ("llm", {"type": "rpcCall", "endpoint": "unloadModel", "callId": 1, "parameter": {"identifier": "tiny-c"}}),
    ("embedding", {"type": "rpcCall", "endpoint": "embedString", "callId": 1, "parameter": {
        "modelSpecifier": {"type": "query", "query": {"identifier": "tiny-embed"}}, "inputString": "a b"}}),
    ("llm", {"type": "channelCreate", "endpoint": "getOrLoad", "channelId": 1,
             "creationParameter": {"identifier": "tiny", "loadTtlMs": 60000, "loadConfigStack": {"layers": [
                 {"layer": "apiOverride", "config": {"fields": [{"key": "llm.load.contextLength", "value": 256}]}}]}}}),
    ("llm", {"type": "channelCreate", "endpoint": "predict", "channelId": 1, "creationParameter": {
        "modelSpecifier": TINY_SPECIFIER,
        "history": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Adding."}, {"type": "toolCallRequest",
                "toolCallRequest": {"id": "c1", "type": "function", "name": "add", "arguments": {"a": 1}}}]},
            {"role": "tool", "content": [{"type": "toolCallResult", "toolCallId": "c1", "content": "2"}]}]},
        "predictionConfigStack": {"layers": [{"layer": "apiOverride", "config": {"fields": [
            {"key": "llm.prediction.maxPredictedTokens", "value": {"checked": True, "value": 1}},
            {"key": "llm.prediction.temperature", "value": 0},
            {"key": "llm.prediction.stopStrings", "value": ["."]},
            {"key": "llm.prediction.tools", "value": {"type": "toolArray", "tools": [
                {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]}},
            {"key": "llm.prediction.speculativeDecoding.numDraftTokensExact", "value": 3},
            {"key": "llm.prediction.contextOverflowPolicy", "value": "rollingWindow"}]}}]},
        "ignoreServerSessionConfig": True}}),
    ("llm", {"type": "channelCreate", "endpoint": "predict", "channelId": 2, "creationParameter": {
        "modelSpecifier": TINY_SPECIFIER, "history": {"messages": [{"role": "user", "content": [{"type": "text",
                                                                                                   "text": "hi"}]}]},
        "predictionConfigStack": {"layers": [{"layer": "apiOverride", "config": {"fields": [
            {"key": "llm.prediction.maxPredictedTokens", "value": {"checked": True, "value": 1}},
            {"key": "llm.prediction.structured", "value": {"type": "json", "jsonSchema": {"type": "object"}}}]}},
            {"layer": "instance", "config": {"fields": [
                {"key": "llm.prediction.structured", "value": {"type": "gbnf", "gbnfGrammar": "root ::= \"a\""}}]}}]}}}),
    ("llm", {"type": "channelSend", "channelId": 7, "message": {"type": "cancel"}}),
    ("repository", {"type": "rpcCall", "endpoint": "searchModels", "callId": 1, "parameter": {
        "opts": {"searchTerm": "tiny", "limit": 5, "compatibilityTypes": ["gguf"]}}}),
    ("repository", {"type": "rpcCall", "endpoint": "getModelDownloadOptions", "callId": 1, "parameter": {
        "modelSearchResultIdentifier": {"type": "catalog", "identifier": "tiny-c"}}}),
    ("repository", {"type": "channelCreate", "endpoint": "downloadModel", "channelId": 3,
                    "creationParameter": {"downloadIdentifier": "tiny-c"}}),
]
SWEPT_VALUES = [None, True, -1, 2**70, "x", [1], {}, {"type": "text"}]


def _answer_to(socket: websocket.WebSocket, message) -> dict | None:
    """The message that ends what message (a JSON value, or text) began: its call's result or error, its channel's end
    or error, or a warning where it names no call or channel to answer; None for a channel's message. Read up to the
    answer to a call sent after it, which shows the socket still read."""
    socket.send(message if isinstance(message, str) else json.dumps(message))
    socket.send(json.dumps({"type": "rpcCall", "endpoint": "probe", "callId": "probe"}))
    kind = message.get("type") if isinstance(message, dict) else None
    key = "callId" if kind == "rpcCall" else "channelId"
    ending, probed = {} if kind == "channelSend" else None, False
    while ending is None or not probed:
        said = json.loads(socket.recv())
        if said.get("callId") == "probe":
            probed = True
        elif said["type"] == "communicationWarning" or kind and key in said and said[key] == message.get(key) and (
                said["type"] != "channelSend" or said["message"]["type"] in ("success", "loadSuccess", "alreadyLoaded",
                                                                             "error")):
            ending = said
    return ending or None


@pytest.fixture(scope="module")
def tools_server(tiny, tmp_path_factory):
    """A model whose template offers tools, drafted for, with more models downloaded (an embedding model among them);
    the Hub out of its reach (HF_HUB_OFFLINE: a search is the registry's, a download of what is here ends at once)."""
    running = hermes_server(downloaded_home(tmp_path_factory.mktemp("sweep") / "home", tiny), tiny,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    yield running
    assert running.stop() == 0, running.log()


def _loaded_on(socket: websocket.WebSocket, name: str) -> None:
    loading = {"type": "channelCreate", "endpoint": "getOrLoad", "channelId": 0, "creationParameter": {"identifier": name}}
    answer = _answer_to(socket, loading)
    assert answer.get("message", {}).get("type") in ("loadSuccess", "alreadyLoaded"), answer


@pytest.mark.parametrize("namespace, message", SDK_MESSAGES, ids=[
    f"{m.get('endpoint', 'cancel')}-{m.get('channelId', '')}" for _, m in SDK_MESSAGES])
def test_a_wrongly_typed_value_anywhere_in_an_sdk_message_is_answered_as_the_sdk_reads_errors(tools_server, namespace,
                                                                                             message):
    """Whatever a socket's message holds, serve answers it (a call's error, a channel's, or a warning where it names no
    call or channel) and goes on reading that socket: never a bug's internal error, never a socket closed."""
    server = tools_server
    socket = raw_socket(server, namespace)
    try:
        assert json.loads(socket.recv()) == {"success": True}
        if message.get("endpoint") in ("unloadModel", "embedString"):
            _loaded_on(socket, message["parameter"].get("identifier", "tiny-embed"))
        answered = _answer_to(socket, message) or {"type": "channelSend"}
        assert answered["type"] in ("rpcResult", "channelSend") and answered.get("message", {}).get("type") != "error", \
            answered  # (each wrong value the only one)
        wrongly = {}
        for path in _paths(message):
            for wrong in SWEPT_VALUES:  # (in place of the message itself, too)
                answer = _answer_to(socket, _replaced(message, path, wrong)) or {}
                failure = answer.get("error") or (answer.get("message") or {}).get("error") or {}
                if "internal" in str(failure.get("title")):
                    wrongly[(path, json.dumps(wrong))] = failure["title"]
        assert wrongly == {}, "\n".join(f"{p} {w}: {t[:90]}" for (p, w), t in wrongly.items())
    finally:
        socket.close()
    assert "Traceback" not in server.log()


def test_an_endpoint_the_socket_does_not_serve_is_named_as_such(server):
    # "a model specifier is an object, not None" answered a call to an endpoint no SDK has
    socket = raw_socket(server, "llm")
    try:
        assert json.loads(socket.recv()) == {"success": True}
        answer = _answer_to(socket, {"type": "rpcCall", "endpoint": "nope", "callId": 7, "parameter": {}})
        assert "'nope' is not an endpoint localspec serves on /llm" in answer["error"]["title"], answer
    finally:
        socket.close()


@pytest.mark.parametrize("said", ["no json", "[" * 100_000 + "]" * 100_000, "[]", "3", '"rpcCall"', "{}",
                                  '{"type": "rpcResult"}', '{"type": "channelSend", "message": [1]}'],
                         ids=["no-json", "nested-deep", "list", "number", "text", "no-type", "an-answer", "send-list"])
def test_a_message_that_is_none_the_sdks_send_is_warned_of_and_the_socket_goes_on(server, said):
    socket = raw_socket(server)
    try:
        assert json.loads(socket.recv()) == {"success": True}
        answer = _answer_to(socket, said)
        assert answer is None or answer["type"] == "communicationWarning"
    finally:
        socket.close()
    assert "Traceback" not in server.log()
