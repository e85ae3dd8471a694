"""OpenAI's Responses API on serve's port, through the `openai` package as the Agents SDK and Codex-style CLIs
call it."""

import json
import re

import httpx2 as httpx
from contextlib import closing
import openai
import pytest

from localspec.engine.gbnf import from_json_schema
from localspec.engine.model import Model
from localspec.prompts import Prompts
from localspec.protocols.responses import Item, Kept, ResponsesRequest, _tools, conversation
from localspec.protocols.shared import ApiError
from test_reasoning import ASK as WHY, r1_server
from test_server import PROMPT, ServerProcess, drafting_server, plain_text, serving
from test_tools import ASK as WEATHER_ASK, WEATHER, hermes_server


server = serving(lambda folder, request: drafting_server(folder, request.getfixturevalue("tiny")))
tool_server = serving(lambda folder, request: hermes_server(folder, request.getfixturevalue("tiny")))
thinking_server = serving(lambda folder, request: r1_server(folder, request.getfixturevalue("thinkers")))

TOOL = {"type": "function", **WEATHER["function"]}


def test_a_response_whole_and_streamed_says_what_plain_decoding_says(server, tiny):
    client = server.client()
    whole = client.responses.create(model="tiny", instructions="be brief", input=PROMPT, max_output_tokens=16)
    expected = plain_text(tiny, [{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}])
    assert whole.output_text == expected and whole.id.startswith("resp_") and whole.object == "response"
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 16 and whole.usage.input_tokens > 0
    assert whole.model_extra["speculation"]["draft_tokens"] > 0 and whole.model_extra["timings"]["predicted_n"] == 16
    events = list(client.responses.create(model="tiny", instructions="be brief", input=PROMPT, max_output_tokens=16,
                                          stream=True))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected
    assert events[-1].response.output_text == expected
    assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
    # the package's stream helper reads the same events (its get_final_response waits for response.completed alone,
    # where OpenAI's API too ends a response cut by max_output_tokens with response.incomplete)
    with client.responses.stream(model="tiny", instructions="be brief", input=PROMPT, max_output_tokens=16) as stream:
        last = list(stream)[-1]
    assert last.type == "response.incomplete" and last.response.output_text == expected


def test_input_tokens_are_counted_as_the_request_would_be_read(server, tool_server):
    """The openai package's responses.input_tokens.count, and llama-server's count for a chat completion:
    the prompt the request would be read as (instructions, tools, an earlier response's conversation)."""
    client = server.client()
    asked = {"model": "tiny", "instructions": "be brief", "input": PROMPT}
    counted = client.responses.input_tokens.count(**asked)
    assert counted.object == "response.input_tokens"
    assert counted.input_tokens == client.responses.create(**asked, max_output_tokens=6).usage.input_tokens
    first = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=6)
    going_on = {"model": "tiny", "input": "go on", "previous_response_id": first.id}
    assert client.responses.input_tokens.count(**going_on).input_tokens \
        == client.responses.create(**going_on, max_output_tokens=6).usage.input_tokens
    tools = tool_server.client().responses.input_tokens
    assert tools.count(model="tiny", input=WEATHER_ASK, tools=[TOOL]).input_tokens \
        > tools.count(model="tiny", input=WEATHER_ASK).input_tokens
    chat = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}]}
    for path in ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"):
        assert httpx.post(server.base + path, json=chat, timeout=60).json() == {
            "object": "response.input_tokens",
            "input_tokens": client.chat.completions.create(**chat, max_tokens=1).usage.prompt_tokens}
    refused = httpx.post(server.base + "/v1/responses/input_tokens", json={"model": "tiny", "input": ""}, timeout=60)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input"


def test_previous_response_id_goes_on_from_the_answer_kept(server, tiny):
    client = server.client()
    first = client.responses.create(model="tiny", input=PROMPT, max_output_tokens=6)
    then = client.responses.create(model="tiny", input="go on", previous_response_id=first.id, max_output_tokens=6)
    conversation = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "go on"}]
    assert then.output_text == plain_text(tiny, conversation, max_tokens=6)
    items = client.responses.create(model="tiny", max_output_tokens=6, input=[
        {"role": "user", "content": PROMPT}, {"role": "assistant", "content": [{"type": "output_text",
                                                                                "text": first.output_text}]},
        {"role": "user", "content": [{"type": "input_text", "text": "go on"}]}])
    assert items.output_text == then.output_text
    with pytest.raises(openai.NotFoundError, match="no response 'resp_gone' is kept"):
        client.responses.create(model="tiny", input="x", previous_response_id="resp_gone")


def test_the_newest_responses_are_kept():
    kept = Kept(most=2)
    for n in range(3):
        kept.put(f"resp_{n}", [{"role": "user", "content": str(n)}])
    assert kept.get("resp_2") == [{"role": "user", "content": "2"}]
    with pytest.raises(ApiError, match="keeps the newest 2"):
        kept.get("resp_0")


def test_a_function_call_whole_and_streamed_and_its_output_answered(tool_server):
    client = tool_server.client()
    whole = client.responses.create(model="tiny", input=WEATHER_ASK, tools=[TOOL], tool_choice="required",
                                    max_output_tokens=120)
    [call] = [item for item in whole.output if item.type == "function_call"]
    assert whole.status == "completed" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("paris", "tokyo")
    events = list(client.responses.create(model="tiny", input=WEATHER_ASK, tools=[TOOL], max_output_tokens=120,
                                          tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [call.arguments]
    after = client.responses.create(model="tiny", previous_response_id=whole.id, tools=[TOOL], tool_choice="none",
                                    max_output_tokens=8, input=[{"type": "function_call_output", "call_id": call.call_id,
                                                                 "output": '{"sky": "clear"}'}])
    assert after.output_text and [item.type for item in after.output] == ["message"]
    spelled = client.responses.create(model="tiny", tools=[TOOL], tool_choice="none", max_output_tokens=8, input=[
        *WEATHER_ASK, {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}])
    assert spelled.output_text == after.output_text
    # an output whose call_id no call of the conversation has: a 400 as OpenAI's (was answered, the result of nothing)
    for earlier in ({"previous_response_id": whole.id}, {}):
        with pytest.raises(openai.BadRequestError, match="no function call has call_id 'call_nowhere'") as refused:
            client.responses.create(model="tiny", max_output_tokens=8, **earlier, input=[
                {"type": "function_call_output", "call_id": "call_nowhere", "output": "{}"}])
        assert refused.value.body["param"] == "input"


# Codex's tools, as its 0.169 sends them in every request: functions, a namespace of sub-agent tools (and one per
# MCP server), web_search (it runs at OpenAI); and, where a user turns it on, apply_patch as a custom tool of a Lark
# grammar (the one here a regular expression, which holds the tiny model's input to it)
CODEX_TOOLS = [{"type": "namespace", "name": "mcp__weather", "description": "A weather server.",
                      "tools": [{**TOOL, "name": "forecast", "strict": False, "defer_loading": True}]},
               {"type": "web_search", "external_web_access": False},
               {"type": "custom", "name": "apply_patch", "description": "Apply a patch.",
                "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]{1,8}"}}]


def test_codexs_tools_namespaces_custom_tools_and_hosted_ones_are_taken(tool_server):
    """Codex sends a namespace of tools (its sub-agents', each MCP server's) and web_search in every request: each was a
    400 ("'namespace' tools run at OpenAI"), so Codex could do nothing against serve. A namespace's functions are
    offered by flat names (vLLM's `{namespace}__{name}`) and their calls come back as the client named them (name and
    namespace apart: Codex dispatches on both); a custom tool is a function of its raw input, its calls custom tool
    calls; the tools that run at OpenAI are left out, as llama-server leaves them."""
    client = tool_server.client()
    for stream in (False, True):
        asked = {"model": "tiny", "input": WEATHER_ASK, "tools": CODEX_TOOLS, "max_output_tokens": 120,
                 "tool_choice": {"type": "function", "name": "forecast", "namespace": "mcp__weather"}}
        if stream:
            with client.responses.stream(**asked) as events:
                whole = events.get_final_response()
        else:
            whole = client.responses.create(**asked)
        [call] = whole.output
        assert (call.type, call.name, call.namespace) == ("function_call", "forecast", "mcp__weather"), call
        assert json.loads(call.arguments)["city"] in ("paris", "tokyo")
    # the call given back as Codex gives it (name and namespace apart), its output after it
    after = client.responses.create(model="tiny", tools=CODEX_TOOLS, tool_choice="none", max_output_tokens=8, input=[
        *WEATHER_ASK, {"type": "function_call", "call_id": call.call_id, "name": "forecast", "namespace": "mcp__weather",
                       "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}])
    going_on = client.responses.create(model="tiny", previous_response_id=whole.id, tools=CODEX_TOOLS,
                                       tool_choice="none", max_output_tokens=8, input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}])
    assert after.output_text and after.output_text == going_on.output_text
    # a custom tool's call: its input as text, whole and streamed
    patched = client.responses.create(model="tiny", input=WEATHER_ASK, tools=CODEX_TOOLS, max_output_tokens=120,
                                      tool_choice={"type": "function", "name": "apply_patch"})
    [call] = patched.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and re.fullmatch("[a-z]{1,8}", call.input)
    events = list(client.responses.create(model="tiny", input=WEATHER_ASK, tools=CODEX_TOOLS, max_output_tokens=120,
                                          tool_choice={"type": "function", "name": "apply_patch"}, stream=True))
    assert [e.input for e in events if e.type == "response.custom_tool_call_input.done"] == [call.input]
    answered = client.responses.create(model="tiny", tools=CODEX_TOOLS, tool_choice="none", max_output_tokens=8, input=[
        *WEATHER_ASK, {"type": "custom_tool_call", "call_id": call.call_id, "name": "apply_patch", "input": call.input},
        {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done!"}])
    assert answered.output_text
    # the model was offered the functions, and no web search
    offered = client.responses.input_tokens.count(model="tiny", input=WEATHER_ASK, tools=CODEX_TOOLS).input_tokens
    assert offered == client.responses.input_tokens.count(model="tiny", input=WEATHER_ASK,
                                                          tools=CODEX_TOOLS[:1] + CODEX_TOOLS[2:]).input_tokens
    assert "Traceback" not in tool_server.log()


def test_reasoning_comes_back_as_a_reasoning_item(thinking_server):
    client = thinking_server.client()
    whole = client.responses.create(model="r1", input=WHY)
    assert [item.type for item in whole.output] == ["reasoning", "message"]
    thought = whole.output[0].content[0].text
    assert thought and whole.output_text and whole.usage.output_tokens_details.reasoning_tokens == 6
    events = list(client.responses.create(model="r1", input=WHY, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == thought
    off = client.responses.create(model="r1", input=WHY, reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"]
    # a summary asked for (Codex asks so, and shows the thinking only as a summary's events: it showed none) is the
    # thinking itself, as Ollama gives it, streamed as a summary's events
    summarized = client.responses.create(model="r1", input=WHY, reasoning={"summary": "auto"})
    assert [part.text for part in summarized.output[0].summary] == [thought] and not summarized.output[0].content
    events = list(client.responses.create(model="r1", input=WHY, stream=True, reasoning={"summary": "auto"}))
    kinds = [e.type for e in events]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta") == thought
    assert "response.reasoning_text.delta" not in kinds
    assert kinds.index("response.reasoning_summary_part.added") < kinds.index("response.reasoning_summary_text.delta")
    assert [e.part.text for e in events if e.type == "response.reasoning_summary_part.done"] == [thought]
    [done] = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "reasoning"]
    assert [part.text for part in done.summary] == [thought]
    # given back as Codex gives it (the summary, its content null), it is the earlier turn's thinking
    again = client.responses.create(model="r1", input=[*WHY, done.model_dump(), {"role": "user", "content": "and?"}],
                                    max_output_tokens=4)
    assert again.status in ("completed", "incomplete")


WRONG = [("input", 5), ("input", ""), ("input", [5]), ("input", [{"role": "tool", "content": "x"}]),
         ("input", [{"type": "function_call", "call_id": "1", "name": "f", "arguments": "{oops"}]),
         ("input", [{"type": "image_generation_call"}]), ("input", [{"role": "user", "content": [{"type": "input_image"}]}]),
         ("instructions", 5), ("max_output_tokens", 0), ("max_output_tokens", "3"), ("temperature", "1"),
         ("tools", [{"type": "weather_station"}]), ("tools", [{"type": "namespace", "tools": []}]),
         ("tools", [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]), ("tools", {}), ("tool_choice", "sometimes"), ("tool_choice", "required"),
         ("text", {"format": {"type": "yaml"}}), ("text", {"format": {"type": "json_schema"}}),
         ("reasoning", {"effort": "lots"}), ("reasoning", "high"), ("previous_response_id", 5), ("stream", "yes"),
         ("top_logprobs", 3), ("background", True), ("speculative", "off"), ("speculative", {"mode": "sometimes"}),
         ("truncation", "sometimes")]


def test_every_field_of_the_wrong_kind_is_a_400_in_openais_shape(server):
    for field, value in WRONG:
        answer = httpx.post(server.url + "/responses", json={"model": "tiny", "input": "hi", field: value}, timeout=60)
        assert answer.status_code == 400 and answer.json()["error"]["message"], (field, value, answer.text)
    assert "Traceback" not in server.log()


def test_instructions_are_not_carried_to_the_next_response(server, tiny):
    client = server.client()
    for instructions in ("be brief", "answer in French", "be very very brief and kind", "you are a cat"):
        first = client.responses.create(model="tiny", instructions=instructions, input=PROMPT, max_output_tokens=8)
        conversation = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": first.output_text},
                        {"role": "user", "content": "go on"}]
        without = plain_text(tiny, conversation, max_tokens=8)
        if without != plain_text(tiny, [{"role": "system", "content": instructions}, *conversation], max_tokens=8):
            break
    else:
        pytest.fail("no instructions tell the two conversations apart on this model")
    then = client.responses.create(model="tiny", input="go on", previous_response_id=first.id, max_output_tokens=8)
    assert then.output_text == without


def test_a_lark_grammar_is_told_a_regular_expression_held_and_earlier_reasoning_read_from_its_summary():
    """A custom tool's Lark grammar, which no grammar here reads, is told the model in its function's description;
    a regular expression holds its input. Earlier reasoning that another server gave as a summary alone (content
    null, as Codex gives it back) goes back as the assistant's thinking."""
    lark = 'start: "*** Begin Patch" LF'
    tools, offered = _tools(ResponsesRequest.model_validate({"input": "x", "tools": [
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": lark}},
        {"type": "custom", "name": "word", "format": {"type": "grammar", "syntax": "regex", "definition": "[a-z]+"}},
        {"type": "custom", "name": "code", "format": {"type": "grammar", "syntax": "regex", "definition": r"^\d{4}$"}},
        {"type": "web_search_preview"}]}))
    patch, word, code = (definition["function"] for definition in tools.definitions)
    assert lark in patch["description"] and patch["parameters"]["properties"]["input"] == {"type": "string"}
    assert word["parameters"]["properties"]["input"] == {"type": "string", "pattern": "^([a-z]+)$"}
    # (one anchored already is not anchored twice, which no grammar holds)
    assert code["parameters"]["properties"]["input"] == {"type": "string", "pattern": r"^\d{4}$"}
    assert "[0-9]" in from_json_schema(code["parameters"])
    assert set(offered) == {"apply_patch", "word", "code"} and offered["word"].custom
    messages = conversation([Item.model_validate(item) for item in (
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "they greet"}], "content": None,
         "encrypted_content": None},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]})])
    assert messages[-1] == {"role": "assistant", "content": "hello", "reasoning_content": "they greet"}


def test_codexs_developer_messages_reach_templates_that_write_one_system_message(thinkers, tmp_path):
    """Codex opens every request with two developer messages (its instructions, its skills) and may give another as
    it goes on: Qwen 3.5's template refused them ("System message must be at the beginning"), a 400 for every
    request; gpt-oss's left out all but the first, DeepSeek R1's all but the last. The messages at the head are one
    system message now where the template writes one alone (their texts a paragraph each), and a later one is the
    user's where the template writes none there."""
    codex = [{"role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
             {"role": "developer", "content": [{"type": "input_text", "text": "Skills: none."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "<environment_context/>"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Say hi"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
             {"role": "developer", "content": [{"type": "input_text", "text": "Sandbox: none."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Again"}]}]
    messages = conversation([Item.model_validate(item) for item in codex])
    for name in ("qwen3.5", "gpt-oss", "deepseek-r1"):
        with closing(Model(thinkers[name])) as loaded:
            written = loaded.spell_of(Prompts(loaded, 4096).chat_tokens(messages), special=True).decode()
        said = [written.find(text) for text in ("You are Codex.", "Skills: none.", "Say hi", "Sandbox: none.", "Again")]
        assert -1 not in said and said == sorted(said), (name, written)
    running = ServerProcess(tmp_path, thinkers["qwen3.5"], "-c", "1024", "--alias", "tiny")
    try:
        answer = running.client().responses.create(model="tiny", input=codex, max_output_tokens=4, temperature=0)
        assert answer.status in ("completed", "incomplete") and answer.usage.input_tokens > 0
    finally:
        assert running.stop() == 0, running.log()
    assert "Traceback" not in running.log()


def test_truncation_auto_drops_the_oldest_turns_that_leave_the_answer_no_room(server):
    """The Responses API's truncation "auto" (the Agents SDK's ModelSettings pass it): a conversation longer than
    the context was a 400 all the same; its oldest turns are dropped now, as Ollama's truncate drops them."""
    history = [{"role": "system", "content": "be brief"}]
    for turn in range(30):
        history += [{"role": "user", "content": f"question {turn} about the cat and the mat"},
                    {"role": "assistant", "content": f"answer {turn}: the cat sat on the mat"}]
    history.append({"role": "user", "content": PROMPT})
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="context"):
        client.responses.create(model="tiny", input=history, max_output_tokens=12)
    answer = client.responses.create(model="tiny", input=history, max_output_tokens=12, truncation="auto")
    assert answer.status in ("completed", "incomplete") and answer.usage.input_tokens <= 500
    assert "dropped the oldest" in server.log()
