"""LM Studio's own REST API (/api/v0) on serve, as clients set up for LM Studio call it: Zed's and Cline's model list
(each model's state, context lengths, capabilities), chats and completions through the openai package pointed at
/api/v0 (as Cline's was), with LM Studio's stats, model_info and runtime beside a whole answer; `max_tokens: -1`
and `ttl` as LM Studio's examples send them."""

import httpx2 as httpx
import openai
import pytest

from localspec.store import gguf_meta

from test_server import PROMPT, drafting_server, plain_text

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
