"""Anthropic's Messages API on serve's port, through the `anthropic` package as Claude-style agents call it."""

from pathlib import Path

import anthropic
import httpx2 as httpx
import pytest

from localspec.config import Runtime, Speculation
from localspec.session import Session
from test_reasoning import ASK as WHY, r1_server
from test_server import PROMPT, ServerProcess, drafting_server, plain_text, serving
from test_tools import ASK as WEATHER_ASK, WEATHER, hermes_server
from tinymodels import TinySpec, write_tiny_model


server = serving(lambda folder, request: drafting_server(folder, request.getfixturevalue("tiny")))
tool_server = serving(lambda folder, request: hermes_server(folder, request.getfixturevalue("tiny")))
thinking_server = serving(lambda folder, request: r1_server(folder, request.getfixturevalue("thinkers")))


def client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base, api_key=key, max_retries=0)


TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}


def test_a_message_whole_and_streamed_says_what_plain_decoding_says_with_its_usage_and_record(server, tiny):
    asked = {"model": "tiny", "max_tokens": 16, "system": "be brief", "messages": [{"role": "user", "content": PROMPT}]}
    whole = client(server).messages.create(**asked)
    [block] = whole.content
    expected = plain_text(tiny, [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}], 16)
    assert block.type == "text" and block.text == expected
    assert whole.stop_reason == "max_tokens" and whole.stop_sequence is None and whole.id.startswith("msg_")
    assert whole.usage.output_tokens == 16 and whole.usage.input_tokens > 0
    assert whole.to_dict()["speculation"]["draft_tokens"] > 0 and whole.to_dict()["timings"]["predicted_n"] == 16

    with client(server).messages.stream(**asked) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == expected and final.stop_reason == "max_tokens" and final.usage.output_tokens == 16
    kinds = [event.type for event in client(server).messages.create(**asked, stream=True)]
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-3:] == [  # (the client drops pings)
        "content_block_stop", "message_delta", "message_stop"] and set(kinds[2:-3]) == {"content_block_delta"}
    # the whole prompt is what is read anew and what is read from the cache (it was counted in both)
    counted = client(server).messages.count_tokens(**{k: v for k, v in asked.items() if k != "max_tokens"}).input_tokens
    again = client(server).messages.create(**asked)
    assert again.usage.cache_read_input_tokens > 0 and again.usage.input_tokens < counted
    assert counted == whole.usage.input_tokens + whole.usage.cache_read_input_tokens == (
        again.usage.input_tokens + again.usage.cache_read_input_tokens)


def test_a_stop_sequence_ends_the_message_and_is_named(server):
    asked = {"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}
    text = client(server).messages.create(**asked).content[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    stopped = client(server).messages.create(**asked, stop_sequences=["never said", stop])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert stopped.content[0].text == text[: text.index(stop)]
    with client(server).messages.stream(**asked, stop_sequences=[stop]) as stream:
        assert "".join(stream.text_stream) == text[: text.index(stop)]
        assert stream.get_final_message().stop_sequence == stop


def test_a_prefill_is_gone_on_from_as_anthropics_api_and_llama_server_take_one(server, tiny):
    """A conversation that ends with the assistant's message is the start of its reply (Anthropic's prefill, llama-
    server's): the prompt ends with that text, no turn's end and no new turn after it, and the answer is what plain
    decoding writes after it, through Anthropic's and OpenAI's clients alike. It was read as an earlier turn, and
    the model answered anew."""
    asked = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "the answer is"}]

    def squeezed(messages: list[dict]) -> str:  # (the prompt as text, the tiny tokenizer's spaces left out)
        return "".join(httpx.post(server.base + "/apply-template", json={"messages": messages},
                                  timeout=60).json()["prompt"].split())

    assert squeezed(asked) == squeezed(asked[:1]) + "theansweris"
    with Session(tiny["target"], None, Runtime(ctx_size=512), Speculation()) as session:
        tokens = session.prompts.chat_tokens(asked)
    continued = plain_text(tiny, prompt=tokens, max_tokens=12)
    claude = client(server).messages.create(model="tiny", max_tokens=12, messages=asked)
    assert claude.content[0].text == continued
    assert claude.usage.input_tokens + claude.usage.cache_read_input_tokens == len(tokens)
    assert server.client().chat.completions.create(model="tiny", max_tokens=12, messages=asked
                                                   ).choices[0].message.content == continued


def test_speculation_asked_per_request(server):
    off = client(server).messages.create(model="tiny", max_tokens=6, messages=[{"role": "user", "content": PROMPT}],
                                         extra_body={"speculative": {"mode": "off"}})
    assert off.to_dict()["speculation"]["draft_tokens"] == 0


@pytest.mark.parametrize("fields, kind, message", [
    ({"messages": []}, anthropic.BadRequestError, "at least one message"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "url", "url": "x"}}]}]},
     anthropic.BadRequestError, "'document' block is not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
     anthropic.BadRequestError, "messages.0.content.0.source.url: an http(s) URL"),
    ({"messages": [{"role": "tool", "content": "hi"}]}, anthropic.BadRequestError, "messages.0.role"),
    ({"extra_body": {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}},
     anthropic.BadRequestError, "'clear_tool_uses_20250919' is not supported here"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, anthropic.BadRequestError,
     "one of Anthropic's own tools"),
    ({"tool_choice": {"type": "any"}}, anthropic.BadRequestError, "offers no tools"),
    ({"extra_body": {"mcp_servers": [{"url": "x"}]}}, anthropic.BadRequestError, "runs no tools"),
])
def test_a_request_it_cannot_serve_is_one_error_in_anthropics_shape_and_serving_goes_on(server, fields, kind, message):
    asked = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": PROMPT}], **fields}
    with pytest.raises(kind) as raised:
        client(server).messages.create(**asked)
    assert raised.value.body["type"] == "error" and message in raised.value.body["error"]["message"]
    assert raised.value.body["error"]["type"] == ("not_found_error" if kind is anthropic.NotFoundError
                                                  else "invalid_request_error")
    assert client(server).messages.create(model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert "Traceback" not in server.log()


def test_a_name_that_is_no_model_here_is_answered_by_the_served_model(server):
    # Anthropic's clients send their own model names (claude-...): the model serve started with answers
    reply = client(server).messages.create(model="claude-opus-4-6", max_tokens=2,
                                           messages=[{"role": "user", "content": PROMPT}])
    assert reply.content and "no model is called 'claude-opus-4-6'" in server.log()


def test_tool_use_whole_and_streamed_and_a_tool_result_answered(tool_server):
    local = client(tool_server)
    whole = local.messages.create(model="tiny", max_tokens=120, messages=WEATHER_ASK, tools=[TOOL],
                                  tool_choice={"type": "any"})
    [call] = [block for block in whole.content if block.type == "tool_use"]
    assert whole.stop_reason == "tool_use" and call.name == "get_weather" and call.input["city"] in ("paris", "tokyo")
    with local.messages.stream(model="tiny", max_tokens=120, messages=WEATHER_ASK, tools=[TOOL],
                               tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.input for b in final.content if b.type == "tool_use"] == [call.input]
    history = WEATHER_ASK + [{"role": "assistant", "content": [block.to_dict() for block in whole.content]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                           "content": [{"type": "text", "text": '{"sky": "clear"}'}]}]}]
    after = local.messages.create(model="tiny", max_tokens=8, messages=history, tools=[TOOL],
                                  tool_choice={"type": "none"})
    assert after.stop_reason == "max_tokens" and [block.type for block in after.content] == ["text"]
    assert local.messages.count_tokens(model="tiny", messages=history, tools=[TOOL]).input_tokens > (
        local.messages.count_tokens(model="tiny", messages=WEATHER_ASK, tools=[TOOL]).input_tokens)


def test_thinking_blocks_whole_streamed_omitted_and_off(thinking_server):
    local = client(thinking_server)
    whole = local.messages.create(model="r1", max_tokens=14, messages=WHY)
    assert [block.type for block in whole.content] == ["thinking", "text"]
    thought, answer = whole.content[0].thinking, whole.content[1].text
    assert thought and answer and "</think>" not in thought + answer
    with local.messages.stream(model="r1", max_tokens=14, messages=WHY) as stream:
        thinking = "".join(event.thinking for event in stream if event.type == "thinking")
        final = stream.get_final_message()
    assert thinking == thought and final.content[1].text == answer
    omitted = local.messages.create(model="r1", max_tokens=14, messages=WHY,
                                    thinking={"type": "enabled", "budget_tokens": 5, "display": "omitted"})
    assert omitted.content[0].type == "thinking" and omitted.content[0].thinking == "" and omitted.content[1].text == answer
    off = local.messages.create(model="r1", max_tokens=14, messages=WHY, thinking={"type": "disabled"})
    assert [block.type for block in off.content] == ["text"] and off.content[0].text
    # earlier thinking given back with the conversation is read, not refused
    again = WHY + [{"role": "assistant", "content": [block.to_dict() for block in whole.content]},
                   {"role": "user", "content": "and then?"}]
    assert local.messages.create(model="r1", max_tokens=4, messages=again).usage.output_tokens == 4


def test_the_api_key_is_taken_as_anthropics_clients_send_it(tiny, tmp_path):
    running = ServerProcess(tmp_path, tiny["target"], "--temp", "0", "-c", "512", "--alias", "tiny", "--api-key", "sesame")
    try:
        asked = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
        assert client(running, "sesame").messages.create(**asked).usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as refused:
            client(running, "open").messages.create(**asked)
        assert refused.value.body["error"]["type"] == "authentication_error"
    finally:
        assert running.stop() == 0


WRONG = [("model", 5), ("messages", "hi"), ("messages", [5]), ("messages", [{"role": "user"}]),
         ("messages", [{"role": "user", "content": 5}]), ("messages", [{"role": "user", "content": [{"type": 5}]}]),
         ("messages", [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "1", "content": 5}]}]),
         ("system", 5), ("system", [{"type": "image"}]), ("max_tokens", "3"), ("max_tokens", 0),
         ("stop_sequences", "x"), ("stop_sequences", [5]), ("stream", "yes"), ("temperature", "0.5"),
         ("temperature", 2), ("top_p", 0), ("top_k", -1), ("tools", {}), ("tools", [5]), ("tools", [{"name": "bad name!"}]),
         ("tool_choice", "auto"), ("tool_choice", {"type": "sometimes"}), ("thinking", "on"),
         ("thinking", {"type": "enabled", "budget_tokens": -1}), ("thinking", {"type": "enabled", "display": "all"}),
         ("output_config", {"effort": "lots"}), ("output_config", {"format": {"type": "json_schema"}}),
         ("output_config", {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}),
         ("output_format", {"type": "text"}), ("speculative", "off"), ("speculative", {"mode": "sometimes"}),
         ("speculative", {"draft_max": "3"}), ("metadata", "x"), ("service_tier", 5)]


def test_every_field_of_the_wrong_kind_is_a_400_in_anthropics_shape(server):
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        for field, value in WRONG:
            body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], field: value}
            if path.endswith("count_tokens") and (field not in ("model", "messages", "system", "tools", "tool_choice",
                                                                 "thinking", "output_config")
                                                  or "schema" in str(value)):  # (counting compiles no grammar)
                continue
            answer = httpx.post(server.base + path, json=body, timeout=60)
            assert answer.status_code == 400 and answer.json()["type"] == "error", (path, field, value, answer.text)
            assert answer.json()["error"]["type"] == "invalid_request_error" and answer.json()["error"]["message"]
    assert "Traceback" not in server.log()


def test_a_users_text_beside_tool_results_reaches_mistrals_templates_after_an_empty_reply(tmp_path, thinkers):
    """Claude-style agents send each tool result in a user's message with the user's text beside it (a reminder, an
    interjection), read as a tool's result and a user's message after it, which Mistral's templates refuse (as
    Mistral's API does: "roles must alternate"): every such turn with Mistral Small 3.2, Nemo or Ministral 3 was a 400.
    An empty reply of the assistant's goes between them now, as LiteLLM writes it for Mistral."""
    small = write_tiny_model(tmp_path / "mistral.gguf", TinySpec(
        seed=1, sharpness=2.0, chat_template=(Path(__file__).parent / "templates" / "mistral-small-3.2.jinja").read_text(),
        control=("[TOOL_CALLS]", "[CALL_ID]", "[ARGS]", "[INST]", "[/INST]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]")))
    history = WEATHER_ASK + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01A", "name": "get_weather",
                                           "input": {"city": "paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01A", "content": "sun"},
                                     {"type": "text", "text": "and tomorrow?"}]}]
    for model in (small, thinkers["ministral-3"]):
        running = ServerProcess(tmp_path, model, "-c", "4096", "--alias", "tiny")
        try:
            answer = client(running).messages.create(model="tiny", max_tokens=4, messages=history,
                                                     tools=[TOOL], extra_body={"temperature": 0})
            assert answer.content and answer.stop_reason in ("max_tokens", "end_turn", "tool_use")
            openai_history = [{"role": "user", "content": WEATHER_ASK[0]["content"]},
                              {"role": "assistant", "content": "", "tool_calls": [{
                                  "id": "toolu_01A", "type": "function",
                                  "function": {"name": "get_weather", "arguments": '{"city": "paris"}'}}]},
                              {"role": "tool", "tool_call_id": "toolu_01A", "content": "sun"},
                              {"role": "user", "content": "and tomorrow?"}]
            prompt = httpx.post(running.base + "/apply-template", json={"messages": openai_history},
                                timeout=60).json()["prompt"]
            # (the tiny tokenizer's spaces left out)
            assert "[/TOOL_RESULTS]</s>[INST]andtomorrow?[/INST]" in "".join(prompt.split()), prompt
        finally:
            assert running.stop() == 0, running.log()
        assert "Traceback" not in running.log()


def test_claude_codes_requests_are_taken_a_system_message_among_the_messages_and_its_context_edits(server):
    """Claude Code (2.1.197) gives instructions as it goes on as system messages among the messages, and asks its
    thinking kept (context_management's clear_thinking): each was a 400 ("messages.1.role", "context_management:
    localspec runs no tools"), so Claude Code could do nothing against serve."""
    asked = {"model": "tiny", "max_tokens": 32000, "system": [{"type": "text", "text": "be brief",
                                                              "cache_control": {"type": "ephemeral"}}],
             "messages": [{"role": "user", "content": [
                              {"type": "text", "text": "<system-reminder>\ntoday\n</system-reminder>"},
                              {"type": "text", "text": PROMPT, "cache_control": {"type": "ephemeral"}}]},
                          {"role": "system", "content": "Available agent types: none."}],
             "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
             "extra_body": {"context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}}}
    local = client(server)
    with local.messages.stream(**asked) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.usage.output_tokens > 0
    told = local.messages.count_tokens(**{k: v for k, v in asked.items() if k != "max_tokens"}).input_tokens
    assert told > local.messages.count_tokens(model="tiny", system=asked["system"],
                                              messages=asked["messages"][:1]).input_tokens
    assert "Traceback" not in server.log()


def test_clear_thinking_keeps_the_thinking_of_the_last_turns_it_is_told_to():
    from localspec.protocols.anthropic import CountRequest, conversation

    def turn(n: int) -> list[dict]:
        return [{"role": "user", "content": f"q{n}"}, {"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"t{n}", "signature": ""}, {"type": "text", "text": f"a{n}"}]}]

    def thoughts(keep) -> list[str]:
        edits = {"context_management": {"edits": [{"type": "clear_thinking_20251015"} | (
            {"keep": keep} if keep is not None else {})]}}
        asked = CountRequest.model_validate({"messages": [*turn(1), *turn(2), *turn(3)], **edits})
        return [m["reasoning_content"] for m in conversation(asked) if "reasoning_content" in m]

    assert thoughts("all") == ["t1", "t2", "t3"] and thoughts(None) == ["t3"]  # (its default: the last turn's)
    assert thoughts({"type": "thinking_turns", "value": 2}) == ["t2", "t3"]
    assert thoughts({"type": "thinking_turns", "value": 0}) == []


def test_a_long_prompts_reading_keeps_the_stream_open_with_frames_its_clients_pass_over(tiny, tmp_path):
    """Claude Code's first request is 19,000 tokens of tools and instructions, which a CPU reads for minutes: nothing
    was sent until it was read, and a client that gives up on a silent connection (Claude Code's byte watchdog, 300 s)
    gave up and asked again. A stream now opens after the first batch read and says, after each, what its clients
    pass over (Anthropic's ping, an SSE comment), its opening after the reading, as before; the clients read the
    same answer."""
    running = ServerProcess(tmp_path, tiny["target"], "--temp", "0", "-c", "1024", "-b", "16", "--alias", "tiny")
    long = " ".join(["the cat sat on the mat"] * 20)
    try:
        asked = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": long}], "stream": True}
        with httpx.stream("POST", running.base + "/v1/messages", json=asked, timeout=60) as streamed:
            kinds = [line.removeprefix("event: ") for line in streamed.iter_lines() if line.startswith("event: ")]
        opening = kinds.index("message_start")
        assert opening > 1 and set(kinds[:opening]) == {"ping"}, kinds
        with client(running).messages.stream(**{k: v for k, v in asked.items() if k != "stream"}) as stream:
            assert stream.get_final_message().usage.output_tokens == 8
        for route, words in (("/v1/chat/completions", "a dog ran in the park"), ("/v1/responses", "one two three")):
            other = " ".join([words] * 25)  # (not the prompt before, whose reading the cache kept)
            body = {"model": "tiny", "input": other, "stream": True, "max_output_tokens": 8} if "responses" in route \
                else {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": other}], "stream": True}
            with httpx.stream("POST", running.base + route, json=body, timeout=60) as streamed:
                lines = [line for line in streamed.iter_lines() if line]
            assert lines[0] == ": reading the prompt" and lines[-1] != ": reading the prompt", (route, lines[:3])
        chat = {"model": "tiny", "max_tokens": 8, "temperature": 0,
                "messages": [{"role": "user", "content": long.upper()}]}
        pieces = running.client().chat.completions.create(**chat, stream=True)
        whole = running.client().chat.completions.create(**chat)
        assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == whole.choices[0].message.content
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()
